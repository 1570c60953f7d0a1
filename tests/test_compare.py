"""benchmarks/compare.py with compare_arms.py, compare_tasks.py, compare_report.py and
compare_stats.py: the statistics by hand, the arms, the result keys, step 0 measured once by
eval.py, seeds of separate sittings merged, the --quick smoke run (end to end, resumed, refused
under other settings), and a sitting's processes (one per --out, its signals, its arms' runs)."""

import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks import compare, compare_arms, compare_report, compare_tasks
from benchmarks.compare_report import cells, reading
from benchmarks.compare_stats import (
    detectable,
    dunnett_critical,
    dunnett_p,
    family,
    holm,
    paired,
    residual_sd,
)
from infra import data

ROOT = Path(__file__).resolve().parents[1]


def test_paired_difference_by_hand():
    # d = a - b = [0.1, 0.2, 0.2]: mean 1/6; std = sqrt(((-1/15)^2 + 2 (1/30)^2) / 2) = 0.05774;
    # se = 0.05774 / sqrt(3) = 1/30; t = (1/6) / (1/30) = 5 on 2 degrees of freedom: p = 0.0377
    # (with 2 df, p = 1 - t / sqrt(2 + t^2) = 1 - 5 / sqrt(27) = 0.0377)
    x = paired([0.5, 0.6, 0.7], [0.4, 0.4, 0.5])
    assert x.mean == pytest.approx(1 / 6) and x.se == pytest.approx(1 / 30)
    assert x.p == pytest.approx(1 - 5 / math.sqrt(27))
    # the 95% interval: with 2 df the t quantile is (2q - 1) / sqrt(2 q (1 - q)), at q = .975
    # .95 / sqrt(.04875) = 4.3027; 1/6 -+ 4.3027 / 30 = 1/6 -+ .14342 = [.02324, .31009]
    assert x.ci() == pytest.approx((1 / 6 - 4.3027 / 30, 1 / 6 + 4.3027 / 30), abs=1e-5)
    assert cells(x) == ["+0.167 ± 0.033", "[+0.023, +0.310]", "0.038"]
    # TOST at -+0.05: t = (1/6 + .05) / (1/30) = 6.5 and (1/6 - .05) / (1/30) = 3.5; the larger
    # one-sided p is the second's, P(T <= 3.5) = 1/2 + t / (2 sqrt(2 + t^2)) = .5 + 3.5 / 7.5498
    # = .96359 (2 df): not within -+0.05
    assert x.tost() == pytest.approx(0.5 + 3.5 / (2 * math.sqrt(14.25)))
    # one test in its family: adjusted p = p; below 0.05 either way
    assert reading(x, x.p) == "higher" and reading(x, x.p, sign=-1) == "disagrees"
    x = paired([0.7], [0.5])  # one seed: no test, never a verdict
    assert math.isnan(x.p) and reading(x, math.nan) == "no test (one seed or no spread)"
    assert cells(x)[0] == "+0.200 (1 seed)" and math.isnan(x.tost())


def test_detectable_effect_holm_and_equivalence_on_a_hand_made_table():
    # Three comparisons on 5 seeds, d = arm - reference per seed. With 4 degrees of freedom the
    # t-test's two-sided p has a closed form: x = t / sqrt(4 + t^2), p = 1 - 1.5 x + 0.5 x^3.
    # A: d = [0, .02, .04, .06, .08]: mean .04; deviations -.04 -.02 0 .02 .04, squares .004,
    #    var .004 / 4 = .001, sd .031623, se = sd / sqrt(5) = .014142; t = 2.8284 (2 sqrt 2),
    #    x = sqrt(8 / 12) = .81650, p = 1 - 1.22474 + .27217 = .04743
    # B: d = [.01, -.01, .03, -.03, .05]: mean .01; deviations 0 -.02 .02 -.04 .04, squares .004:
    #    sd .031623, se .014142; t = .70711, x = 1/3, p = 1 - .5 + .5 / 27 = .51852
    # C: d = [.05, .03, .04, .06, .07]: mean .05; deviations 0 -.02 -.01 .01 .02, squares .001,
    #    var .00025, sd .015811, se .0070711; t = 7.0711 (5 sqrt 2), x = sqrt(50 / 54) = .96225,
    #    p = 1 - 1.44338 + .44549 = .00211
    table = {
        "A": [0.0, 0.02, 0.04, 0.06, 0.08],
        "B": [0.01, -0.01, 0.03, -0.03, 0.05],
        "C": [0.05, 0.03, 0.04, 0.06, 0.07],
    }
    zero = [0.0] * 5
    x = {k: paired(d, zero) for k, d in table.items()}
    for k, sd, p in (("A", 0.031623, 0.04743), ("B", 0.031623, 0.51852), ("C", 0.015811, 0.00211)):
        assert x[k].sd == pytest.approx(sd, abs=1e-6) and x[k].p == pytest.approx(p, abs=1e-5)
    # The detectable effect at 80% power, alpha .05, 5 seeds (4 df, critical t 2.776): 3.761
    # standard errors (the noncentral t's root; the normal-style approximation t_.975 + t_.80 =
    # 2.776 + .941 = 3.717 is 1% under it). A and B: 3.761 x .014142 = .0532; C: .0266.
    five = detectable(4, stats.t.ppf(0.975, 4))
    assert five == pytest.approx(3.761, abs=1e-3) and 2.776 + 0.941 < five < 1.02 * 3.717
    assert five * x["A"].se == pytest.approx(0.0532, abs=1e-4)
    # at the alpha of the smallest of 17 Holm-adjusted tests, .05 / 17 (critical t 6.08 on 4
    # df): 8.1 standard errors
    assert detectable(4, stats.t.ppf(1 - 0.05 / 34, 4)) == pytest.approx(8.1, abs=0.05)
    # Holm over the three, smallest p first: C 3 x .00211 = .00633; A 2 x .04743 = .09486;
    # B 1 x .51852 = .51852 (never below the one before it). A nan (no test) is not counted.
    adjusted = holm([x["A"].p, x["B"].p, math.nan, x["C"].p])
    assert adjusted[0] == pytest.approx(0.09486, abs=1e-4) and math.isnan(adjusted[2])
    assert adjusted[1] == pytest.approx(0.51852, abs=1e-4)
    assert adjusted[3] == pytest.approx(0.00633, abs=1e-4)
    assert holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])  # 3x, 2x: .06
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # 2 x .5 = 1; .9 is raised to the 1 before it
    # TOST at -+.05 on 4 df, each one-sided p half a two-sided p above: A, mean .04: t = (.04 -
    # .05) / .014142 = -.70711, P(T <= -.70711) = .51852 / 2 = .25926: not within. B, mean .01:
    # t = (.01 - .05) / .014142 = -2.8284, P = .04743 / 2 = .02371 (the other side, t = 4.2426,
    # is smaller): within -+.05; its 90% interval .01 -+ 2.1318 x .014142 = [-.0201, .0401]
    assert x["A"].tost() == pytest.approx(0.25926, abs=1e-5)
    assert x["B"].tost() == pytest.approx(0.02371, abs=1e-5)
    assert x["B"].ci(0.9) == pytest.approx((0.01 - 0.030148, 0.01 + 0.030148), abs=1e-5)
    # the 95% interval of A: .04 -+ 2.7764 x .014142 = [.00074, .07926]
    assert x["A"].ci() == pytest.approx((0.00074, 0.07926), abs=1e-5)
    # readings: C survives Holm; A only before it; B cannot be told from 0 but is within .05
    assert reading(x["C"], adjusted[3]) == "higher"
    assert reading(x["A"], adjusted[0]) == "higher before correction only"
    assert reading(x["B"], adjusted[1]) == "within ±0.05"
    assert reading(x["B"], adjusted[1], tost=False) == "inconclusive"
    assert reading(x["A"], adjusted[0], sign=-1) == "disagrees before correction only"


