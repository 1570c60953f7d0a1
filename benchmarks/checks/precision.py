"""float32 against bf16 autocast: seconds per RL step of the main job at a small size, per phase
(rollout, log-probs, update), side by side.

    python benchmarks/checks/precision.py                     # tree_grpo, 4 steps each, a temp dir
    python benchmarks/checks/precision.py --steps 6 --out out/precision --json precision.json

Runs train.py twice under accelerate's launcher, one process, `--mixed_precision no` then `bf16`:
the embedded default with the tests' tiny warm start and small flags (FAST and TINY_WARM of
tests/test_train.py, restated here: a test holds them equal), --eval_every 0, the same seed and
--out; the second run reuses the first's world and warm start. It reads each run's metrics.jsonl
(train/time_rollout, train/time_logprob, train/time_update) and prints the first step apart (a new
shape is slow the first time, most of all under autocast) and the median of the others. Where the
device is a CPU, bf16 autocast is emulated unless the CPU has AMX (the device line says which):
such figures say nothing about a GPU. Asserts nothing.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from infra import flags

ROOT = Path(__file__).resolve().parents[2]
# tests/test_train.py's FAST and TINY_WARM (tests/test_gpu_memory.py keeps them equal)
FAST = (
    "--prompts_per_step 2 --max_step_tokens 12 --max_turns 2 --eval_n 2 --grpo_G 3 --branpo_N 2 "
    "--carl_N 2 --treeps_N 3 --micro_batch_size 4"
).split()
TINY_WARM = "--copy_steps 2 --sft_steps 2 --warm_batch_size 2 --target_em 0".split()
PHASES = ("rollout", "logprob", "update")
PRECISIONS = {"no": "float32", "bf16": "bf16"}


@dataclass
class Args:
    """What to run."""

    algo: str = "tree_grpo"
    """train.py --algo."""
    steps: int = 4
    """RL steps per run (the first is reported apart)."""
    seed: int = 0
    """train.py --seed (both runs)."""
    out: str = ""
    """train.py --out_dir of both runs; empty = a temporary directory, deleted after."""
    json: str = ""
    """Write every figure to this JSON file."""
    timeout: int = 1200
    """Seconds each run may take before it is stopped."""


def device() -> str:
    """What the runs compute on, said so that nobody reads a CPU's bf16 as a GPU's."""
    if torch.cuda.is_available():
        return f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    name, amx = "unknown CPU", False
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = next(
            (x.split(":", 1)[1].strip() for x in info.splitlines() if "model name" in x), name
        )
        amx = "amx_bf16" in info
    how = "has AMX (bf16 in hardware)" if amx else "no AMX: bf16 autocast is emulated, slow"
    return f"CPU: {name}, {how}; torch {torch.__version__}; NOT a GPU figure"


def run(a: Args, out: str, precision: str) -> tuple[list[dict], float]:
    """train.py under the launcher at one precision: its metrics rows and wall seconds."""
    name = f"precision_{PRECISIONS[precision]}"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1"]
    launcher += ["--num_machines", "1", "--mixed_precision", precision, "--dynamo_backend", "no"]
    cmd = [*launcher, str(ROOT / "train.py"), "--algo", a.algo, "--steps", str(a.steps)]
    cmd += ["--seed", str(a.seed), "--eval_every", "0", "--checkpoint_every", "0"]
    cmd += ["--out_dir", out, "--run_name", name, "--overwrite", *FAST, *TINY_WARM]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nfailed ({done.returncode}):\n{done.stderr[-3000:]}")
    with open(os.path.join(out, "runs", name, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if "train/time_update" in r], wall


def main(a: Args):
    flags.check(a, [("steps", "at least 2 (the first is reported apart)", lambda v: v >= 2)])
    print(f"device: {device()}")
    print(f"train.py --algo {a.algo}, {a.steps} steps, the tests' tiny warm start and FAST flags")
    figures = {"device": device(), "algo": a.algo, "steps": a.steps, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or tmp
        for precision in flags.progress(PRECISIONS, desc="runs"):
            rows, wall = run(a, out, precision)
            figures["runs"][PRECISIONS[precision]] = {
                "wall_s": wall,
                **{
                    k: {
                        "first": rows[0][f"train/time_{k}"],
                        "median_rest": statistics.median(r[f"train/time_{k}"] for r in rows[1:]),
                    }
                    for k in PHASES
                },
            }
    f32, bf16 = figures["runs"]["float32"], figures["runs"]["bf16"]
    print(
        "| phase, s/step | float32 first | float32 median rest | bf16 first | bf16 median rest | "
        "bf16 / float32 (rest) |\n|---|---|---|---|---|---|"
    )
    for k in PHASES:
        ratio = bf16[k]["median_rest"] / max(f32[k]["median_rest"], 1e-9)
        print(
            f"| {k} | {f32[k]['first']:.2f} | {f32[k]['median_rest']:.2f} | {bf16[k]['first']:.2f} "
            f"| {bf16[k]['median_rest']:.2f} | {ratio:.2f}x |"
        )
    print(
        f"wall per run (world and warm start in the first): float32 {f32['wall_s']:.0f} s, "
        f"bf16 {bf16['wall_s']:.0f} s"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main(*flags.parse(Args))
