"""compare.py's tasks: each one subprocess (the warm start, eval.py's step 0, a train.py arm),
pinned to its share of the cores, with a progress bar; its result stored with a key (its flags, the
code it imports, the warm start's weights, --threads, the library versions) and reused while the
key matches."""

import ast
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from queue import Queue

from tqdm import tqdm

from benchmarks.compare_report import commit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Task:
    """`script` with `flags` (its result depends on them: in the key) and `where` (paths: not)."""

    label: str  # for bars and messages: "seed 0 GRPO G=4"
    script: str  # eval.py or train.py (the warm start: train.py warmstart)
    flags: list[str]
    where: list[str]
    home: str  # the seed's directory: result in results/NAME.json, output in logs/NAME.log
    name: str
    warm: str = ""  # the warm start it reads (its weights' hash is in the key)
    steps: int = 0  # train.py: RL steps, for the progress bar
    metrics: str = ""  # train.py: its metrics.jsonl (counted by the bar, kept in the result)
    report: str = ""  # eval.py: its JSON report (kept in the result as a step-0 evaluation row)
    world: str = ""  # the setting's world flags (in the key where set: the world is not a flag)

    @property
    def result(self) -> str:
        return os.path.join(self.home, "results", self.name + ".json")

    def key(self, threads: int) -> dict:
        return {
            "command": [self.script, *self.flags],
            **({"world": self.world} if self.world else {}),
            "code": code_hashes(self.script),
            "warmstart": weights_hash(self.warm) if self.warm else None,
            "threads": threads,
            "versions": {p: importlib.metadata.version(p) for p in ("torch", "transformers")},
        }


def code_hashes(script: str) -> dict[str, str]:
    """sha256 (16 hex digits) of `script` and of each repository module it imports, transitively
    (`from infra import data`: infra/data.py)."""
    todo, hashes = [script], {}
    while todo:
        name = todo.pop()
        if name not in hashes:
            source = open(os.path.join(ROOT, name), "rb").read()
            hashes[name] = hashlib.sha256(source).hexdigest()[:16]
            for node in ast.walk(ast.parse(source)):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                files = [n.replace(".", "/") + ".py" for n in names]
                todo += [f for f in files if os.path.exists(os.path.join(ROOT, f))]
    return dict(sorted(hashes.items()))


def weights_hash(model_dir: str) -> str:
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no .safetensors file: not a warm start")
    h = hashlib.sha256()
    for f in files:
        h.update(open(os.path.join(model_dir, f), "rb").read())
    return h.hexdigest()[:16]


def differences(stored: dict, now: dict) -> str:
    """What differs between two keys, in words: "code (tree.py); threads (2 -> 1)"."""
    parts = []
    for k, v in now.items():
        was = stored.get(k)
        if k == "code" and was != v:
            files = sorted(f for f in {**was, **v} if was.get(f) != v.get(f))
            parts.append(f"code ({', '.join(files)})")
        elif was != v:
            parts.append(f"{k} ({was} -> {v})")
    return "; ".join(parts)


def load(task: Task) -> dict | None:
    if not os.path.exists(task.result):
        return None
    with open(task.result) as f:
        return json.load(f)


def run_tasks(tasks: list[Task], a):
    """Run the tasks whose result is missing, a.jobs at once (`a`: compare.py's Args); stop before
    any if a stored result has another key (unless --redo)."""
    keys, stored = [t.key(a.threads) for t in tasks], [load(t) for t in tasks]
    stale = [
        f"{t.label}: {differences(s['key'], k)}"
        for t, k, s in zip(tasks, keys, stored)
        if s and s["key"] != k
    ]
    if stale and not a.redo:
        raise SystemExit(
            "stored results made with other code or settings (nothing was run):\n  "
            + "\n  ".join(stale)
            + "\npass --redo to recompute them (their results "
            "are replaced), or --out DIR to start anew"
        )
    todo = [(t, k) for t, k, s in zip(tasks, keys, stored) if not s or s["key"] != k]
    if len(todo) < len(tasks):
        print(
            f"reusing {len(tasks) - len(todo)} stored results (same code, flags, warm start, "
            f"threads)"
        )
    cores, slots = sorted(os.sched_getaffinity(0)), Queue()
    for j in range(a.jobs):  # a slot: a bar position, a.threads cores (shared if there are too few)
        slots.put((j, sorted({cores[(j * a.threads + i) % len(cores)] for i in range(a.threads)})))
    pool = ThreadPoolExecutor(a.jobs)
    try:
        futures = [pool.submit(run_task, t, k, slots, a) for t, k in todo]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
    finally:  # a failure or Ctrl-C (which reaches the running tasks too): start no other task
        pool.shutdown(wait=True, cancel_futures=True)
    for f in done:
        f.result()  # raises the first failure


PIN = (
    "import os, sys; os.sched_setaffinity(0, {cores}); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
)  # then the script, in place


def run_task(t: Task, key: dict, slots: Queue, a):
    """One task in a subprocess pinned to a slot's cores, with a progress bar; its result stored."""
    slot, cores = slots.get()
    try:
        log = os.path.join(t.home, "logs", t.name + ".log")
        for d in ("logs", "results"):
            os.makedirs(os.path.join(t.home, d), exist_ok=True)
        threads = str(a.threads)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        cmd = [
            sys.executable,
            "-c",
            PIN.format(cores=set(cores)),
            os.path.join(ROOT, t.script),
            *t.flags,
            *t.where,
        ]
        if t.metrics and os.path.exists(t.metrics):
            os.remove(t.metrics)  # an earlier run's, else counted by the bar (--overwrite is later)
        t0 = time.perf_counter()
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        bar = tqdm(
            total=t.steps or None,
            desc=t.label,
            position=slot,
            leave=a.jobs == 1,
            unit="step",
            bar_format=None if t.steps else "{desc}: {elapsed}",
        )
        while proc.poll() is None:
            time.sleep(1)
            if t.metrics and os.path.exists(t.metrics):
                bar.update(sum('"train/loss"' in line for line in open(t.metrics)) - bar.n)
            bar.refresh()
        bar.close()
        if proc.returncode:
            tail = "".join(open(log).readlines()[-30:])
            raise SystemExit(f"{t.label} failed (exit {proc.returncode}); end of {log}:\n{tail}")
        rows = []
        if t.metrics:
            rows = [json.loads(line) for line in open(t.metrics)]
        elif t.report:  # as train.run_eval's row
            report = json.load(open(t.report))["report"]
            rows = [
                {
                    "step": 0,
                    **{f"eval/{k}": v for k, v in report.items() if isinstance(v, (int, float))},
                }
            ]
        result = {"key": key, "commit": commit(), "wall_s": time.perf_counter() - t0, "rows": rows}
        with open(t.result + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(t.result + ".tmp", t.result)  # complete or absent, never torn
    finally:
        slots.put((slot, cores))
