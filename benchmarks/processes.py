"""Rollout time per step with one process and with two (accelerate launch), on the same work and
the same cores: what splitting each step's prompts over ranks buys. Prints figures; asserts nothing.

    python benchmarks/processes.py  # the warm start in out/warmstart, the world in out/world
    python benchmarks/processes.py --algo grpo --steps 5 --prompts_per_step 8 --cores 2

Both runs are train.py on --cores CPUs (the first of this process's affinity set), with the same
flags and seed and --eval_every 0: one process with --cores threads (train.py takes every core it
is allowed), then two processes with --cores / 2 threads each (accelerate's launcher, gloo; each
rolls out half of every step's prompts), then, for reference, one process with --cores / 2 threads
(what one process gets from its other threads: little for a tiny model, whose generate is Python
overhead; and with other jobs on the cores, a team of threads waits for its slowest member). Each
rank samples with its own seed, so the runs roll out different trajectories of the same prompts:
the same work in expectation, not token for token. Step 1 is reported apart (its first generate
calls warm up).
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from infra import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Args:
    """What to measure."""

    model: str = "out/warmstart"
    """Policy directory (the embedded default's warm start)."""
    world: str = "out/world"
    """Embedded world directory (train.jsonl, corpus.jsonl)."""
    algo: str = "tree_grpo"
    """train.py --algo."""
    steps: int = 4
    """RL steps per run."""
    prompts_per_step: int = 8
    """train.py --prompts_per_step (even: two processes take half each)."""
    cores: int = 2
    """CPUs both runs share: one process with this many threads, two with half each."""


def run(a: Args, out: str, processes: int, threads: int, cores: list[int]):
    """train.py in `processes` processes of `threads` threads pinned to `cores`: its metrics rows
    and wall time."""
    train = [
        os.path.join(ROOT, "train.py"),
        *("--model", a.model, "--data", a.world, "--corpus", os.path.join(a.world, "corpus.jsonl")),
        *("--algo", a.algo, "--steps", str(a.steps), "--prompts_per_step", str(a.prompts_per_step)),
        *("--eval_every", "0", "--checkpoint_every", "0", "--out_dir", out),
        *("--run_name", f"processes{processes}x{threads}"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if processes == 1:  # train.py takes every core it may use: here, `threads` of them
        cmd = [sys.executable, *train]
        cores = cores[:threads]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launcher = "--multi_gpu --num_machines 1 --mixed_precision no --dynamo_backend no"
        cmd = [sys.executable, "-m", "accelerate.commands.launch", *launcher.split()]
        cmd += ["--num_processes", str(processes), "--main_process_port", str(port), *train]
        env["ACCELERATE_USE_CPU"] = "1"  # accelerate's --cpu would start one process
    t0 = time.perf_counter()
    out_ = subprocess.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),
    )
    wall = time.perf_counter() - t0
    if out_.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out_.stderr[-3000:]}")
    with open(os.path.join(out, "runs", f"processes{processes}x{threads}", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f], wall


def main(a: Args):
    allowed = sorted(os.sched_getaffinity(0))
    if a.cores < 2 or a.cores % 2 or a.cores > len(allowed) or a.prompts_per_step % 2:
        raise SystemExit(
            f"--cores {a.cores} must be even, >= 2 and at most the {len(allowed)} CPUs this "
            f"process may use; --prompts_per_step {a.prompts_per_step} must be even"
        )
    cores = allowed[: a.cores]
    print(
        f"{a.algo}, {a.prompts_per_step} prompts per step, {a.steps} steps, on CPUs {cores}; "
        f"load average before: {os.getloadavg()[0]:.1f}"
    )
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for processes, threads in ((1, a.cores), (2, a.cores // 2), (1, a.cores // 2)):
            rows, wall = run(a, out, processes, threads, cores)
            later = rows[1:] or rows
            mean = lambda key, later=later: sum(r[key] for r in later) / len(later)
            results[processes, threads] = rollout = mean("train/time_rollout")
            print(
                f"{processes} process{'es' if processes > 1 else ''} x {threads} thread"
                f"{'s' if threads > 1 else ''}: rollout {rollout:.2f} s per step "
                f"(step 1: {rows[0]['train/time_rollout']:.2f} s), log-probs "
                f"{mean('train/time_logprob'):.2f} s, update {mean('train/time_update'):.2f} s; "
                f"{mean('rollout/tokens_per_prompt'):.0f} tokens per prompt; wall {wall:.0f} s"
            )
    half = a.cores // 2
    print(
        f"rollout time per step, 1 process x {a.cores} / 2 processes x {half}: "
        f"{results[1, a.cores] / results[2, half]:.2f}x (1 process x {half} / 2 processes x "
        f"{half}: {results[1, half] / results[2, half]:.2f}x); load average after: "
        f"{os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main(*flags.parse(Args))
