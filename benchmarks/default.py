"""The main job's goal figures: wall time of the whole default command and test EM before and after RL, per seed.
Prints figures; asserts nothing.

    python benchmarks/default.py                       # seeds 0 1 2, --algo tree_grpo, in out/bench-default/
    python benchmarks/default.py --seeds 0 --algo grpo

Each seed runs `accelerate launch train.py --algo ALGO --seed S --out_dir OUT/seedS` from scratch (world, warm
start, RL; the run's eval at step 0 is the warm start's EM, its last eval the RL policy's, on the same 400 test
questions spread over the hops, sampled as the seeds evaluate: T = 0.7, top-p 0.8). Then it evaluates both
checkpoints greedily with eval.py on the same questions. Seeds run one after another so the wall times are honest.
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


@dataclass
class Args:
    """What to run."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Seeds (each: its own warm start and RL run)."""
    algo: str = "tree_grpo"
    """train.py --algo."""
    out: str = "out/bench-default"
    """Parent of the per-seed output directories (deleted first: every seed starts from nothing)."""


def greedy_em(model: str, out_dir: str) -> float:
    report = os.path.join(model, "eval_greedy.json")
    subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--model", model, "--n", "400", "--temperature", "0",
                    "--top_p", "1", "--out", report], cwd=out_dir, check=True, capture_output=True)
    with open(report) as f:
        return json.load(f)["report"]["em"]


def main(a: Args):
    rows = []
    for seed in a.seeds:
        out = os.path.abspath(os.path.join(a.out, f"seed{seed}"))
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        t0 = time.perf_counter()
        subprocess.run(["accelerate", "launch", os.path.join(ROOT, "train.py"), "--algo", a.algo, "--seed", str(seed),
                        "--out_dir", out], cwd=out, check=True)
        wall = time.perf_counter() - t0
        run = os.path.join(out, "runs", f"{a.algo}-seed{seed}")  # train.py's default run name
        with open(os.path.join(run, "metrics.jsonl")) as f:
            evals = [r for r in map(json.loads, f) if "eval/em" in r]
        before, after = evals[0]["eval/em"], evals[-1]["eval/em"]
        g_before = greedy_em(os.path.join(out, "warmstart"), out)  # eval.py regenerates the same world in out/out
        g_after = greedy_em(os.path.join(run, "final"), out)
        rows.append((seed, wall, before, after, g_before, g_after))
        print(f"seed {seed}: {wall / 60:.1f} min; EM (T=0.7) {before:.3f} -> {after:.3f}; greedy {g_before:.3f} -> "
              f"{g_after:.3f}", flush=True)
    print(f"\n{'seed':>4} {'minutes':>8} {'EM before':>10} {'EM after':>9} {'gain':>7} {'greedy before':>14} "
          f"{'greedy after':>13} {'gain':>7}")
    for seed, wall, b, f, gb, gf in rows:
        print(f"{seed:>4} {wall / 60:>8.1f} {b:>10.3f} {f:>9.3f} {f - b:>+7.3f} {gb:>14.3f} {gf:>13.3f} {gf - gb:>+7.3f}")
    if len(rows) > 1:
        gains = [f - b for _, _, b, f, _, _ in rows]
        greedy = [gf - gb for *_, gb, gf in rows]
        print(f"mean gain (T=0.7) {statistics.mean(gains):+.3f} ± {statistics.stdev(gains):.3f} (std over seeds); "
              f"greedy {statistics.mean(greedy):+.3f} ± {statistics.stdev(greedy):.3f}; "
              f"wall time {statistics.mean(r[1] for r in rows) / 60:.1f} min")


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    import cli
    main(cli.parse(Args)[0])
