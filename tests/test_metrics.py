"""eval.py metrics: worked examples for normalisation, EM, F1, cover EM, answer extraction and the format check."""
import unicodedata

import pytest

from eval import FORMAT_RULES, check_format, cover_exact_match, extract_answer
from rollout import exact_match, normalize_answer, token_f1


@pytest.mark.parametrize("raw, normalized", [
    ("The Eiffel  Tower!", "eiffel tower"),           # article, punctuation, double space
    ("an apple, a day", "apple day"),
    ("Theatre of the Absurd", "theatre of absurd"),   # "the" only as a whole word
    ("don't", "dont"),                                # SQuAD deletes punctuation, it does not split on it
    ("«Paris» — city", "paris city"),                 # Unicode punctuation (rollout.py deviation 9)
    ("¡Hola, SEÑOR!", "hola señor"),                  # Unicode lowercase, accents kept
    ("   ", ""),
])
def test_normalize_answer(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_normalize_composed_and_decomposed_accents_agree():
    decomposed = unicodedata.normalize("NFD", "Café")
    assert decomposed != "Café" and normalize_answer(decomposed) == normalize_answer("Café") == "café"
    assert exact_match(decomposed, ["cafe", "café"]) == 1.0


def test_exact_match_any_golden_answer():
    golds = ["ravoki", "ravoki company"]
    assert exact_match("Ravoki Company.", golds) == 1.0
    assert exact_match("the ravoki", golds) == 1.0
    assert exact_match("ravoki inc", golds) == 0.0
    assert exact_match("Paris", "paris") == 1.0           # a single string is one golden answer
    assert exact_match(None, golds) == 0.0                # no answer given
    assert exact_match("", golds) == 0.0
    with pytest.raises(ValueError, match="golden_answers is empty"):
        exact_match("x", [])


def test_token_f1_worked_examples():
    # "the cat sat" -> [cat, sat]; "a cat" -> [cat]: 1 common token, P = 1/2, R = 1/1, F1 = 2*(1/2)*1/(1/2+1) = 2/3
    assert token_f1("the cat sat", ["a cat"]) == pytest.approx(2 / 3)
    # best of several golds: vs "cat sat" both tokens common -> 1.0
    assert token_f1("the cat sat", ["a cat", "cat sat"]) == 1.0
    # [kalo, mire, jr] vs [kalo, mire]: 2 common, P = 2/3, R = 1, F1 = 2*(2/3)/(5/3) = 4/5
    assert token_f1("Kalo Mire Jr.", ["kalo mire"]) == pytest.approx(0.8)
    # repeated tokens: [x, x, y] vs [x, y]: common = min(2, 1) + min(1, 1) = 2, P = 2/3, R = 2/2, F1 = 0.8
    assert token_f1("x x y", ["x y"]) == pytest.approx(0.8)
    assert token_f1("dog", ["cat"]) == 0.0
    assert token_f1(None, ["cat"]) == 0.0


def test_token_f1_yes_no_and_empty():
    assert token_f1("yes", ["yes"]) == 1.0
    assert token_f1("yes", ["yes indeed"]) == 0.0         # yes/no gets no partial credit (HotpotQA)
    assert token_f1("no way", ["no"]) == 0.0
    assert token_f1("", ["cat"]) == 0.0                   # empty prediction
    assert token_f1("the", ["a"]) == 1.0                  # both normalise to empty: SQuAD v2 counts a match


def test_cover_exact_match_whole_tokens():
    assert cover_exact_match("It is in modern art.", ["Art"]) == 1.0
    assert cover_exact_match("a great party", ["art"]) == 0.0         # substring but not a token (eval.py deviation 1)
    assert cover_exact_match("born in vosa republic", ["mosa", "vosa"]) == 1.0
    assert cover_exact_match("anything", ["", "the"]) == 0.0         # empty golds never match everything
    assert cover_exact_match(None, ["x"]) == 0.0


def test_extract_answer_takes_the_last_one():
    response = "<answer>first</answer> <search>q</search><information>d</information><answer>\n kalo\nmire </answer>"
    assert extract_answer(response) == "kalo\nmire"
    assert extract_answer("<answer></answer>") == ""
    assert extract_answer("no answer here") is None
    assert extract_answer("<answer>unclosed") is None


GOOD = ("<think>I need the founder.</think>\n<search>ravoki</search>\n"
        "<information>Doc 1 (Title: ravoki) ravoki was founded by kalo mire.</information>\n"
        "<think>found it</think>\n<answer>kalo mire</answer>\n")


@pytest.mark.parametrize("response, rule", [
    (GOOD, ""),
    ("<search>q</search><information>d</information><answer>a</answer>", ""),   # <think> is optional
    ("<think>a<search>q</search></think><answer>x</answer>", "unbalanced_tag"),    # nested
    ("<think>a</think><answer>x", "unbalanced_tag"),                                # never closed
    ("</think><answer>x</answer>", "unbalanced_tag"),                               # closes nothing
    ("So the answer is <answer>x</answer>", "text_outside_tags"),
    ("<answer>x</answer> because", "text_outside_tags"),
    ("<search>q</search><answer>x</answer>", "search_without_information"),
    ("<information>d</information><answer>x</answer>", "information_without_search"),
    ("<search> </search><information>d</information><answer>x</answer>", "empty_block"),
    ("<answer> </answer>", "empty_block"),
    ("<think>hmm</think>", "no_answer"),
    ("", "no_answer"),
    ("<answer>x</answer><answer>y</answer>", "answer_not_last"),
    ("<answer>x</answer><think>more</think>", "answer_not_last"),
])
def test_check_format_names_the_failed_rule(response, rule):
    check = check_format(response)
    assert check.ok == (rule == "") and check.rule == rule
    assert (check.detail == "") == check.ok
    assert rule == "" or rule in FORMAT_RULES


def test_check_format_detail_says_where():
    assert "char 8" in check_format("<answer><search>a</answer>").detail
    assert "'because'" in check_format("<answer>x</answer> because").detail


def test_evaluate_leaves_out_and_counts_questions_lost_to_retrieval_errors():
    from infra.data import QARow
    from eval import evaluate
    from test_rollout import agent_with, turns
    agent, _ = agent_with(lambda c: "<answer>Ivo</answer>" if turns(c) else
                          "<search>boom</search>" if "boom" in c else "<search>who</search>")
    rows = [QARow(str(i), q, [gold], "w", "test", i) for i, (q, gold) in
            enumerate([("who is it", "Ivo"), ("boom", "Ivo"), ("who else", "Bob")])]
    report = evaluate(agent, rows)
    # question 1's search failed (env_error): not scored as wrong, counted; EM = 1 of the 2 answered, not 1 of 3
    assert (report["n"], report["env_errors"], report["em"]) == (2, 1, 0.5)
    assert report["by_source"]["w"]["env_errors"] == 1
    with pytest.raises(RuntimeError, match="all 1 evaluation questions were lost to retrieval errors"):
        evaluate(agent, rows[1:2])
