"""The main job's figures per seed: wall time, greedy test EM of the warm start and after RL, the
gain, per hop. Prints figures; `--check` also turns the run into the product's correctness guard (CI
runs it on seed 0).

    python benchmarks/default.py --seeds 0 1 2 3 4  # the README's table, in out/bench-default/
    python benchmarks/default.py --seeds 0 --check  # exit 1 if the warm start or RL broke (.ci/run)

Each seed runs the README's main command, `python train.py --algo ALGO --seed S`, from nothing
(world, warm start, RL) in its own directory, one seed after another so that the wall times are
honest. The figures are the run's own evaluations (train.py: greedy, on --eval_n test questions
spread over the hops): the first is the warm start's, the last the RL policy's. "warm steps" is copy
+ trajectory steps (warmstart.json): the stages run until their checks pass, so they show how hard
each seed's warm start was.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from infra import flags, run  # noqa: E402  (the project's modules, from the repository root)


@dataclass
class Args:
    """What to run, and what --check demands."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    """Seeds (each: its own world copy, warm start and RL run)."""
    algo: str = "tree_grpo"
    """train.py --algo."""
    out: str = "out/bench-default"
    """Parent of the per-seed output directories (deleted first: every seed starts from nothing)."""
    check: bool = False
    """Exit 1 unless every seed's warm start reaches min_warm_em and RL loses at most max_drop of
    it."""
    min_warm_em: float = 0.5
    """--check: lowest acceptable greedy test EM of the warm start."""
    max_drop: float = 0.03
    """--check: largest acceptable fall of the test EM from the warm start to the end of RL."""


def run_seed(a: Args, seed: int) -> dict:
    """The main command for one seed, from nothing; its wall time and its first and last evaluation
    rows."""
    out = os.path.abspath(os.path.join(a.out, f"seed{seed}"))
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "train.py"),
            "--algo",
            a.algo,
            "--seed",
            str(seed),
            "--out_dir",
            out,
            "--run_name",
            "main",
        ],
        cwd=out,
    )
    if done.returncode:
        raise SystemExit(
            f"seed {seed}: the main command failed (exit {done.returncode}); its output is above"
        )
    wall = time.perf_counter() - t0
    with open(os.path.join(out, "runs", "main", "metrics.jsonl")) as f:
        evals = [r for r in map(json.loads, f) if "eval/em" in r]
    with open(os.path.join(out, "warmstart", "warmstart.json")) as f:
        warm = json.load(f)  # how long each warm-start stage had to run on this seed
    return {
        "seed": seed,
        "wall": wall,
        "before": evals[0],
        "after": evals[-1],
        "steps": f"{warm['copy_steps_done']}+{warm['sft_steps_done']}",
    }


def main(a: Args):
    rows = []
    for seed in a.seeds:
        rows.append(run_seed(a, seed))
        r = rows[-1]
        print(
            f"seed {seed}: {r['wall'] / 60:.1f} min; greedy test EM {r['before']['eval/em']:.3f} "
            f"-> {r['after']['eval/em']:.3f}",
            flush=True,
        )
    hops = sorted(k for k in rows[0]["before"] if k.startswith("eval/em_hop"))
    print(
        f"\n{'seed':>4} {'minutes':>8} {'warm steps':>10} {'EM warm':>8} {'EM RL':>7} {'gain':>7}  "
        + "  ".join(f"{h[len('eval/em_hop') :]}-hop warm -> RL" for h in hops)
    )
    for r in rows:
        b, f = r["before"], r["after"]
        print(
            f"{r['seed']:>4} {r['wall'] / 60:>8.1f} {r['steps']:>10} {b['eval/em']:>8.3f} "
            f"{f['eval/em']:>7.3f} {f['eval/em'] - b['eval/em']:>+7.3f}  "
            + "  ".join(f"{b[h]:>8.3f} -> {f[h]:.3f}" for h in hops)
        )
    gains = [r["after"]["eval/em"] - r["before"]["eval/em"] for r in rows]
    if len(rows) > 1:
        sd = lambda xs: statistics.stdev(xs)
        print(
            f"mean ± std over {len(rows)} seeds: "
            f"{statistics.mean(r['wall'] for r in rows) / 60:.1f} ± "
            f"{sd([r['wall'] / 60 for r in rows]):.1f} min; EM warm "
            f"{statistics.mean(r['before']['eval/em'] for r in rows):.3f} ± "
            f"{sd([r['before']['eval/em'] for r in rows]):.3f}; EM RL "
            f"{statistics.mean(r['after']['eval/em'] for r in rows):.3f} ± "
            f"{sd([r['after']['eval/em'] for r in rows]):.3f}; gain {statistics.mean(gains):+.3f} "
            f"± {sd(gains):.3f}; lowest gain {min(gains):+.3f}"
        )
    runs = {}
    for seed in a.seeds:
        with open(os.path.join(a.out, f"seed{seed}", "runs", "main", "metrics.jsonl")) as f:
            runs[f"seed {seed}"] = [json.loads(line) for line in f]
    run.plot_curves(runs, os.path.join(a.out, "curves.png"), keys=("rollout/reward", "eval/em"))
    print(f"curves: {os.path.join(a.out, 'curves.png')}")
    if a.check:
        bad = [
            f"seed {r['seed']}: warm-start EM {r['before']['eval/em']:.3f} < {a.min_warm_em}"
            for r in rows
            if r["before"]["eval/em"] < a.min_warm_em
        ]
        bad += [
            f"seed {r['seed']}: EM fell {-g:.3f} > {a.max_drop} during RL"
            for r, g in zip(rows, gains)
            if g < -a.max_drop
        ]
        print("check: " + ("; ".join(bad) if bad else "passed"))
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main(flags.parse(Args)[0])
