"""The outcome reward's answer scoring (infra/squad.py): worked examples for SQuAD normalisation, EM
and token F1."""

import unicodedata

import pytest

from infra.squad import exact_match, normalize_answer, token_f1


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("The Eiffel  Tower!", "eiffel tower"),  # article, punctuation, double space
        ("an apple, a day", "apple day"),
        ("Theatre of the Absurd", "theatre of absurd"),  # "the" only as a whole word
        # SQuAD deletes punctuation, it does not split on it
        ("don't", "dont"),
        # Unicode punctuation (rollout.py: squad-reward)
        ("«Paris» — city", "paris city"),
        ("¡Hola, SEÑOR!", "hola señor"),  # Unicode lowercase, accents kept
        ("   ", ""),
    ],
)
def test_normalize_answer_lowercases_and_drops_punctuation_and_articles(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_normalize_composed_and_decomposed_accents_agree():
    decomposed = unicodedata.normalize("NFD", "Café")
    assert (
        decomposed != "Café" and normalize_answer(decomposed) == normalize_answer("Café") == "café"
    )
    assert exact_match(decomposed, ["cafe", "café"]) == 1.0


def test_exact_match_accepts_any_golden_answer():
    golds = ["ravoki", "ravoki company"]
    assert exact_match("Ravoki Company.", golds) == 1.0
    assert exact_match("the ravoki", golds) == 1.0
    assert exact_match("ravoki inc", golds) == 0.0
    assert exact_match("Paris", "paris") == 1.0  # a single string is one golden answer
    assert exact_match(None, golds) == 0.0  # no answer given
    assert exact_match("", golds) == 0.0
    with pytest.raises(ValueError, match="golden_answers is empty"):
        exact_match("x", [])


def test_token_f1_worked_examples():
    # "the cat sat" -> [cat, sat]; "a cat" -> [cat]: 1 common token, P = 1/2, R = 1/1, F1 =
    # 2*(1/2)*1/(1/2+1) = 2/3
    assert token_f1("the cat sat", ["a cat"]) == pytest.approx(2 / 3)
    # best of several golds: vs "cat sat" both tokens common -> 1.0
    assert token_f1("the cat sat", ["a cat", "cat sat"]) == 1.0
    # [kalo, mire, jr] vs [kalo, mire]: 2 common, P = 2/3, R = 1, F1 = 2*(2/3)/(5/3) = 4/5
    assert token_f1("Kalo Mire Jr.", ["kalo mire"]) == pytest.approx(0.8)
    # repeated tokens: [x, x, y] vs [x, y]: common = min(2, 1) + min(1, 1) = 2, P = 2/3, R = 2/2, F1
    # = 0.8
    assert token_f1("x x y", ["x y"]) == pytest.approx(0.8)
    assert token_f1("dog", ["cat"]) == 0.0
    assert token_f1(None, ["cat"]) == 0.0


def test_token_f1_gives_yes_no_no_partial_credit_and_empty_matches_nothing():
    assert token_f1("yes", ["yes"]) == 1.0
    assert token_f1("yes", ["yes indeed"]) == 0.0  # yes/no gets no partial credit (HotpotQA)
    assert token_f1("no way", ["no"]) == 0.0
    assert token_f1("", ["cat"]) == 0.0  # empty prediction
    # both normalise to empty: SQuAD v2 counts a match; a gold normalised away matches nothing here
    assert token_f1("the", ["a"]) == 0.0
