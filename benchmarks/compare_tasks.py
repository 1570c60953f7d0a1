"""compare.py's tasks: each one subprocess (the warm start, eval.py's step 0, a train.py arm),
pinned to its share of the cores, with a progress bar; its result stored with a key (its flags, the
code it imports, the warm start's weights, --threads, the library versions) and reused while the
key matches.

A sitting's end never leaves an arm running on its own, and never touches a live one:
- SIGTERM or SIGINT (a preemption, Ctrl-C) to compare.py is passed on to every running task (each
  started in a session of its own, so that this is the only way a signal reaches it): an arm
  finishes its step, saves a checkpoint and stops, as train.py does; no other task starts; the
  sitting says what was interrupted and how to go on, and exits with the shell's code for the
  signal. A second signal is passed on too: train.py then stops at once, without saving.
- A sitting killed outright (SIGKILL) cannot pass anything on: the kernel kills its running tasks
  with it (PIN); train.py survives a kill -9, and the next sitting starts such an arm anew (or from
  the checkpoint an earlier interrupted sitting left it).
- The next sitting (the same command) resumes an interrupted arm from its checkpoint, when the arm
  started under the same key (results/NAME.started.json); an arm started under another key runs
  anew.
- A sitting runs nothing while the run directory of an arm it would run is locked by a live
  train.py (e.g. an arm of an earlier sitting, finishing its step), and deletes nothing there.
"""

import ast
import hashlib
import importlib.metadata
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from queue import Queue

from tqdm import tqdm

from benchmarks.compare_report import commit
from infra import files

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
    run: str = ""  # train.py: its run directory (its metrics.jsonl counted by the bar and kept in
    # the result; resumed from its checkpoint after an interrupted sitting)
    report: str = ""  # eval.py: its JSON report (kept in the result as a step-0 evaluation row)
    world: str = ""  # the setting's world flags (in the key where set: the world is not a flag)

    @property
    def result(self) -> str:
        return os.path.join(self.home, "results", self.name + ".json")

    @property
    def metrics(self) -> str:
        return os.path.join(self.run, "metrics.jsonl") if self.run else ""

    @property
    def started(self) -> str:
        """An arm's record of the key it started under (and its wall time so far), until its
        result is stored: an interrupted arm goes on from its checkpoint under that key only."""
        return os.path.join(self.home, "results", self.name + ".started.json")

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


class Sitting:
    """A sitting's running tasks and the signal that stops it: from its making on, SIGTERM and
    SIGINT are passed on to every running task, and once one came no task starts (`stop`)."""

    def __init__(self, out: str):
        self.out = out  # compare.py's --out
        self.signal: signal.Signals | None = None  # the first one that came
        self.running: dict[str, subprocess.Popen] = {}  # a running task's label -> its process
        self.interrupted: list[str] = []  # what each task a signal stopped left, in words
        self.lock = threading.RLock()  # reentrant: a second signal may come inside `ask`
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self.ask)

    def ask(self, signum, frame):
        self.signal = self.signal or signal.Signals(signum)
        with self.lock:
            for proc in self.running.values():
                proc.send_signal(signum)

    def start(self, label: str, cmd: list[str], **popen) -> subprocess.Popen | None:
        """The task's process, in a session of its own (a Ctrl-C at the terminal reaches it only
        through `ask`); None once a signal came."""
        with self.lock:
            if self.signal:
                return None
            self.running[label] = subprocess.Popen(cmd, start_new_session=True, **popen)
            return self.running[label]

    def ended(self, label: str):
        with self.lock:
            del self.running[label]

    def stop(self):
        """After a signal: say what was interrupted and how to go on, and exit with the shell's
        code for the signal (128 + its number), as train.py does."""
        if not self.signal:
            return
        again = " ".join(shlex.quote(x) for x in ["python", *sys.argv])
        print(
            f"stopped by {self.signal.name}; interrupted:\n  "
            + ("\n  ".join(self.interrupted) or "no task (none was running)")
            + f"\nthe finished tasks' results are stored ({self.out}/seedS/results/). To go on, "
            "run the same command again: it reuses them and resumes each interrupted arm from "
            f"its checkpoint: {again}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(128 + self.signal)


def run_tasks(tasks: list[Task], a, sitting: Sitting):
    """Run the tasks whose result is missing, a.jobs at once (`a`: compare.py's Args); stop before
    any if a stored result has another key (unless --redo), or if a task's run directory is held
    by a live train.py (an arm of an earlier sitting: nothing of it is touched). After a signal
    (`sitting`), the running tasks stop, no other starts, and the sitting ends saying so."""
    sitting.stop()  # a signal before any task of this call: none starts
    for t in tasks:  # an arm of an earlier sitting may be finishing its step: refused, not touched
        if t.run and os.path.exists(os.path.join(t.run, "run.lock")):
            where = f"{t.label}: its run directory {t.run}"
            files.refuse_if_held(os.path.join(t.run, "run.lock"), where)
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
        futures = [pool.submit(run_task, t, k, slots, a, sitting) for t, k in todo]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
    finally:  # a failure: start no other task; the running ones end first
        pool.shutdown(wait=True, cancel_futures=True)
    for f in done:
        f.result()  # raises the first failure
    sitting.stop()


# A task's process: its cores set, then the script in its place (os.execv keeps the process). It
# first asks the kernel for SIGKILL when the thread of compare.py that started it ends (a pool
# worker, which waits for it), however compare.py ends, SIGKILL included: PR_SET_PDEATHSIG (1),
# which execv keeps; the simplest mechanism that needs nothing of compare.py alive (a watcher
# thread or process would die with it, or be one more process to orphan). SIGKILL, not SIGTERM:
# as compare.py's threads end one by one the kernel hands the task to the next and signals it
# again each time, and a second SIGTERM stops train.py at once anyway (its second-signal rule);
# train.py survives a kill -9. Set here in the child, not in a preexec_fn (unsafe in a process
# with threads); a compare.py that died before it was set has left the task another parent.
PIN = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 9); "
    "os.getppid() == {parent} or sys.exit('compare.py ended before this task began'); "
    "os.sched_setaffinity(0, {cores}); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
)