def test_the_seed_by_arm_residual_by_hand():
    # two arms on three seeds: A [.5, .6, .7], B [.4, .4, .5]. Arm means .6, .43333; seed means
    # .45, .5, .6; grand mean .51667. Residual y - arm - seed + grand, A: .5 - .6 - .45 + .51667
    # = -.03333, .6 - .6 - .5 + .51667 = .01667, .7 - .6 - .6 + .51667 = .01667; B the
    # negatives. Sum of squares 2 (.0011111 + 2 x .00027778) = .0033333 on (2 - 1)(3 - 1) = 2 df:
    # sd sqrt(.0016667) = .040825, and x sqrt 2 = .057735, the sd of the paired differences
    # [.1, .2, .2] (test_paired_difference_by_hand): with two arms the two are one
    sd, df = residual_sd([[0.5, 0.6, 0.7], [0.4, 0.4, 0.5]])
    assert df == 2 and sd == pytest.approx(0.040825, abs=1e-6)
    assert sd * math.sqrt(2) == pytest.approx(paired([0.5, 0.6, 0.7], [0.4, 0.4, 0.5]).sd)
    # a third arm C = A + .1: seed means .5, .56667, .66667, grand mean .57778; residuals of A
    # and of C: .5 - .6 - .5 + .57778 = -.02222, .01111, .01111; of B: .4 - .43333 - .5 + .57778
    # = .04444, -.02222, -.02222. Sum of squares 2 x .00074074 + .0029630 = .0044444 on
    # (3 - 1)(3 - 1) = 4 df: sd sqrt(.0011111) = .033333
    sd, df = residual_sd([[0.5, 0.6, 0.7], [0.4, 0.4, 0.5], [0.6, 0.7, 0.8]])
    assert df == 4 and sd == pytest.approx(0.033333, abs=1e-6)
    assert residual_sd([[0.5], [0.4]]) == (pytest.approx(math.nan, nan_ok=True), 0)


def test_dunnett_against_students_t_and_a_second_method():
    # one arm against the control: Dunnett is Student's t. 4 df: t_.975 = 2.7764; and the
    # adjusted p of t = 2 sqrt 2 is the plain two-sided p, .04743 (the hand-made table's A)
    assert dunnett_critical(1, 4) == pytest.approx(stats.t.ppf(0.975, 4), abs=1e-6)
    assert dunnett_p(2 * math.sqrt(2), 1, 4) == pytest.approx(0.04743, abs=1e-5)
    # five arms against one: 2.735 on 20 df (6 arms on 5 seeds), 2.635 on 35 (8 seeds); the same
    # from scipy's multivariate t (quasi-Monte Carlo), whose T_i correlate 1/2 (a shared control)
    for df, c in ((20, 2.735), (35, 2.635)):
        assert dunnett_critical(5, df) == pytest.approx(c, abs=5e-4)
        shape = np.full((5, 5), 0.5) + 0.5 * np.eye(5)
        mvt = stats.multivariate_t(np.zeros(5), shape, df=df, seed=0)
        cover = mvt.cdf(np.full(5, c), lower_limit=np.full(5, -c))
        assert cover == pytest.approx(0.95, abs=1e-3)
    # p at the critical value is ALPHA; a larger |t| a smaller p
    assert dunnett_p(dunnett_critical(5, 20), 5, 20) == pytest.approx(0.05, abs=1e-9)
    assert dunnett_p(-3.5, 5, 20) < 0.05 < dunnett_p(2.0, 5, 20) < 1


def test_a_family_of_two_arms_is_the_paired_test():
    # with one pair the pooled sd is the pair's own (test_the_seed_by_arm_residual_by_hand) and
    # Dunnett over one is the plain t-test: the adjusted p is the paired p, 1 - 5 / sqrt(27)
    values = {"A": [0.5, 0.6, 0.7], "B": [0.4, 0.4, 0.5]}
    for dunnett in (True, False):
        f = family(values, [("A", "B")], dunnett)
        x, adjusted = f.tests["A", "B"]
        assert adjusted == pytest.approx(x.p) == pytest.approx(1 - 5 / math.sqrt(27))
        assert f.sd == pytest.approx(x.sd) and f.df == f.test_df == 2
        # its detectable effect at alpha .05 on 2 df, at the pooled se 1/30
        assert f.mde == pytest.approx(detectable(2, stats.t.ppf(0.975, 2)) / 30)
    # a Holm family of two: the smallest p is tested at .05 / 2
    values["C"] = [0.4, 0.5, 0.5]
    f = family(values, [("A", "B"), ("A", "C")], dunnett=False)
    assert f.crit == pytest.approx(stats.t.ppf(1 - 0.05 / 4, 2))
    assert [h for _, h in f.tests.values()] == holm([x.p for x, _ in f.tests.values()])


