"""eval.py: worked examples for cover EM, answer extraction and the format check; `evaluate` on
questions lost to retrieval errors; the eval.py script on a few questions."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eval import FORMAT_RULES, check_format, cover_exact_match, extract_answer
from infra.squad import exact_match, normalize_answer, token_f1

ROOT = Path(__file__).resolve().parents[1]


# ---- the scoring's edge cases, as docs/evaluation.md states them ---------------------------------


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("The Beatles", "beatles"),  # articles go as whole words only...
        ("Anthea and the Theban", "anthea and theban"),  # ...never inside one
        ("A", ""),  # an article alone normalises to nothing
        ("U.S.A.", "usa"),  # punctuation is deleted, not a space: "U.S.A." is one token
        ("rock-and-roll", "rockandroll"),
        ("Ivo Ra, Jr.", "ivo ra jr"),
        ("«Oda»", "oda"),  # Unicode punctuation too
        (" \tVosa \n  Republic ", "vosa republic"),  # case and whitespace
    ],
)
def test_normalisation_edge_cases(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_a_gold_that_normalises_to_empty_matches_nothing():
    # "The The" (a band) normalises to "", as "a" or "?" does: such a gold cannot tell an answer
    # from no answer, so it is left out of EM, F1 and cover EM alike
    for answer in ("the the", "a", "?", "Oda"):
        assert exact_match(answer, ["The The"]) == 0.0
        assert token_f1(answer, ["The The"]) == 0.0
        assert cover_exact_match(answer, ["The The"]) == 0.0
    # the question's other golds still count; "the" no longer matches through the empty one
    assert exact_match("the", ["The", "Oda"]) == 0.0 and exact_match("Oda!", ["The", "Oda"]) == 1.0
    assert token_f1("the", ["The", "Oda"]) == 0.0 and token_f1("oda", ["The", "Oda"]) == 1.0
    with pytest.raises(ValueError, match="golden_answers is empty"):
        exact_match("x", [])  # no gold at all is a data error


def test_em_and_f1_hand_values_and_cover_em_never_below_em():
    golds = ["Ivo Ra", "Ra"]
    # "ivo ra of oda" vs "ivo ra": 2 common tokens, P = 2/4, R = 2/2, F1 = 2 (1/2)(1) / (3/2) = 2/3;
    # vs "ra": 1 common, P = 1/4, R = 1, F1 = 2 (1/4) / (5/4) = 2/5; the best: 2/3
    assert token_f1("Ivo Ra of Oda", golds) == pytest.approx(2 / 3)
    assert exact_match("Ivo Ra of Oda", golds) == 0.0
    assert cover_exact_match("Ivo Ra of Oda", golds) == 1.0
    assert token_f1("yes, Ivo Ra", ["yes"]) == 0.0  # yes / no: no partial credit (HotpotQA)
    for answer in ("the", "Ivo Ra", "ra", "", "the the", "U.S.A."):
        for gs in (golds, ["The The"], ["the", "usa"]):
            assert cover_exact_match(answer, gs) >= exact_match(answer, gs), (answer, gs)


def test_cover_exact_match_whole_tokens():
    assert cover_exact_match("It is in modern art.", ["Art"]) == 1.0
    assert cover_exact_match("a great party", ["art"]) == 0.0  # not a token: cover-em-tokens
    assert cover_exact_match("born in vosa republic", ["mosa", "vosa"]) == 1.0
    # empty golds never match everything
    assert cover_exact_match("anything", ["", "the"]) == 0.0
    assert cover_exact_match(None, ["x"]) == 0.0


def test_extract_answer_takes_the_last_one():
    response = (
        "<answer>first</answer> <search>q</search><information>d</information><answer>\n "
        "kalo\nmire </answer>"
    )
    assert extract_answer(response) == "kalo\nmire"
    assert extract_answer("<answer></answer>") == ""
    assert extract_answer("no answer here") is None
    assert extract_answer("<answer>unclosed") is None


GOOD = (
    "<think>I need the founder.</think>\n<search>ravoki</search>\n"
    "<information>Doc 1 (Title: ravoki) ravoki was founded by kalo mire.</information>\n"
    "<think>found it</think>\n<answer>kalo mire</answer>\n"
)


@pytest.mark.parametrize(
    "response, rule",
    [
        (GOOD, ""),
        # <think> is optional
        ("<search>q</search><information>d</information><answer>a</answer>", ""),
        ("<think>a<search>q</search></think><answer>x</answer>", "unbalanced_tag"),  # nested
        ("<think>a</think><answer>x", "unbalanced_tag"),  # never closed
        ("</think><answer>x</answer>", "unbalanced_tag"),  # closes nothing
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
    ],
)
def test_check_format_names_the_failed_rule(response, rule):
    check = check_format(response)
    assert check.ok == (rule == "") and check.rule == rule
    assert (check.detail == "") == check.ok
    assert rule == "" or rule in FORMAT_RULES


def test_check_format_detail_says_where():
    assert "char 8" in check_format("<answer><search>a</answer>").detail
    assert "'because'" in check_format("<answer>x</answer> because").detail


def test_evaluate_leaves_out_and_counts_questions_lost_to_retrieval_errors():
    from test_rollout import agent_with, turns

    from eval import evaluate
    from infra.data import QARow

    agent, _ = agent_with(
        lambda c: (
            "<answer>Ivo</answer>"
            if turns(c)
            else "<search>boom</search>"
            if "boom" in c
            else "<search>who</search>"
        )
    )
    rows = [
        QARow(str(i), q, [gold], "w", "test", i)
        for i, (q, gold) in enumerate([("who is it", "Ivo"), ("boom", "Ivo"), ("who else", "Bob")])
    ]
    report = evaluate(agent, rows)
    # question 1's search failed (env_error): not scored as wrong, counted; EM = 1 of the 2
    # answered, not 1 of 3
    assert (report["n"], report["env_errors"], report["em"]) == (2, 1, 0.5)
    assert report["by_source"]["w"]["env_errors"] == 1
    with pytest.raises(
        RuntimeError, match="all 1 evaluation questions were lost to retrieval errors"
    ):
        evaluate(agent, rows[1:2])


def test_eval_script_prints_the_per_dataset_table_and_writes_the_report(env):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "eval.py"),
            "--model",
            str(env / "tiny"),
            "--n",
            "3",
            "--max_turns",
            "2",
            "--out",
            str(env / "eval.json"),
        ],
        cwd=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dataset" in out.stdout and "world" in out.stdout
    report = json.loads((env / "eval.json").read_text())["report"]
    assert (
        report["n"] == 3
        and 0 <= report["em"] <= report["pass@1"] <= 1
        and 1 <= report["turns"] <= 2
    )
    assert set(report["by_source"]) == {"world"}


def eval_script(env, *args):
    return subprocess.run(
        [sys.executable, str(ROOT / "eval.py"), "--model", str(env / "tiny"), *args],
        cwd=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_eval_checks_where_the_report_goes_before_the_work(env, tmp_path):
    # before: the whole evaluation ran, then writing the report failed and it was lost
    missing = tmp_path / "missing" / "r.json"
    out = eval_script(env, "--n", "2", "--out", str(missing))
    assert out.returncode != 0, out.stdout[-2000:]
    assert f"--out '{missing}': the directory {missing.parent} does not exist" in out.stderr
    assert "retriever:" not in out.stdout  # nothing was loaded


def test_eval_names_a_truncated_weights_file(env, tmp_path):
    # before: safetensors' "Error while deserializing header" named no file
    model = tmp_path / "model"
    shutil.copytree(env / "tiny", model)
    weights = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(weights[:100])
    out = eval_script(env, "--model", str(model), "--n", "2", "--out", str(tmp_path / "r.json"))
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"loading the model {model} failed" in out.stderr
    assert "model.safetensors (100 bytes)" in out.stderr


def test_eval_says_when_n_is_more_than_the_split_and_its_table_header_is_readable(env, tmp_path):
    out = eval_script(env, "--n", "100000", "--max_turns", "1", "--out", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr[-2000:]
    n = json.loads((tmp_path / "r.json").read_text())["report"]["n"]
    # before: capped at the split's size in silence
    assert f"--n 100000: the test split has {n} questions; evaluating all of them" in out.stdout
    header = next(line for line in out.stdout.splitlines() if line.startswith("dataset"))
    assert header.split()[:3] == ["dataset", "n", "env_errors"], header  # before: "nenv_errors"