def run_task(t: Task, key: dict, slots: Queue, a, sitting: Sitting):
    """One task in a subprocess pinned to a slot's cores, with a progress bar; its result stored.
    An arm goes on from its checkpoint when an interrupted sitting started it under the same key
    (t.started), else starts anew (--overwrite); a signal (`sitting`) leaves it unstored."""
    slot, cores = slots.get()
    try:
        if sitting.signal:
            return  # stopping: it runs in the next sitting
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
        was = json.load(open(t.started)) if t.run and os.path.exists(t.started) else None
        resume = bool(was) and was["key"] == key and os.path.exists(os.path.join(t.run, "latest"))
        spent = was["wall_s"] if resume else 0.0  # the earlier sittings' wall time on it
        cmd = [
            sys.executable,
            "-c",
            PIN.format(parent=os.getpid(), cores=set(cores)),
            os.path.join(ROOT, t.script),
            *t.flags,
            *t.where,
            *(["--resume" if resume else "--overwrite"] if t.run else []),
        ]
        if t.run and not resume:  # an earlier run's (--overwrite deletes it later, once train.py
            # holds the run lock): metrics the bar would count, a checkpoint of another key
            for path in (t.metrics, os.path.join(t.run, "latest")):
                files.remove(path)
        if t.run:
            files.write_json(t.started, {"key": key, "wall_s": spent})
        t0 = time.perf_counter()
        with open(log, "a" if resume else "w") as f:  # a resumed arm's log goes on
            proc = sitting.start(
                t.label, cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )
        if proc is None:
            return
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
        sitting.ended(t.label)
        wall = spent + time.perf_counter() - t0
        if proc.returncode and sitting.signal:
            sitting.interrupted.append(left(t))
            if t.run:
                files.write_json(t.started, {"key": key, "wall_s": wall})
            return
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
        result = {"key": key, "commit": commit(), "wall_s": wall, "rows": rows}
        with open(t.result + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(t.result + ".tmp", t.result)  # complete or absent, never torn
        files.remove(t.started)
    finally:
        slots.put((slot, cores))


def left(t: Task) -> str:
    """What a task a signal stopped left, and what the next sitting does with it."""
    latest = os.path.join(t.run, "latest") if t.run else ""
    if latest and os.path.exists(latest):
        saved = open(latest).read().strip()
        return f"{t.label}: {t.run}/{saved} saved; the next sitting resumes the arm from it"
    return f"{t.label}: nothing kept; the next sitting runs it from the start"
