"""benchmarks/compare.py with compare_arms.py and compare_report.py: the statistics by hand, the
arms, the result keys, step 0 measured once by eval.py, seeds of separate sittings merged, and the
--quick smoke run (end to end, resumed, refused under other settings)."""

import json
import math
import statistics
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import compare, compare_arms, compare_report
from benchmarks.compare_report import cells, detectable, holm, paired, reading
from infra import data

ROOT = Path(__file__).resolve().parents[1]


def test_paired_difference_by_hand():
    # d = a - b = [0.1, 0.2, 0.2]: mean 1/6; std = sqrt(((-1/15)^2 + 2 (1/30)^2) / 2) = 0.05774;
    # se = 0.05774 / sqrt(3) = 1/30; t = (1/6) / (1/30) = 5 on 2 degrees of freedom: p = 0.0377
    # (with 2 df, p = 1 - t / sqrt(2 + t^2) = 1 - 5 / sqrt(27) = 0.0377)
    x = paired([0.5, 0.6, 0.7], [0.4, 0.4, 0.5])
    assert x.mean == pytest.approx(1 / 6) and x.se == pytest.approx(1 / 30)
    assert x.p == pytest.approx(1 - 5 / math.sqrt(27))
    assert cells(x)[0] == "+0.167 ± 0.033" and cells(x)[3] == "0.038"
    # one test in its family: Holm leaves p as it is; below 0.05 either way
    assert reading(x, x.p) == "higher" and reading(x, x.p, sign=-1) == "disagrees"
    x = paired([0.7], [0.5])  # one seed: no test, never a verdict
    assert math.isnan(x.p) and reading(x, math.nan) == "no test (one seed or no spread)"
    assert cells(x)[0] == "+0.200 (1 seed)"


def test_detectable_effect_and_holm_on_a_hand_made_table():
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
    # The minimum detectable effect at 80% power, alpha .05, 5 seeds: 3.761 standard errors (the
    # noncentral t's root; the normal-style approximation t_.975 + t_.80 = 2.776 + .941 = 3.717 is
    # 1% under it). A and B: 3.761 x .014142 = .0532; C: 3.761 x .0070711 = .0266.
    assert detectable(5) == pytest.approx(3.761, abs=1e-3)
    assert 2.776 + 0.941 < detectable(5) < 1.02 * (2.776 + 0.941)
    assert x["A"].mde == pytest.approx(0.0532, abs=1e-4) == x["B"].mde
    assert x["C"].mde == pytest.approx(0.0266, abs=1e-4)
    # The hard setting's paired sd at step 15, 0.038 on 5 seeds: 3.761 x .038 / sqrt(5) = .0639
    assert detectable(5) * 0.038 / math.sqrt(5) == pytest.approx(0.0639, abs=1e-4)
    # Holm over the three, smallest p first: C 3 x .00211 = .00633; A 2 x .04743 = .09486;
    # B 1 x .51852 = .51852 (never below the one before it). A nan (no test) is not counted.
    adjusted = holm([x["A"].p, x["B"].p, math.nan, x["C"].p])
    assert adjusted[0] == pytest.approx(0.09486, abs=1e-4) and math.isnan(adjusted[2])
    assert adjusted[1] == pytest.approx(0.51852, abs=1e-4)
    assert adjusted[3] == pytest.approx(0.00633, abs=1e-4)
    assert holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])  # 3x, 2x: .06
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # 2 x .5 = 1; .9 is raised to the 1 before it
    # readings: C survives Holm; A only before it; B cannot be told from 0, or from .0532
    assert reading(x["C"], adjusted[3]) == "higher"
    assert reading(x["A"], adjusted[0]) == "higher before correction only"
    assert reading(x["B"], adjusted[1]) == "inconclusive: would detect ≥ 0.053"
    assert reading(x["A"], adjusted[0], sign=-1) == "disagrees before correction only"


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
            "| Tree-GRPO (1,2,1) | GRPO G=2 | +0.044 ± 0.015 | 0.034 | 0.058 | 0.044 | 0.752 |",
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
        *merged, source = compare_report.merge(paths, "hard")
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