@pytest.mark.parametrize(
    "doc, inputs, seeds, arms, steps, line",
    [
        ("comparison_results", ["comparison_default"], 5, 15, "0, 5, 10, 15", "commit 0e8f85f"),
        # docs/comparison.md's hard-setting figures come from these tables: Holm p over the 17
        # step-15 tests
        (
            "comparison_hard",
            ["comparison_hard"],
            5,
            15,
            "0, 5, 10, 15",
            "| sweep | Tree-GRPO (1,2,1) | GRPO G=2 | +0.044 ± 0.015 | [+0.002, +0.087] | 0.044 | "
            "0.133 |",
        ),
        # seeds 5-7 of the matched arms (steps 0 and 15) merged with the five: 6 arms, 2 steps
        (
            "comparison_hard_matched",
            ["comparison_hard", "comparison_hard_seeds5-7"],
            8,
            6,
            "0, 15",
            "seeds 5, 6, 7 from docs/comparison_hard_seeds5-7.json (commit 13b7278",
        ),
        # the later methods' 6 arms (steps 0 and 15; two sittings) joined to the default's 15 over
        # seeds 0-4
        (
            "comparison_later",
            ["comparison_default", "comparison_later_default", "comparison_turn_default"],
            5,
            21,
            "0, 15",
            "| later | IGPO G=4 | GRPO G=4 | -0.000 ± 0.008 | [-0.023, +0.022] | 0.963 | 1.000 |",
        ),
        # the ceiling: VinePPO's two arms and GRPO G=4, seeds 0-4 (three sittings, two machines)
        (
            "comparison_ceiling",
            [
                "comparison_ceiling_seed0",
                "comparison_ceiling_seed1",
                "comparison_ceiling_seeds2-4",
            ],
            5,
            3,
            "0, 5, 10, 15",
            "| ceiling | VinePPO G=4 K=4 | GRPO G=4 | +0.006 ± 0.011 | [-0.025, +0.038] | 0.612 | "
            "0.940 |",
        ),
        # and to hard's six matched arms over seeds 0-7
        (
            "comparison_later_hard",
            [
                "comparison_hard",
                "comparison_hard_seeds5-7",
                "comparison_later_hard_seeds0-4",
                "comparison_later_hard_seeds5-7",
            ],
            8,
            9,
            "0, 15",
            "seeds 5, 6, 7 from docs/comparison_later_hard_seeds5-7.json (commit f59dafb",
        ),
    ],
)
def test_report_regenerates_each_settings_tables_byte_for_byte(
    tmp_path, monkeypatch, doc, inputs, seeds, arms, steps, line
):
    # docs/DOC.md is a preface, a line "---", then results.md as written from the committed
    # results.json alone: --report of one file, or the --merge of several (paths as typed in the
    # repository root, as its provenance line names them)
    monkeypatch.chdir(ROOT)
    paths = [f"docs/{name}.json" for name in inputs]
    if len(paths) == 1:
        text = compare_report.report_file(paths[0], str(tmp_path))
    else:
        *merged, source = compare_report.merge(paths, None)
        text = compare_report.write_report(str(tmp_path), *merged, f"merged by --merge: {source}.")
    written = (tmp_path / "results.md").read_text()
    assert text.startswith(written.rstrip("\n"))
    preface, tables = (ROOT / "docs" / f"{doc}.md").read_text().split("\n---\n\n", 1)
    assert tables == written
    assert f"mean ± std over {seeds} seed(s)" in written and line in written
    header = " | ".join(f"step {t}" for t in steps.split(", "))
    assert f"| arm | {header} |" in written
    runs = compare_report.merge(paths, None)[3]
    assert len(runs) == arms and {len(s) for s in runs.values()} == {seeds}


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table in `text` whose header line starts with `header`, as cells."""
    table = text[text.index(header) :].split("\n\n")[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


@functools.cache
def committed() -> tuple[dict, dict]:
    """The committed runs, the default's five seeds, the hard setting's five and its eight (seeds
    5-7 of the matched arms merged in), as compare_report.merge reads them; and their families of
    tests of EM at step 15 (setting -> family name -> compare_stats.Family)."""
    docs = ROOT / "docs"
    hard = [str(docs / "comparison_hard.json")]
    runs = {
        "default": compare_report.merge([str(docs / "comparison_default.json")], None)[3],
        "hard": compare_report.merge(hard, None)[3],
        "hard8": compare_report.merge(hard + [str(docs / "comparison_hard_seeds5-7.json")], "hard")[
            3
        ],
    }
    em = lambda s: compare_report.measure(s, "em")
    fam = {k: {n: f for n, _, f in compare_report.families(r, em)} for k, r in runs.items()}
    return runs, fam


MATCHED = ["Tree-GRPO (2,1,1)", "Tree-GRPO (2,2,1)", "BranPO N=2", "CARL (1,6)", "TreePS (3,2)"]
COMPARISON = (ROOT / "docs" / "comparison.md").read_text()
WORDS = " ".join(COMPARISON.split())  # the prose, its line breaks as spaces


def family_cells(tests: list) -> list[str]:
    """One arm's cells in a family table of docs/comparison.md, from its (Paired, adjusted p) in
    each setting: the 95% intervals, then TOST at +-0.05 and the Dunnett p, setting by setting."""
    return [
        *(f"{x.mean:+.3f} [{x.ci()[0]:+.3f}, {x.ci()[1]:+.3f}]" for x, _ in tests),
        ", ".join("yes" if x.tost() < 0.05 else "no" for x, _ in tests),
        ", ".join(f"{p:.2f}" for _, p in tests),
    ]


def family_said(families: list, dfs: str) -> str:
    """The line under a family table of docs/comparison.md: its pooled sd, Dunnett's critical t
    and the detectable effects at its α and at p < 0.05 alone, setting by setting."""
    join = lambda xs, fmt=".3f": ", ".join(f"{x:{fmt}}" for x in xs)
    return (
        f"(the seed × arm residual × √2; {dfs} df): {join(f.sd for f in families)}. Dunnett's "
        f"critical t: {join((f.crit for f in families), '.2f')}. At those sd the seeds detect "
        f"{join(f.mde for f in families)} EM with 80% power at Dunnett's α, and "
        f"{join(f.mde_alone for f in families)} at p < 0.05 alone"
    )


def test_the_comparison_result_tables_are_the_committed_numbers():
    # every cell of docs/comparison.md's two result tables but the labels, recomputed from the
    # committed runs: the primary family at step 15 in three columns (default, hard on 5 and 8
    # seeds), with the line under it; the secondary families on five seeds
    runs, fam = committed()
    pick = lambda s: compare_report.measure(s, "multihop")
    multihop = {n: f for n, _, f in compare_report.families(runs["hard"], pick)}

    def ratio(setting, arm, ref) -> str:
        r = runs[setting]
        x = compare_report.budget(r, arm) / compare_report.budget(r, ref) - 1
        return "±0%" if round(100 * x) == 0 else f"{x:+.0%}"

    def interval(x) -> str:
        lo, hi = x.ci()
        return f"{x.mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"

    rows = table_rows(COMPARISON, "| arm | matched by |")
    assert [r[0] for r in rows] == MATCHED
    for arm, _, tokens, *columns, tost, dunnett in rows:
        assert tokens == f"{ratio('default', arm, 'GRPO G=4')}, {ratio('hard', arm, 'GRPO G=4')}"
        tests = [fam[k]["primary"].tests[arm, "GRPO G=4"] for k in ("default", "hard", "hard8")]
        assert [*columns, tost, dunnett] == family_cells(tests), arm
    primary = [fam[k]["primary"] for k in ("default", "hard", "hard8")]
    assert [f.df for f in primary] == [20, 20, 35]
    assert family_said(primary, "20, 20 and 35") in WORDS
    rows = table_rows(COMPARISON, "| arm | reference | family |")
    assert len(rows) == 7
    for label, ref, name, default, hard, p_holm, multi in rows:
        arm = label if label[0] != "(" else "Tree-GRPO " + label
        x, h = fam["hard"][name].tests[arm, ref]
        assert default == interval(fam["default"][name].tests[arm, ref][0]) and hard == interval(x)
        assert p_holm == f"{x.p:.3f} / " + ("1" if h > 0.9995 else f"{h:.2f}"), arm
        y = multihop[name].tests[arm, ref][0]
        assert multi == f"{y.mean:+.3f} ± {y.se:.3f}", arm


LATER = ["GiGPO G=4", "AT2PO (3,1,1)", "ARPO (2,5)"]  # on both settings
TURN = ["IGPO G=4", "MT-GRPO G=4", "MT-GRPO G=4 unbiased"]  # later still: the default only


@functools.cache
def later() -> dict:
    """The later methods' runs joined to the committed ones by compare_report.merge: the default's
    five seeds, the hard setting's five, and its eight (with the matched arms' seeds 5-7)."""
    join = lambda *names: compare_report.merge(
        [str(ROOT / "docs" / f"comparison_{n}.json") for n in names], None
    )[3]
    return {
        "default": join("default", "later_default", "turn_default"),
        "hard": join("hard", "later_hard_seeds0-4"),
        "hard8": join("hard", "hard_seeds5-7", "later_hard_seeds0-4", "later_hard_seeds5-7"),
    }


def test_the_later_methods_table_is_the_committed_numbers():
    # docs/comparison.md's table of the later family, every cell recomputed from the committed runs,
    # and the family's line; the primary family, merged with them, is the one published before
    runs, (_, published) = later(), committed()
    em = lambda s: compare_report.measure(s, "em")
    fam = {k: {n: f for n, _, f in compare_report.families(r, em)} for k, r in runs.items()}

    def ratio(setting, arm) -> str:
        r = runs[setting]
        x = compare_report.budget(r, arm) / compare_report.budget(r, "GRPO G=4") - 1
        return "±0%" if round(100 * x) == 0 else f"{x:+.0%}"

    rows = table_rows(COMPARISON, "| arm | tokens: default, hard |")
    assert [r[0] for r in rows] == LATER + TURN
    for arm, tokens, *columns, tost, dunnett in rows:
        ran = [
            k for k in ("default", "hard", "hard8") if (arm, "GRPO G=4") in fam[k]["later"].tests
        ]
        assert ran == (["default"] if arm in TURN else ["default", "hard", "hard8"]), arm
        hard = ratio("hard", arm) if "hard" in ran else "not run"
        assert tokens == f"{ratio('default', arm)}, {hard}"
        cells = family_cells([fam[k]["later"].tests[arm, "GRPO G=4"] for k in ran])
        assert [*columns, tost, dunnett] == cells[:1] + ["not run"] * (3 - len(ran)) + cells[1:]
    families = [fam[k]["later"] for k in ("default", "hard", "hard8")]
    assert [f.df for f in families] == [24, 12, 21]
    assert family_said(families, "24, 12 and 21") in WORDS
    for k in runs:  # evaluated at 0 and 15 only: the step-15 tests are the published ones
        merged, before = fam[k]["primary"].tests, published[k]["primary"].tests
        assert {a: (x.mean, x.p, p) for a, (x, p) in merged.items()} == {
            a: (x.mean, x.p, p) for a, (x, p) in before.items()
        }


def test_what_the_comparison_says_of_the_primary_family_is_the_committed_numbers():
    runs, fam = committed()
    tests = {k: fam[k]["primary"].tests for k in fam}
    # the smallest Dunnett p at step 15, BranPO's on hard's five seeds; Holm over the five rows'
    # own p: 5 x .1689 = .844 (5 x the printed .169 would give .85)
    smallest = min(p for t in tests.values() for _, p in t.values())
    assert smallest == tests["hard"]["BranPO N=2", "GRPO G=4"][1] and f"{smallest:.2f}" == "0.29"
    own = holm([x.p for x, _ in tests["hard"].values()])
    assert f"{min(own):.3f}" == "0.844" and "Holm over the five rows' own p gives 0.84" in WORDS
    # TOST: all five on the default; (2,2,1) and TreePS on hard's five seeds; all but CARL on eight
    within = {k: [a for (a, _), (x, _) in t.items() if x.tost() < 0.05] for k, t in tests.items()}
    assert within["default"] == MATCHED and within["hard"] == [MATCHED[1], MATCHED[4]]
    assert within["hard8"] == [a for a in MATCHED if a != "CARL (1,6)"]
    lo, hi = tests["hard8"]["CARL (1,6)", "GRPO G=4"][0].ci(0.9)
    assert f"[{lo:+.3f}, {hi:+.3f}]" == "[-0.064, +0.023]"
    assert "CARL is not (90% interval [−0.064, +0.023])" in WORDS
    high = {a: f"{x.ci()[1]:+.3f}" for (a, _), (x, _) in tests["hard"].items()}
    assert (high["BranPO N=2"], high["Tree-GRPO (2,1,1)"], high["CARL (1,6)"]) == (
        "+0.075",
        "+0.066",
        "+0.066",
    )
    # +0.02 EM at hard's eight-seed pooled sd: 41 seeds at p < .05 alone, 59 at Dunnett's alpha
    # (the primary family on n seeds: 6 arms, 5 (n - 1) df)
    sd = fam["hard8"]["primary"].sd

    def detects(n: int, dunnett: bool) -> bool:
        df = 5 * (n - 1)
        crit = dunnett_critical(5, df) if dunnett else stats.t.ppf(0.975, df)
        return detectable(df, crit) * sd / math.sqrt(n) <= 0.02

    assert detects(41, False) and not detects(40, False)
    assert detects(59, True) and not detects(58, True)
    assert f"+0.02 would need about 41 seeds at p < 0.05 alone at hard's pooled sd ({sd:.3f})" in (
        WORDS
    )
    # a sd on 4 df: the true sd lies within .60-2.87 times it (95%: sqrt(4 / the chi2 quantiles));
    # BranPO's own sd on the default, .008, gave a detectable effect of .014 (3.761 se); pooled .033
    factors = [math.sqrt(4 / stats.chi2.ppf(q, 4)) for q in (0.975, 0.025)]
    assert [f"{f:.2f}" for f in factors] == ["0.60", "2.87"]
    branpo = tests["default"]["BranPO N=2", "GRPO G=4"][0]
    own_mde = detectable(4, stats.t.ppf(0.975, 4)) * branpo.se
    pooled = fam["default"]["primary"].sd
    assert [f"{v:.3f}" for v in (branpo.sd, own_mde, pooled)] == ["0.008", "0.014", "0.033"]
    # on five seeds TreePS (3,2) is the one below zero at step 15; on eight, three are
    at15 = {a: tests["hard"][a, "GRPO G=4"][0].mean for a in MATCHED}
    assert [a for a, v in at15.items() if v <= 0] == ["TreePS (3,2)"]
    assert f"{at15['TreePS (3,2)']:.4f}" == "-0.0004" and "TreePS (3,2) at −0.0004" in WORDS
    five = ", ".join(f"{v:+.3f}" for v in list(at15.values())[:4]) + ", −0.0004"
    eight = ", ".join(f"{tests['hard8'][a, 'GRPO G=4'][0].mean:+.3f}" for a in MATCHED)
    said = f"the estimates were {five} ((2,1,1), (2,2,1), BranPO, CARL, TreePS); on eight, {eight}"
    assert said.replace("-", "−") in WORDS
    assert f"every Dunnett p is {min(p for _, p in tests['hard8'].values()):.2f} or more" in WORDS


def test_what_the_comparison_says_of_the_earlier_tables_and_the_timings_is_the_committed_numbers():
    runs, fam = committed()
    # the earlier tables: 17 pairings (these 12 and the 5 ablations against GRPO G=4) x 4 measures
    # x 2 settings = 136 paired tests, 4 of them with raw p < .05 ((1,2,1) twice on hard, CARL
    # update-all twice on the default), where chance alone gives .05 x 136 = 6.8
    ablations = [a for a in runs["default"] if " only" in a or " no " in a or "-all" in a]
    pairs = [p for f in fam["default"].values() for p in f.tests]
    earlier = list(dict.fromkeys(pairs + [(a, "GRPO G=4") for a in ablations]))
    assert len(ablations) == 5 and len(earlier) == 17
    raw = []
    for setting, top in (("default", 4), ("hard", 6)):
        picks = [
            lambda s: s["evals"][5]["eval/em"],
            lambda s: compare_report.measure(s, "em"),
            lambda s: compare_report.measure(s, "multihop"),
            lambda s, top=top: compare_report.last(s)[f"eval/em_hop{top}"],
        ]
        r = runs[setting]
        for pick in picks:
            raw += [paired([pick(s) for s in r[a]], [pick(s) for s in r[b]]).p for a, b in earlier]
    assert len(raw) == 136 and sum(p < 0.05 for p in raw) == 4
    assert "one of 4 raw p < 0.05 among the 136 paired EM tests" in WORDS
    # (1,2,1) - GRPO G=2, multi-hop, pooled over the settings: the mean of the two means, its se
    # from the settings' own variances (8 df): +.015 +- .013, p .29; the settings differ, p .017
    d = [
        paired(
            [compare_report.measure(s, "multihop") for s in runs[k]["Tree-GRPO (1,2,1)"]],
            [compare_report.measure(s, "multihop") for s in runs[k]["GRPO G=2"]],
        )
        for k in ("default", "hard")
    ]
    mean, se = (d[0].mean + d[1].mean) / 2, math.sqrt(d[0].se ** 2 + d[1].se ** 2) / 2
    p = 2 * stats.t.sf(abs(mean / se), 8)
    between = 2 * stats.t.sf(abs(d[1].mean - d[0].mean) / (2 * se), 8)
    said = f"pooled over both settings {mean:+.3f} ± {se:.3f}, p {p:.2f}, with a setting × arm"
    assert f"{said} interaction of p {between:.3f}" in WORDS and f"{between:.3f}" == "0.017"
    # on hard's five seeds the four token-matched methods are all ahead at step 5 (Dunnett p
    # .31-.53): one event, their paired differences correlate .69 on average (.28 to .93)
    four = ["Tree-GRPO (2,1,1)", "BranPO N=2", "CARL (1,6)", "TreePS (3,2)"]
    step5 = compare_report.families(runs["hard"], lambda s: s["evals"][5]["eval/em"])
    at5 = [dict((n, f) for n, _, f in step5)["primary"].tests[a, "GRPO G=4"] for a in four]
    assert all(x.mean > 0 for x, _ in at5)
    assert f"Dunnett p {min(p for _, p in at5):.2f}–{max(p for _, p in at5):.2f})" in WORDS
    corr = np.corrcoef([x.d for x, _ in at5])[np.triu_indices(4, 1)]
    assert [f"{c:.2f}" for c in (corr.mean(), corr.min(), corr.max())] == ["0.69", "0.28", "0.93"]
    assert "correlate 0.69 on average (0.28 to 0.93)" in WORDS

    # BranPO's rollout per generated token (the cost tables' column) and its extra tokens
    def per_token(setting, arm):
        return 1000 * statistics.mean(
            s["means"]["train/time_rollout"] * max(s["tokens"]) / s["tokens"][max(s["tokens"])]
            for s in runs[setting][arm]
        )

    ms = [f"{per_token(k, a):.2f}" for k in ("default", "hard") for a in ("BranPO N=2", "GRPO G=4")]
    assert "1.49 against 0.97 ms on the default, 1.47 against 0.93 on hard" in WORDS
    assert ms == ["1.49", "0.97", "1.47", "0.93"]
    tokens = {k: compare_report.budget(runs[k], "BranPO N=2") for k in ("default", "hard")}
    extra = [tokens[k] / compare_report.budget(runs[k], "GRPO G=4") - 1 for k in tokens]
    assert [f"{x:.0%}" for x in extra] == ["14%", "32%"] and "14–32% more tokens" in WORDS
    # BranPO's Table 8 Holm p (0.006, 0.069, 0.13) is over each setting's claims table: 11 claims
    assert len(compare_arms.CLAIMS) == 11 and "Holm over each setting's 11 claims" in WORDS


def test_report_reproduces_a_run_of_the_default_setting_as_written(tmp_path):
    # the default's results.json names no setting (as a run of the default writes it): a report
    # from it alone gives the run's results.md to the byte; the hard file stands in for its data
    d = json.loads((ROOT / "docs" / "comparison_hard.json").read_text())
    named, seeds, flags, runs, walls, _ = compare_report.merge(
        [str(ROOT / "docs" / "comparison_hard.json")], "hard"
    )
    how = "commit x. Wall time of the stored tasks as they ran: arms 1.0 min; 0.02 h in all."
    compare_report.write_report(str(tmp_path / "run"), {}, seeds, flags, runs, walls, how)
    stored = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (
        "setting" not in stored
        and stored["how"] == how
        and stored["runs"].keys() == d["runs"].keys()
    )
    compare_report.report_file(str(tmp_path / "run" / "results.json"), str(tmp_path / "again"))
    run_md = (tmp_path / "run" / "results.md").read_text()
    assert (tmp_path / "again" / "results.md").read_text() == run_md and run_md.endswith(how + "\n")


def test_every_arm_runs_once_under_its_own_name():
    arms = compare_arms.arms()
    names = [compare_arms.arm_name(f) for _, members in compare_arms.GROUPS for f, _ in members]
    assert sorted(arms) == sorted(set(names)) and names.count("GRPO G=4") == 4  # run once
    assert compare_arms.arm_name(compare_arms.TREE + " --tree_mode intra").endswith(" intra only")
    assert (
        compare_arms.arm_name("--algo carl --carl_update_all") == "CARL (1,16) update-all"
    )  # defaults
    for algo, flags in compare_arms.MATCHED.items():  # the committed knobs were calibrated
        assert flags in compare_arms.CANDIDATES[algo]
    with pytest.raises(ValueError, match="both named"):  # a knob the name omits: refused
        compare_arms.GROUPS.append(("x", [(compare_arms.G4 + " --tree_M 3", ())]))
        try:
            compare_arms.arms()
        finally:
            compare_arms.GROUPS.pop()


def test_vineppo_ceiling_arms_their_own_family_and_a_budget_met_per_step():
    # the ceiling's arms: VinePPO at the shared prompts per step, and at GRPO G=4's tokens per step
    # with its own (fewer) prompts per step, the one train.py flag an arm may set
    same, fewer = compare_arms.SETS["ceiling"][1:]
    assert compare_arms.arm_name(same) == "VinePPO G=4 K=4" and compare_arms.arm_prompts(same) == 0
    assert (
        compare_arms.arm_prompts(fewer) == compare_arms.VINE_PROMPTS
        and fewer == (compare_arms.MATCHED["vineppo"])
    )
    assert compare_arms.arm_name(fewer).endswith(f", {compare_arms.VINE_PROMPTS} prompts/step")
    assert compare_arms.algo_config(fewer) == compare_arms.algo_config(same)  # knobs: the same
    # a family of its own, tested against GRPO G=4 by Dunnett's test; in no other family
    (ceiling,) = [f for f in compare_arms.FAMILIES if f[0] == "ceiling"]
    assert ceiling[3] and all(
        compare_arms.GROUPS[g][1][i][0] not in (same, fewer)
        for name, _, groups, _ in compare_arms.FAMILIES
        if name != "ceiling"
        for g in groups
        for i in range(len(compare_arms.GROUPS[g][1]))
    )
    # the calibration's ratio is per step: 1500 tokens per prompt is +500% at the shared 8 prompts
    # (1500 * 8 against 250 * 8); with 1 prompt a step 1500 against 2000 = -25%; with 2, +50%
    rows = {
        compare_arms.G4: [{"rollout/tokens_per_prompt": 250.0}],
        same: [{"rollout/tokens_per_prompt": 1500.0}],
        compare_arms.vine(4, 4, 1): [{"rollout/tokens_per_prompt": 1500.0}],
        compare_arms.vine(4, 4, 2): [{"rollout/tokens_per_prompt": 1500.0}],
    }
    for rs in rows.values():
        rs[0] |= {"train/loss": 0.0} | {f"train/time_{x}": 1.0 for x in ("rollout", "logprob")}
        rs[0]["train/time_update"] = 1.0
    table = compare.calibration_table(rows, 1, 8)
    split = lambda line: [c.strip() for c in line.strip("|").split("|")]
    ratios = {c[1]: c[4] for c in map(split, table) if c[0] in ("grpo", "vineppo")}
    assert ratios == {
        "GRPO G=4": "+0%",
        "VinePPO G=4 K=4": "+500%",
        "VinePPO G=4 K=4, 1 prompts/step": "-25%",
        "VinePPO G=4 K=4, 2 prompts/step": "+50%",
    }


def test_settings_apply_to_every_arm_and_warm_start_and_leave_the_default_as_it_was():
    # the default: the flags, out dirs and quick settings of before (no setting's flag added)
    a, _, shared = compare.configure(compare.Args())
    assert shared == "--eval_every 5" and a.warm_flags == "" and a.out.endswith("out/compare")
    a, _, shared = compare.configure(compare.Args(quick=True))
    assert (shared, a.warm_flags) == (compare.QUICK["train_flags"], compare.QUICK["warm_flags"])
    assert a.out.endswith("out/compare-quick")
    # hard: the agent's flags in the arms' and the warm start's, --train_flags / --warm_flags after
    hard = compare_arms.SETTINGS["hard"]
    a, arms, shared = compare.configure(compare.Args(setting="hard", warm_flags="--val_n 10"))
    # the 18 arms of the comparison, the 2 ceiling arms (VinePPO) and the 3 turn-level ones
    assert shared == hard["agent"] + " --eval_every 5" and len(arms) == 23  # every arm of GROUPS
    assert a.warm_flags == hard["agent"] + " " + hard["warm"] + " --val_n 10"
    assert a.out.endswith("out/compare-hard")
    a, _, shared = compare.configure(compare.Args(setting="hard", quick=True))
    assert a.out.endswith("out/compare-hard-quick")
    assert compare.parse_train(shared)[3].max_turns == 2  # QUICK's --max_turns 2 comes last: wins


def test_the_hard_world_has_six_hop_counts_and_twice_the_look_alikes():
    hard = compare.parse(data.WorldConfig, args=compare_arms.SETTINGS["hard"]["world"].split())[0]
    world = data.build_world(hard)  # the full size, as the comparison builds it (seconds)
    # 500 test questions for each of 1..6 hops; a 6-hop chain names 7 entities and 6 relations
    assert Counter(r.hops for r in world.test) == {h: 500 for h in range(1, 7)}
    assert all(len(r.gold_chain) == r.hops + 1 == len(r.gold_relations) + 1 for r in world.test)
    # look-alikes: each real entity but the countries gets one with probability 0.6 (a draw can
    # fail to find a free name: a little under 0.6); 6,800 of them: sd sqrt(0.6 0.4 / 6800) = 0.006
    real = [e for e in world.entities if e.side not in ("distractor", "shared")]
    share = sum(e.side == "distractor" for e in world.entities) / len(real)
    assert len(real) == 4000 + 800 + 1600 + 400 and 0.57 < share < 0.62


def test_a_result_key_names_the_code_it_ran():
    assert {"train.py", "advantages.py", "rollout.py", "tree.py", "eval.py"} <= set(
        compare_tasks.code_hashes("train.py")
    )
    # train.py edits keep eval.py's results
    assert "train.py" not in compare_tasks.code_hashes("eval.py")
    stored = {"command": ["train.py"], "code": {"train.py": "a", "tree.py": "b"}, "threads": 2}
    now = {"command": ["train.py"], "code": {"train.py": "a", "tree.py": "c"}, "threads": 1}
    assert compare_tasks.differences(stored, now) == "code (tree.py); threads (2 -> 1)"


def metrics_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_merge_joins_the_seeds_of_separate_sittings_in_order_and_refuses_what_does_not_fit(
    tmp_path,
):
    # the committed hard run's results.json and a copy of it posing as seeds 100 higher
    stored = ROOT / "docs" / "comparison_hard_seeds0-1.json"
    original = json.loads(stored.read_text())
    later, shifted = tmp_path / "later.json", json.loads(stored.read_text())
    for summaries in shifted["runs"].values():  # told apart: step 15's EM + 1
        for s in summaries:
            s["evals"]["15"]["eval/em"] += 1
    later_seeds = [s + 100 for s in original["seeds"]]
    later.write_text(json.dumps({**shifted, "seeds": later_seeds}))
    named, seeds, flags, runs, walls, source = compare_report.merge(
        [str(later), str(stored)], "hard"
    )
    assert seeds == original["seeds"] + later_seeds and flags == original["train_flags"]
    assert named["world flags"] == "--max_hops 6 --distractor_fraction 0.6"
    for arm, summaries in runs.items():  # seed order, whatever the files' order; steps ints again
        first = original["runs"][arm][0]
        em = [s["evals"]["15"]["eval/em"] for s in original["runs"][arm]]
        assert [s["evals"][15]["eval/em"] for s in summaries] == em + [x + 1 for x in em]
        assert summaries[0]["tokens"] == {int(k): v for k, v in first["tokens"].items()}
        assert walls[arm] == 2 * original["walls"][arm]
    assert f"seeds {', '.join(map(str, later_seeds))} from {later}" in source
    # the report over all the seeds; merged again on its own, the same numbers
    text = compare_report.write_report(
        str(tmp_path / "all"), named, seeds, flags, runs, walls, "x."
    )
    assert f"mean ± std over {len(seeds)} seed(s)" in text
    again = compare_report.merge([str(tmp_path / "all" / "results.json")], "hard")
    assert again[:5] == (named, seeds, flags, runs, walls)
    # refused, with every reason: a seed's arm twice, another warm start (step 0), other shared
    # flags, the wrong --setting
    other, copy = tmp_path / "other.json", json.loads(stored.read_text())
    copy["runs"]["GRPO G=4"][1]["evals"]["0"]["eval/em"] += 0.001
    other.write_text(json.dumps({**copy, "seeds": [0, 1], "train_flags": "--lr 1"}))
    with pytest.raises(SystemExit) as refused:
        compare_report.merge([str(stored), str(other)], "default")
    for reason in (
        "seed 0's GRPO G=4 is in two files",
        f"seed 1's step 0 in {other} is not the one in {stored} (another warm start)",
        "train_flags '--lr 1', not",
        "the files hold setting 'hard': pass --setting",
        "nothing was written",
    ):
        assert reason in str(refused.value)


def test_merge_joins_later_arms_run_over_the_same_seeds(tmp_path):
    # a later method's arms, run over the committed seeds from the same warm starts, join the
    # committed arms: the default's 15 arms split into two files (GRPO G=4 in the first only) merge
    # back to the one file's run, whichever file comes first
    stored = ROOT / "docs" / "comparison_default.json"
    d = json.loads(stored.read_text())
    later = [n for n in d["runs"] if n.startswith(("CARL", "TreePS"))]
    assert len(later) == 4 and "GRPO G=4" not in later
    files = []
    for name, arms in (("committed", [n for n in d["runs"] if n not in later]), ("later", later)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(
            json.dumps(
                {
                    **d,
                    "runs": {n: d["runs"][n] for n in arms},
                    "walls": {n: d["walls"][n] for n in arms},
                }
            )
        )
    whole = compare_report.merge([str(stored)], None)
    for order in (files, files[::-1]):
        named, seeds, flags, runs, walls, source = compare_report.merge(list(map(str, order)), None)
        assert (named, seeds, flags, walls) == whole[:3] + (whole[4],) and runs == whole[3]
        assert "left out" not in source and source.count("seeds 0, 1, 2, 3, 4 from") == 2
    # a later arm on seeds 0-2 only: the report keeps the seeds and arms it can pair
    short = json.loads(files[1].read_text())
    short["seeds"] = [0, 1, 2]
    short["runs"] = {n: ss[:3] for n, ss in short["runs"].items()}
    short["walls"] = {n: w[:3] for n, w in short["walls"].items()}
    files[1].write_text(json.dumps(short))
    runs, source = (r := compare_report.merge(list(map(str, files)), None))[3], r[5]
    assert sorted(runs) == sorted(set(d["runs"]) - set(later)) and r[1] == [0, 1, 2, 3, 4]
    assert source.endswith(
        "left out: CARL (1,6), CARL (1,6) update-all, TreePS (3,2), TreePS (3,2) no process"
    )


def test_a_report_shows_each_arm_once_paired_or_not(tmp_path):
    # a group shows where it holds one of its pairings, or an arm no such group shows: the later
    # arms run alone (to be merged with the committed ones) get their table and figure (before: a
    # report of no pairing drew a figure of 0 rows and stopped); the hard eight seeds' Tree-GRPO
    # (2,1,1), paired in the primary group, no one-row table of Tree-GRPO's advantage
    named, seeds, flags, runs, walls, _ = compare_report.merge(
        [str(ROOT / "docs" / "comparison_default.json")], None
    )
    alone = {n: runs[n] for n in ("CARL (1,6) update-all", "BranPO N=2 no RSM")}
    text = compare_report.write_report(str(tmp_path), named, seeds, flags, alone, walls, "x.")
    assert text.count("**each paper's own ablation at the matched budget**") == 1
    assert "| CARL (1,6) update-all | 0.753" in text and (tmp_path / "curves.png").exists()
    pair = {n: runs[n] for n in ("GRPO G=4", "Tree-GRPO (2,1,1)")}
    shown = [t for t, _ in compare_report.shown(pair)]
    assert shown == [compare_arms.GROUPS[1][0]]  # not the sweep's, nor Tree-GRPO's advantage's


def test_merge_adds_seeds_of_the_matched_arms_evaluated_at_0_and_15_only(tmp_path):
    # `--arms matched --train_flags=""`: the matched set's 6 arms, train.py's --eval_every 15, so
    # evaluated at steps 0 and 15; merged with the committed 5-seed file, which has every arm at
    # steps 0, 5, 10, 15: the 6 arms on 7 seeds at steps 0 and 15, the other 9 arms left out
    a, chosen, _ = compare.configure(compare.Args(setting="hard", arms=["matched"], train_flags=""))
    matched = ["GRPO G=4", "Tree-GRPO (2,1,1)", "Tree-GRPO (2,2,1)", "BranPO N=2", "CARL (1,6)"]
    assert list(chosen) == [*matched, "TreePS (3,2)"] and "--eval_every" not in a.train_flags
    with pytest.raises(SystemExit, match=r"the sets \['matched', 'later', 'ceiling'\]"):
        compare.configure(compare.Args(arms=["matchd"]))
    full = ROOT / "docs" / "comparison_hard.json"
    d = json.loads(full.read_text())
    assert d["train_flags"].endswith(" --eval_every 5") and len(d["runs"]) == 15
    added = {
        **d,
        "seeds": [5, 6],
        "train_flags": d["train_flags"].replace("--eval_every 5", "").strip(),
        "runs": {
            n: [{**s, "evals": {t: s["evals"][t] for t in ("0", "15")}} for s in d["runs"][n][:2]]
            for n in chosen
        },
        "walls": {n: d["walls"][n][:2] for n in chosen},
    }
    path = tmp_path / "seeds5-6.json"
    path.write_text(json.dumps(added))
    named, seeds, flags, runs, walls, source = compare_report.merge([str(full), str(path)], "hard")
    assert seeds == [0, 1, 2, 3, 4, 5, 6] and sorted(runs) == sorted(chosen)
    assert flags == d["train_flags"].replace(" --eval_every 5", "")  # stated per file instead
    assert all(sorted(s["evals"]) == [0, 15] for ss in runs.values() for s in ss)
    assert "left out: BranPO N=2 no RSM, CARL (1,6) update-all, GRPO G=2, GRPO G=8" in source
    assert source.endswith("; the evaluation steps every seed has: 0, 15")
    text = compare_report.render(named, seeds, flags, runs, walls, source)
    assert text.count("**EM @ step 15**") == 1  # step 0 and 15: no separate early table
    assert (
        "over 7 seed(s)" in text and "| Tree-GRPO (2,2,1) | GRPO G=4 | " in text and "/7 |" in text
    )
    # another flag differing is still refused
    path.write_text(json.dumps({**added, "train_flags": added["train_flags"] + " --lr 1"}))
    with pytest.raises(SystemExit, match="--lr 1', not"):
        compare_report.merge([str(full), str(path)], "hard")


def test_step_zero_from_eval_py_is_what_train_py_measures(env):
    # compare.py evaluates each warm start once, with eval.py, and trains every arm --no_eval_start
    small = ["--max_turns", "2", "--max_step_tokens", "12"]
    world = env / "out" / "world"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "eval.py"),
            "--model",
            str(env / "tiny"),
            "--data",
            str(world),
            "--corpus",
            str(world / "corpus.jsonl"),
            "--n",
            "6",
            "--out",
            str(env / "step0.json"),
            *small,
        ],
        cwd=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((env / "step0.json").read_text())["report"]
    for flag, evaluated in (("--eval_start", [0, 1]), ("--no_eval_start", [1])):
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "train.py"),
                "--model",
                str(env / "tiny"),
                "--out_dir",
                str(env / "out"),
                "--run_name",
                f"step0{flag}",
                "--steps",
                "1",
                "--eval_every",
                "1",
                "--eval_n",
                "6",
                "--prompts_per_step",
                "2",
                "--algo",
                "grpo",
                "--grpo_G",
                "2",
                flag,
                *small,
            ],
            cwd=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        rows = metrics_rows(env / "out" / "runs" / f"step0{flag}" / "metrics.jsonl")
        assert [r["step"] for r in rows if "eval/em" in r] == evaluated
        for r in (r for r in rows if "eval/em" in r):  # each evaluation's questions, one a line
            outcomes = metrics_rows(
                env / "out" / "runs" / f"step0{flag}" / f"eval_step{r['step']}.jsonl"
            )
            assert [set(q) for q in outcomes] == [{"id", "prediction", "em"}] * 6
            assert sum(q["em"] for q in outcomes) / 6 == pytest.approx(r["eval/em"])
        (step,) = [r for r in rows if "train/loss" in r]
        assert 0 < step["train/actions_trained"] <= step["train/tokens_trained"]  # >= 1 token each
    (step0,) = [
        r
        for r in metrics_rows(env / "out" / "runs" / "step0--eval_start" / "metrics.jsonl")
        if r["step"] == 0
    ]
    assert step0 == {
        "step": 0,
        **{f"eval/{k}": v for k, v in report.items() if isinstance(v, (int, float))},
    }
    # eval.py's report holds the same questions, answers and EM as train.py's step-0 file
    assert report["questions"] == metrics_rows(
        env / "out" / "runs" / "step0--eval_start" / "eval_step0.jsonl"
    )


def test_quick_runs_end_to_end_then_resumes_then_refuses_other_settings(tmp_path):
    quick = [
        sys.executable,
        str(ROOT / "benchmarks" / "compare.py"),
        "--quick",
        "--out",
        str(tmp_path),
    ]
    out = subprocess.run(quick, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for table in ("Greedy test EM", "Paired differences", "claims beside ours", "Cost per arm"):
        assert table in out.stdout and table in (tmp_path / "results.md").read_text()
    assert (tmp_path / "curves.png").stat().st_size > 0
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert sorted(runs) == ["GRPO G=2", "Tree-GRPO (1,2,1)"]
    for (seed,) in runs.values():
        assert sorted(map(int, seed["evals"])) == [0, 1, 2]  # 0 from eval.py; 1, 2 from train.py
        assert seed["evals"]["0"] == runs["GRPO G=2"][0]["evals"]["0"]  # one warm start, once
        assert seed["means"]["rollout/tokens_per_prompt"] > 0
        assert seed["means"]["train/actions_trained"] > 0
    # two tasks at once: the same numbers (each task on one core, one thread, as before)
    jobs2 = subprocess.run(
        quick + ["--jobs", "2", "--out", str(tmp_path / "jobs2")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert jobs2.returncode == 0, jobs2.stderr[-3000:]
    timing = ("time", "seconds")  # wall-clock metrics, the only ones allowed to differ
    jobs2_runs = json.loads((tmp_path / "jobs2" / "results.json").read_text())["runs"]
    for arm, (seed,) in jobs2_runs.items():
        assert seed["evals"] == runs[arm][0]["evals"] and seed["tokens"] == runs[arm][0]["tokens"]
        assert {k: v for k, v in seed["means"].items() if not any(t in k for t in timing)} == {
            k: v for k, v in runs[arm][0]["means"].items() if not any(t in k for t in timing)
        }
    # again: every result reused, no task run
    again = subprocess.run(quick, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing 1 stored results" in again.stdout and "reusing 3 stored results" in again.stdout
    assert "seed 0" not in again.stderr  # no progress bar: nothing ran
    # other settings: the stored results are not silently reused
    other = subprocess.run(
        quick + ["--threads", "2"], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert other.returncode != 0 and "--redo" in other.stderr
    assert "made with other code or settings (nothing was run)" in other.stderr
    assert "seed 0 warm start: threads (1 -> 2)" in other.stderr


def test_quick_runs_the_hard_setting_in_its_own_world(tmp_path):
    quick = [str(ROOT / "benchmarks" / "compare.py"), "--quick", "--setting", "hard"]
    out = subprocess.run(
        [sys.executable, *quick, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the tables reach 6 hops (8 questions spread over 3,000 sorted by hops: one is 6-hop) and the
    # outputs name the setting
    assert "6-hop @ 2" in out.stdout and "6-hop EM @ step 2" in out.stdout
    assert "setting 'hard'; world flags '--max_hops 6" in (tmp_path / "results.md").read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["setting"] == "hard"
    for (seed,) in results["runs"].values():  # the arms evaluated on the hard world's questions
        assert "eval/em_hop6" in seed["evals"]["2"] and "eval/em_hop6" in seed["evals"]["0"]
    home = tmp_path / "seed0"
    assert (home / "world-max-hops-6-distractor-fraction-0-6" / "test.jsonl").exists()
    assert not (home / "world").exists()  # no arm wrote (or read) the default world
    warm = json.loads((home / "results" / "warmstart.json").read_text())["key"]
    assert "--search_budget" in warm["command"] and warm["world"].startswith("--max_hops 6")


def test_merge_and_report_never_write_over_an_input_or_another_comparison(tmp_path, monkeypatch):
    # before: --merge wrote its results.json over an input's, and --report FILE rewrote the
    # results.md and curves.png of another run, which no longer matched that run's results.json
    stored = ROOT / "docs" / "comparison_hard_seeds0-1.json"
    run, later = tmp_path / "run", tmp_path / "later.json"
    run.mkdir()
    (run / "results.json").write_text(stored.read_text())
    (run / "results.md").write_text("the run's own tables\n")
    d = json.loads(stored.read_text())
    later.write_text(json.dumps({**d, "seeds": [s + 100 for s in d["seeds"]]}))
    merging = compare.Args(setting="hard", merge=[str(run / "results.json"), str(later)])
    with pytest.raises(SystemExit, match=r"--merge: --out \S+/run holds \S+, one of the inputs"):
        compare.main(replace(merging, out=str(run)))
    assert (run / "results.json").read_text() == stored.read_text()
    with pytest.raises(SystemExit, match="--report: .* another comparison's results.json"):
        compare_report.report_file(str(later), str(run))
    assert (run / "results.md").read_text() == "the run's own tables\n"
    compare_report.report_file(str(run / "results.json"), str(run))  # its own: written again
    assert (run / "results.md").read_text().startswith("### Greedy test EM")
    compare.main(replace(merging, out=str(tmp_path / "merged")))
    compare.main(replace(merging, out=str(tmp_path / "merged")))  # over an earlier merge: fine
    # written whole or not at all: a figure that fails leaves the earlier files as they were
    before = {p.name: p.read_bytes() for p in (tmp_path / "merged").iterdir()}
    monkeypatch.setattr(compare_report, "figure", lambda runs, path: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        compare.main(replace(merging, out=str(tmp_path / "merged")))
    assert {p.name: p.read_bytes() for p in (tmp_path / "merged").iterdir()} == before


@pytest.mark.parametrize(
    "content, said",
    [
        (None, "FileNotFoundError"),
        ("{", "JSONDecodeError"),
        ("[1, 2]", "it holds a list, not an object"),
        ('{"seeds": [0]}', "it has no train_flags, runs, walls"),
    ],
)
def test_a_file_that_is_not_a_results_json_is_named(tmp_path, content, said):
    # before: bare tracebacks (FileNotFoundError, JSONDecodeError, TypeError, KeyError) naming no
    # file
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    for call in (
        lambda: compare_report.report_file(str(path), str(tmp_path / "out")),
        lambda: compare_report.merge([str(path), str(path)], None),
    ):
        with pytest.raises(SystemExit, match=f"{path} is not a results.json .*{said}"):
            call()
    assert not (tmp_path / "out").exists()


# ---- a sitting's processes: its --out folder, its signals, the run directories of its arms


def sitting(env, out: Path, steps: int) -> list[str]:
    """compare.py on one arm (GRPO G=2) of seed 0 in `out`, trained for `steps` tiny steps from the
    tests' tiny policy as the warm start (no warm start task: eval.py's step 0, then the arm)."""
    flags = f"--steps {steps} --eval_every {steps} --eval_n 4 --prompts_per_step 2 --max_turns 2"
    return [
        sys.executable,
        str(ROOT / "benchmarks" / "compare.py"),
        *("--seeds", "0", "--arms", "GRPO G=2", "--warmstart", str(env / "tiny")),
        *("--out", str(out), f"--train_flags={flags} --max_step_tokens 12"),
    ]


def start_sitting(env, out: Path, steps: int, logs: Path) -> subprocess.Popen:
    """A sitting in the background (its stdout and stderr in `logs`.out and .err), returned once
    its arm has logged its first step."""
    with open(f"{logs}.out", "w") as stdout, open(f"{logs}.err", "w") as stderr:
        job = subprocess.Popen(sitting(env, out, steps), cwd=ROOT, stdout=stdout, stderr=stderr)
    metrics = out / "seed0" / "runs" / "grpo-g-2" / "metrics.jsonl"
    deadline = time.time() + 600
    while job.poll() is None and time.time() < deadline:
        if metrics.exists() and '"train/loss"' in metrics.read_text():
            return job
        time.sleep(0.05)
    end_tree(job)
    raise AssertionError(Path(f"{logs}.err").read_text()[-3000:])


def end_tree(job: subprocess.Popen):
    """SIGKILL to a sitting and every process under it (a test's clean-up)."""
    import psutil

    if job.poll() is None:
        for p in [*psutil.Process(job.pid).children(recursive=True), psutil.Process(job.pid)]:
            p.kill()
    job.wait()


def test_a_second_sitting_on_one_out_refuses_at_start_and_touches_nothing(env, tmp_path):
    # before: the second sitting opened the arm's log with "w" (the running arm's log lost its
    # start) and deleted its metrics.jsonl, then failed on the arm's run lock
    first = start_sitting(env, tmp_path / "out", 500, tmp_path / "first")
    try:
        home = tmp_path / "out" / "seed0"
        log, metrics = home / "logs" / "grpo-g-2.log", home / "runs" / "grpo-g-2" / "metrics.jsonl"
        before = {p: p.read_bytes() for p in (log, metrics, home / "results" / "step0.json")}
        second = subprocess.run(
            sitting(env, tmp_path / "out", 500),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert second.returncode != 0 and first.poll() is None
        said = f"comparison folder {tmp_path / 'out'} (--out) is in use by process {first.pid}"
        assert said in second.stderr and f"kill {first.pid}" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr and "seed 0" not in second.stderr  # ran nothing
        for path, was in before.items():  # the first sitting's files grow, none was rewritten
            assert path.read_bytes().startswith(was), path
    finally:
        end_tree(first)


def test_sigterm_to_a_sitting_stops_its_arm_with_a_checkpoint_and_the_next_sitting_resumes_it(
    env, tmp_path
):
    # before: compare.py died at once, saying nothing, and its arm trained on under init; now the
    # signal reaches the arm, which finishes its step, saves a checkpoint and stops, the sitting
    # says so, and the same command goes on from that checkpoint
    import psutil

    out = tmp_path / "out"
    first = start_sitting(env, out, 8, tmp_path / "first")
    tasks = psutil.Process(first.pid).children(recursive=True)
    try:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=600)
    finally:
        end_tree(first)
        alive = [p for p in tasks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for p in alive:
            p.kill()
    said = (tmp_path / "first.err").read_text()
    assert first.returncode == 128 + signal.SIGTERM and not alive, said[-3000:]
    run = out / "seed0" / "runs" / "grpo-g-2"
    checkpoint = (run / "latest").read_text()  # the step the arm was in, finished and saved
    step = int(checkpoint.removeprefix("checkpoint-"))
    assert f"stopped by SIGTERM; interrupted:\n  seed 0 GRPO G=2: {run}/{checkpoint} saved" in said
    assert "run the same command again" in said and "--train_flags=" in said
    assert not (out / "seed0" / "results" / "grpo-g-2.json").exists()
    again = subprocess.run(
        sitting(env, out, 8), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing 1 stored results" in again.stdout  # step 0's
    log = (out / "seed0" / "logs" / "grpo-g-2.log").read_text()
    assert "SIGTERM: finishing this step, then saving a checkpoint" in log  # the first part's
    assert f"resumed from {run}/{checkpoint} at step {step}" in log
    rows = json.loads((out / "seed0" / "results" / "grpo-g-2.json").read_text())["rows"]
    assert [r["step"] for r in rows if "train/loss" in r] == list(range(1, 9))  # each step once


def test_sigkill_to_a_sitting_ends_its_arm_and_no_sitting_touches_a_live_run(env, tmp_path):
    # before: the arm of a sitting killed by SIGKILL trained on under init, and a later sitting
    # deleted that arm's metrics.jsonl and rewrote its log, then failed on its run lock
    import psutil
    from test_train import held_lock

    first = start_sitting(env, tmp_path / "out", 500, tmp_path / "first")
    (arm,) = psutil.Process(first.pid).children()
    try:
        first.kill()
        first.wait()
        arm.wait(timeout=60)  # killed with it, by the kernel
    finally:
        if arm.is_running():
            arm.kill()
    # a run still alive (an arm of another sitting, or one's own train.py): this test holds its
    # lock, and a sitting refuses before running anything, deleting or rewriting none of its files
    home = tmp_path / "live" / "seed0"
    run, log = home / "runs" / "grpo-g-2", home / "logs" / "grpo-g-2.log"
    with held_lock(run):
        log.parent.mkdir(parents=True)
        log.write_text("the live arm's log\n")
        (run / "metrics.jsonl").write_text('{"step": 1}\n')
        refused = subprocess.run(
            sitting(env, tmp_path / "live", 500),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert refused.returncode != 0
    said = f"seed 0 GRPO G=2: its run directory {run} is in use by process {os.getpid()} testhost"
    assert said in refused.stderr, refused.stderr[-3000:]
    assert log.read_text() == "the live arm's log\n"
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert not (home / "results" / "step0.json").exists()  # nothing ran