def result_rows() -> list[list[str]]:
    """The rows of docs/comparison.md's result table (The result: seeds 0–4), as cells."""
    text = (ROOT / "docs" / "comparison.md").read_text()
    table = text[text.index("| arm | reference | matched by |") :].split("\n\n")[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def seeds_needed(sd: float, effect: float = 0.02) -> int:
    """The fewest seeds at which a paired t-test detects `effect` at 80% power, given sd."""
    n = 2
    while compare_report.detectable(n) * sd / math.sqrt(n) > effect:
        n += 1
    return n


def test_the_comparison_result_table_is_the_committed_numbers():
    # every cell of every row but the labels, recomputed from docs/comparison_default.json and
    # docs/comparison_hard.json: the tokens ratio in each setting (mean over steps and seeds,
    # against the reference), the paired Δ EM at step 15 ± se (MDE) in each, and on hard its p /
    # Holm p over the 17 step-15 tests and the multi-hop Δ
    def ratio(runs, arm, ref) -> str:
        x = compare_report.budget(runs, arm) / compare_report.budget(runs, ref) - 1
        return "±0%" if round(100 * x) == 0 else f"{x:+.0%}"

    def family(setting: str, measure: str) -> dict:
        return compare_report.family(runs[setting], lambda s: compare_report.measure(s, measure))

    docs = ROOT / "docs"
    runs = {
        s: compare_report.merge([str(docs / f"comparison_{s}.json")], s)[3]
        for s in ("default", "hard")
    }
    em, multihop = {s: family(s, "em") for s in runs}, family("hard", "multihop")
    rows = result_rows()
    assert len(rows) == 9
    for label, ref, _, tokens, default, hard, p_holm, multi in rows:
        arm = label if label[0] != "(" else "Tree-GRPO " + label
        assert tokens == f"{ratio(runs['default'], arm, ref)}, {ratio(runs['hard'], arm, ref)}"
        for setting, cell in (("default", default), ("hard", hard)):
            x = em[setting][arm, ref][0]
            assert cell == f"{x.mean:+.3f} ± {x.se:.3f} ({x.mde:.3f})", (setting, arm)
        x, h = em["hard"][arm, ref]
        assert p_holm == f"{x.p:.3f} / " + ("1" if h > 0.9995 else f"{h:.2f}")
        y = multihop[arm, ref][0]
        assert multi == f"{y.mean:+.3f} ± {y.se:.3f}"
    # the text's "no comparison survives Holm": the smallest adjusted p at step 15 per setting
    assert min(h for _, h in em["default"].values()) > 0.9995
    assert round(min(h for _, h in em["hard"].values()), 2) == 0.75
    # "+0.02 needs ≈ N seeds": the four token-matched methods' median paired sd at step 15, on the
    # hard setting's five seeds (31 at 0.038) and on its eight (seeds 5-7 merged in)
    text = (docs / "comparison.md").read_text()
    eight = compare_report.merge(
        [str(docs / "comparison_hard.json"), str(docs / "comparison_hard_seeds5-7.json")], "hard"
    )[3]
    matched = ["Tree-GRPO (2,1,1)", "BranPO N=2", "CARL (1,6)", "TreePS (3,2)"]
    for setting_runs, seeds, at in ((runs["hard"], 31, "0.038"), (eight, 45, "0.047")):
        step15 = compare_report.family(setting_runs, lambda s: compare_report.measure(s, "em"))
        sds = [step15[arm, "GRPO G=4"][0].sd for arm in matched]
        assert f"{statistics.median(sds):.3f}" == at
        assert seeds_needed(statistics.median(sds)) == seeds
    needed = [seeds_needed(sd) for sd in sds]  # the eight seeds', method by method
    words = " ".join(text.split())
    assert "about 31 seeds for 80% at sd 0.038" in words
    assert "a +0.02 difference needs ≈ 45 seeds" in words
    assert f"0.047 ({min(needed)}–{max(needed)} seeds across them)" in words
    # on hard's five seeds the four are all above zero at step 5; at step 15 TreePS (3,2) is not
    step5 = compare_report.family(runs["hard"], lambda s: s["evals"][5]["eval/em"])
    assert all(step5[arm, "GRPO G=4"][0].mean > 0 for arm in matched)
    at15 = {arm: em["hard"][arm, "GRPO G=4"][0].mean for arm in matched}
    assert [arm for arm, d in at15.items() if d <= 0] == ["TreePS (3,2)"]
    assert f"{at15['TreePS (3,2)']:.4f}" == "-0.0004" and "TreePS (3,2) is −0.0004" in words
    # BranPO's Table 8 Holm p (0.006, 0.069, 0.13) is over each setting's claims table: 11 claims
    assert len(compare_arms.CLAIMS) == 11 and "Holm over each setting's 11 claims" in words


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
    assert sorted(arms) == sorted(set(names)) and names.count("GRPO G=4") == 2  # run once
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
    assert shared == hard["agent"] + " --eval_every 5" and len(arms) == 15
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
        compare.code_hashes("train.py")
    )
    assert "train.py" not in compare.code_hashes("eval.py")  # train.py edits keep eval.py's results
    stored = {"command": ["train.py"], "code": {"train.py": "a", "tree.py": "b"}, "threads": 2}
    now = {"command": ["train.py"], "code": {"train.py": "a", "tree.py": "c"}, "threads": 1}
    assert compare.differences(stored, now) == "code (tree.py); threads (2 -> 1)"


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
    # refused, with every reason: a seed twice, other shared flags, the wrong --setting
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**original, "seeds": [1], "train_flags": "--lr 1"}))
    with pytest.raises(SystemExit) as refused:
        compare_report.merge([str(stored), str(other)], "default")
    for reason in (
        "a seed is in two files (seeds [",
        "train_flags '--lr 1', not",
        "the files hold setting 'hard': pass --setting",
        "nothing was written",
    ):
        assert reason in str(refused.value)


def test_merge_adds_seeds_of_the_matched_arms_evaluated_at_0_and_15_only(tmp_path):
    # `--arms matched --train_flags=""`: the matched set's 6 arms, train.py's --eval_every 15, so
    # evaluated at steps 0 and 15; merged with the committed 5-seed file, which has every arm at
    # steps 0, 5, 10, 15: the 6 arms on 7 seeds at steps 0 and 15, the other 9 arms left out
    a, chosen, _ = compare.configure(compare.Args(setting="hard", arms=["matched"], train_flags=""))
    matched = ["GRPO G=4", "Tree-GRPO (2,1,1)", "Tree-GRPO (2,2,1)", "BranPO N=2", "CARL (1,6)"]
    assert list(chosen) == [*matched, "TreePS (3,2)"] and "--eval_every" not in a.train_flags
    with pytest.raises(SystemExit, match=r"the sets \['matched'\]"):
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
