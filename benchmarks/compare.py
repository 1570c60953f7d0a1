"""Which credit assignment learns more, at which rollout budget? The five methods and Tree-GRPO's
budget sweep side by side over seeds, each arm a train.py run from the same warm start.

    python benchmarks/compare.py --jobs 2       # seeds 0-4, every arm, two at once:
                                                # README "Comparison"
    python benchmarks/compare.py --calibrate    # generated tokens / prompt / step of knob choices
    python benchmarks/compare.py --quick        # one seed, two arms, 2 steps, a tiny warm start
    python benchmarks/compare.py --setting hard # the same in a harder world (SETTINGS), in
                                                # out/compare-hard
    python benchmarks/compare.py --setting hard --merge A/results.json B/results.json
                                                # one report over both files' seeds
    python benchmarks/compare.py --report docs/comparison_hard.json
                                                # its results.md again, byte for byte

Per seed S, in OUT/seedS/: the embedded world (of --setting: SETTINGS); the warm start (`train.py
warmstart --seed S`, once); its greedy test EM (`eval.py`, once: step 0 of every arm); then one
`train.py --model WARMSTART --no_eval_start` run per arm (runs/ARM/; its output in logs/). Every arm
of a seed sees the same questions in the same order (train.py orders them by the seed), the same
steps and the same shared settings (train.py's defaults and --train_flags); only the arm's own knobs
(GROUPS) differ. An arm that two groups share runs once.

Resuming: each finished task stores its result in OUT/seedS/results/ with a key: its flags (paths
left out; a setting's world flags too), a hash of every repository module its script imports, a hash
of the warm start's weights, --threads and the torch and transformers versions. A later call reuses
a result whose key matches; where a stored key differs it stops before running anything and says
what differs (--redo recomputes those tasks instead).

Threads: each task runs pinned to --threads cores (its CPU affinity, which train.py's torch threads
follow, and OMP_NUM_THREADS) whatever --jobs is, so the figures do not depend on --jobs. One thread
by default: on shared cores a second one made the tiny model 5-15x slower (README "Comparison").

Outputs in OUT: results.md (every table, also printed), results.json (every seed's numbers),
curves.png (test EM against step and against cumulative generated tokens, one line per arm, the
seeds' min-max as a band); --calibrate writes calibration-STEPS-steps.md. --merge writes the three
from several sittings' results.json files (their seeds in one report; each summary as stored);
--report writes results.md and curves.png from one. Each evaluation's per-question outcomes stay in
the run directories (runs/ARM/eval_stepN.jsonl; step 0's in logs/step0.json).

Statistics: every paired difference is tested by a two-sided paired t-test over the seeds, beside
the minimum detectable effect at 80% power for its sd and seed count (noncentral t) and its p
adjusted by Holm over the tests of one table (one measure at one step); "higher" / "lower" /
"agrees" / "disagrees" only where the adjusted p is below 0.05.
"""

import ast
import hashlib
import importlib.metadata
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields, replace
from queue import Queue
from typing import Literal

from matplotlib.figure import Figure
from scipy import optimize, stats
from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import train  # noqa: E402  (the project's modules, from the repository root)
from advantages import CreditConfig  # noqa: E402
from infra import data  # noqa: E402
from infra.flags import check, parse  # noqa: E402
from infra.warmstart import WarmConfig  # noqa: E402
from retriever import RetrieverConfig  # noqa: E402
from rollout import AgentConfig, RolloutConfig  # noqa: E402
from scripts.credit import tree_grpo_budget  # noqa: E402

# -------------------------------------------------------------------------------------------------
# The arms: each one's own train.py flags


def grpo(G: int) -> str:
    return f"--algo grpo --grpo_G {G}"


def tree(M: int, N: int, L: int) -> str:
    return f"--algo tree_grpo --tree_M {M} --tree_N {N} --tree_L {L}"


# The matched budget: GRPO G=4's generated tokens per prompt per step, each method within +-15% of
# it. Chosen among CANDIDATES with `--calibrate` on seed 0's warm start (README "Comparison"); the
# comments give each against GRPO G=4 over 3 steps (every candidate) and 15 steps (the nearest
# ones).
MATCHED = {
    "grpo": grpo(4),
    "tree_grpo": tree(2, 1, 1),  # -12%, -15.2%; (2,2,1) +19%, +18%; M=1: intra = inter
    "branpo": "--algo branpo --branpo_N 2",  # +21%, +6%; N=1 -45%, N=3 +85%
    "carl": "--algo carl --carl_N0 1 --carl_N 6",  # -1%, -3%; (1,8) +19%, +21%
    "treeps": "--algo treeps --treeps_N 3 --treeps_retain 2",  # +9%, +2%; (4,2) +28%, +18%
}
CANDIDATES = {  # --calibrate's knobs per method; the budget grows with G, trees, N, forks, nodes
    "grpo": [grpo(4)],
    "tree_grpo": [tree(2, 1, 1), tree(2, 1, 2), tree(2, 2, 1)],
    "branpo": [f"--algo branpo --branpo_N {n}" for n in (1, 2, 3)],
    "carl": [f"--algo carl --carl_N0 1 --carl_N {n}" for n in (4, 6, 8, 10)],
    "treeps": [f"--algo treeps --treeps_N {n} --treeps_retain 2" for n in (3, 4, 5)],
}
TREE, G4 = MATCHED["tree_grpo"], grpo(4)
GROUPS = [  # (title, [(an arm's flags, the arms it is compared with, paired by seed)])
    (
        "Tree-GRPO's budget sweep (its Table 3): chains against trees at ~2, 4, 8 trajectories",
        [
            (grpo(2), ()),
            (grpo(4), ()),
            (grpo(8), ()),
            (tree(1, 2, 1), (grpo(2),)),
            (tree(2, 2, 1), (grpo(4),)),
            (tree(4, 2, 1), (grpo(8),)),
        ],
    ),
    (
        "the five methods at GRPO G=4's budget (Tree-GRPO at both of its matches: (2,1,1) in "
        "generated tokens, (2,2,1) in its Table 3's budget M(1 + LN/2) = 4)",
        [(G4, ()), (TREE, (G4,)), (tree(2, 2, 1), (G4,))]
        + [(MATCHED[a], (G4,)) for a in ("branpo", "carl", "treeps")],
    ),
    (
        "Tree-GRPO's advantage (its Table 4): intra-tree, inter-tree, both",
        [
            (TREE + " --tree_mode intra", (G4, TREE)),
            (TREE + " --tree_mode inter", (G4, TREE)),
            (TREE, (G4,)),
        ],
    ),
    (
        "each paper's own ablation at the matched budget",
        [
            (MATCHED["treeps"] + " --no_treeps_process", (MATCHED["treeps"], G4)),
            (MATCHED["carl"] + " --carl_update_all", (MATCHED["carl"], G4)),
            (MATCHED["branpo"] + " --no_branpo_rsm", (MATCHED["branpo"], G4)),
        ],
    ),
]
CLAIMS = [  # (a paper's claim, its numbers; arm; reference; measure(); the sign it claims)
    (
        "Tree-GRPO Table 3, budget ~2: tree (1,2,1) beats chains (multi-hop EM 31.6 vs 14.9)",
        tree(1, 2, 1),
        grpo(2),
        "multihop",
        +1,
    ),
    (
        "Tree-GRPO Table 3, budget ~4: tree (2,2,1) beats chains (36.8 vs 31.8)",
        tree(2, 2, 1),
        grpo(4),
        "multihop",
        +1,
    ),
    (
        "Tree-GRPO Table 3, budget ~8: tree (4,2,1) beats chains (35.1 vs 31.4)",
        tree(4, 2, 1),
        grpo(8),
        "multihop",
        +1,
    ),
    (
        "Tree-GRPO Table 4: the intra-tree advantage alone collapses (1.2 vs GRPO 31.8), from a "
        "base model over a full run; a warm-started 0.8M-parameter policy for 15 steps cannot "
        "test that",
        TREE + " --tree_mode intra",
        G4,
        "multihop",
        -1,
    ),
    (
        "Tree-GRPO Table 4: the inter-tree advantage alone is below both (33.8 vs 36.8)",
        TREE + " --tree_mode inter",
        TREE,
        "multihop",
        -1,
    ),
    (
        "TreePS-RAG Table 2: the process advantage beats GRPO on its trees (multi-hop 0.448 vs "
        "0.419)",
        MATCHED["treeps"],
        MATCHED["treeps"] + " --no_treeps_process",
        "multihop",
        +1,
    ),
    (
        "CARL Table 4: updating only critical actions beats updating all (~1 point)",
        MATCHED["carl"],
        MATCHED["carl"] + " --carl_update_all",
        "em",
        +1,
    ),
    (
        "CARL (its Eq. 15 and after): 60% fewer update actions than GRPO",
        MATCHED["carl"],
        G4,
        "train/actions_trained",
        -1,
    ),
    (
        "BranPO Table 4: redundant step masking helps (multi-hop F1 54.6 vs 53.7)",
        MATCHED["branpo"],
        MATCHED["branpo"] + " --no_branpo_rsm",
        "multihop",
        +1,
    ),
    (
        "BranPO Table 8: its rollout takes longer than GRPO's (191 vs 108 s a step)",
        MATCHED["branpo"],
        G4,
        "train/time_rollout",
        +1,
    ),
    (
        "BranPO Table 8: its update takes less time than GRPO's (182 vs 251 s a step)",
        MATCHED["branpo"],
        G4,
        "train/time_update",
        -1,
    ),
]
QUICK_ARMS = [grpo(2), tree(1, 2, 1)]

# The worlds the comparison runs in; every seed's world, warm start and arm alike. Each setting:
# flags of infra/data.py's WorldConfig (world), of protocol.AgentConfig (agent: the warm start's and
# every arm's, before --warm_flags and --train_flags, which win) and of WarmConfig (warm). "hard"
# (docs/comparison.md, "The hard setting"): 6 hops (a search round each), twice the look-alike
# passages, and a demonstrator that stops after 4 searches on 5- and 6-hop questions.
SETTINGS = {
    "default": dict(world="", agent="", warm=""),
    "hard": dict(
        world="--max_hops 6 --distractor_fraction 0.6",
        agent="--max_turns 6 --max_traj_tokens 1536",
        warm="--search_budget 4",
    ),
}


def algo_config(flags: str) -> tuple[RolloutConfig, CreditConfig]:
    return parse(RolloutConfig, CreditConfig, args=flags.split())


def arm_name(flags: str) -> str:
    """An arm's name in the tables, from its method's knobs (the defaults where unset)."""
    r, c = algo_config(flags)
    mode = {"intra": " intra only", "inter": " inter only"}.get(c.tree_mode, "")
    return {
        "grpo": f"GRPO G={r.grpo_G}",
        "tree_grpo": f"Tree-GRPO ({r.tree_M},{r.tree_N},{r.tree_L})" + mode,
        "branpo": f"BranPO N={r.branpo_N}" + " no RSM" * (not r.branpo_rsm),
        "carl": f"CARL ({r.carl_N0},{r.carl_N})" + " update-all" * c.carl_update_all,
        "treeps": f"TreePS ({r.treeps_N},{r.treeps_retain})"
        + " no process" * (not c.treeps_process),
    }[r.algo]


def arms() -> dict[str, str]:
    """Every arm of GROUPS once: name -> flags; two arms of one name but other knobs: refused."""
    out = {}
    for flags in (f for _, members in GROUPS for arm, refs in members for f in (arm, *refs)):
        name = arm_name(flags)
        if algo_config(out.setdefault(name, flags)) != algo_config(flags):
            raise ValueError(
                f"arms {out[name]!r} and {flags!r} are both named {name!r}; extend "
                f"arm_name so that the tables tell them apart"
            )
    return out


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# -------------------------------------------------------------------------------------------------
# Flags


@dataclass
class Args:
    """What to run; every arm's shared settings are train.py's defaults and --train_flags."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    """Seeds: each its own warm start, every arm trained from it."""
    arms: list[str] = field(default_factory=list)
    """Only these arms (names as the tables print them, e.g. "GRPO G=4"); empty = every arm."""
    train_flags: str = "--eval_every 5"
    """train.py flags of every arm, as --train_flags="..." (agent format: also --warm_flags)."""
    warm_flags: str = ""
    """`train.py warmstart` flags of every seed's warm start, as --warm_flags="..."."""
    warmstart: str = ""
    """An existing warm start to train every arm from (one seed); empty = built in OUT/seedS."""
    out: str = ""
    """Output directory; empty = out/compare (-SETTING if not the default; -quick with --quick)."""
    jobs: int = 1
    """Tasks run at once, each on --threads cores (the figures do not depend on this)."""
    threads: int = 1
    """CPU cores and torch threads per task (README "Comparison": why 1); in every result's key."""
    redo: bool = False
    """Recompute the stored results whose key differs (code, flags, warm start, threads)."""
    calibrate: bool = False
    """Instead: generated tokens per prompt per step of CANDIDATES, on the first seed."""
    calibrate_steps: int = 3
    """--calibrate: RL steps per candidate (no evaluation)."""
    quick: bool = False
    """Smoke run: the first seed, QUICK_ARMS, QUICK's tiny settings."""
    setting: Literal[*SETTINGS] = "default"
    """The world, agent and warm start flags of every seed and arm (SETTINGS)."""
    merge: list[str] = field(default_factory=list)
    """Instead: one report over the seeds of several results.json files of this --setting, made in
    separate sittings or on separate machines (the same arms and shared flags, other seeds)."""
    report: str = ""
    """Instead: the tables and figure again from one results.json (a run's, a --merge's, a
    committed one such as docs/comparison_hard.json), results.md byte for byte as first written."""


QUICK = dict(
    train_flags="--steps 2 --eval_every 1 --eval_n 8 --prompts_per_step 2 --max_turns 2 "
    "--max_step_tokens 16",
    warm_flags="--copy_steps 2 --sft_steps 2 --warm_batch_size 2 --target_em 0",
)


def parse_train(flags: str):
    """train.py's six configs for these flags, checked as train.py checks them."""
    configs = parse(
        train.Args,
        RolloutConfig,
        CreditConfig,
        AgentConfig,
        RetrieverConfig,
        WarmConfig,
        args=flags.split(),
    )
    train.validate(*configs)
    return configs


def changed(config) -> list[str]:
    """The flags that set `config` away from its defaults (so eval.py gets the arms' settings)."""
    default = type(config)()
    return [
        x
        for f in fields(config)
        if (v := getattr(config, f.name)) != getattr(default, f.name)
        for x in (
            [f"--{'no_' * (not v)}{f.name}"] if isinstance(v, bool) else [f"--{f.name}", str(v)]
        )
    ]


def configure(a: Args) -> tuple[Args, dict[str, str], str]:
    """--quick's, --setting's and --out's defaults applied and every flag checked; the arms to run
    (name -> flags) and the train.py flags they share."""
    out = "out/compare" + f"-{a.setting}" * (a.setting != "default") + "-quick" * a.quick
    if a.quick:
        a = replace(a, seeds=a.seeds[:1], arms=[arm_name(f) for f in QUICK_ARMS], **QUICK)
    setting = SETTINGS[a.setting]
    a = replace(
        a,
        out=os.path.abspath(a.out or out),
        seeds=a.seeds[:1] if a.calibrate else a.seeds,
        train_flags=" ".join(filter(None, (setting["agent"], a.train_flags))),
        warm_flags=" ".join(filter(None, (setting["agent"], setting["warm"], a.warm_flags))),
    )
    table = {arm_name(f): f for fs in CANDIDATES.values() for f in fs} if a.calibrate else arms()
    unknown, cores = [n for n in a.arms if n not in table], len(os.sched_getaffinity(0))
    own = {
        "seed",
        "model",
        "out_dir",
        "run_name",
        "overwrite",
        "resume",
        "eval_start",
        "checkpoint_every",
    } | {f.name for c in (RolloutConfig, CreditConfig) for f in fields(c)}  # per task or per arm
    taken = [x for x in a.train_flags.split() if x.lstrip("-").removeprefix("no_") in own]
    check(
        a,
        [("jobs threads calibrate_steps", "an integer >= 1", lambda v: v >= 1)],
        [
            (
                a.threads > cores,
                f"--threads {a.threads}: this process may use {cores} cores; pass "
                f"--threads {cores} or fewer (results stored with another: --redo)",
            ),
            (
                bool(a.warmstart) and len(a.seeds) != 1,
                f"--warmstart {a.warmstart!r} is one seed's warm "
                f"start, but --seeds has {len(a.seeds)}",
            ),
            (
                bool(a.warmstart) and not os.path.isdir(a.warmstart),
                f"--warmstart {a.warmstart!r} is not a directory",
            ),
            (bool(unknown), f"--arms: no arm is named {unknown}; the arms are {list(table)}"),
            (bool(taken), f"--train_flags sets {taken}: compare.py sets these per arm or per task"),
        ],
    )
    shared = a.train_flags + (f" --steps {a.calibrate_steps} --eval_every 0" * a.calibrate)
    if not a.calibrate and not parse_train(shared)[0].eval_every:
        raise SystemExit(
            f"--train_flags {a.train_flags!r} turn evaluation off (--eval_every 0); "
            f"the comparison needs it: pass --eval_every K (e.g. 5)"
        )
    return a, {n: table[n] for n in a.arms or table}, shared


# -------------------------------------------------------------------------------------------------
# Tasks: one subprocess each; its result stored with a key, reused while the key matches


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


def run_tasks(tasks: list[Task], a: Args):
    """Run the tasks whose result is missing, a.jobs at once; stop before any if a stored result
    has another key (unless --redo)."""
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


def run_task(t: Task, key: dict, slots: Queue, a: Args):
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


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


# -------------------------------------------------------------------------------------------------
# Tables and the figure; runs: arm name -> one summary per seed, in seed order


def summarize(rows: list[dict], step0: dict, prompts: int) -> dict:
    """One arm on one seed: its evaluation rows by step (step 0: the seed's eval.py row), cumulative
    generated tokens at each step, tool calls in all, and each step metric's mean over the steps."""
    steps = sorted((r for r in rows if "train/loss" in r), key=lambda r: r["step"])
    cum, tokens = 0.0, {0: 0.0}
    for r in steps:
        cum += r["rollout/tokens_per_prompt"] * prompts
        tokens[r["step"]] = cum
    return {
        "evals": {0: step0, **{r["step"]: r for r in rows if "eval/em" in r}},
        "tokens": tokens,
        "calls": sum(r["rollout/tool_calls_per_prompt"] * prompts for r in steps),
        "means": {k: statistics.mean(r[k] for r in steps) for k in steps[0] if k != "step"},
    }


def last(s: dict) -> dict:
    return s["evals"][max(s["evals"])]


def measure(s: dict, name: str) -> float:
    """em: the last evaluation's greedy test EM; multihop: its EM on questions of 2 hops or more
    (as many per hop count: the mean of theirs); any other name: that step metric's mean over the
    run."""
    if name == "em":
        return last(s)["eval/em"]
    if name == "multihop":
        return statistics.mean(
            v for k, v in last(s).items() if k.startswith("eval/em_hop") and k != "eval/em_hop1"
        )
    return s["means"][name]


def mean_std(xs: list[float], fmt: str = ".3f") -> str:
    if len(xs) < 2:
        return f"{xs[0]:{fmt}}"
    return f"{statistics.mean(xs):{fmt}} ± {statistics.stdev(xs):{fmt}}"


ALPHA, POWER = 0.05, 0.8  # every test two-sided at ALPHA; the detectable effect at POWER


@dataclass
class Paired:
    """The seeds' paired differences d = arm - reference of one measure (seed order)."""

    d: list[float]

    @property
    def mean(self) -> float:
        return statistics.mean(self.d)

    @property
    def sd(self) -> float:  # nan for one seed
        return statistics.stdev(self.d) if len(self.d) > 1 else math.nan

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(len(self.d))

    @property
    def p(self) -> float:
        """The paired t-test's two-sided p (t = mean / se, n - 1 degrees of freedom); nan for one
        seed or no spread."""
        if not self.se > 0:
            return math.nan
        return 2 * stats.t.sf(abs(self.mean / self.se), len(self.d) - 1)

    @property
    def mde(self) -> float:
        """Minimum detectable effect: the true mean difference this test finds at ALPHA with
        probability POWER, given the observed sd and seed count."""
        return detectable(len(self.d)) * self.sd / math.sqrt(len(self.d))


def paired(a: list[float], b: list[float]) -> Paired:
    return Paired([x - y for x, y in zip(a, b)])


def detectable(n: int) -> float:
    """The true mean difference, in standard errors, that a two-sided paired t-test on n seeds
    detects at ALPHA with probability POWER: the noncentrality delta where P(|T| > t_crit) = POWER
    for T noncentral t (n - 1 degrees of freedom, delta). 3.761 for 5 seeds (the normal
    approximation t_.975 + t_.80 = 2.776 + 0.941 = 3.717 is 1% short); nan for one seed."""
    if n < 2:
        return math.nan
    df, crit = n - 1, stats.t.ppf(1 - ALPHA / 2, n - 1)
    power = lambda nc: stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc)  # both tails
    return optimize.brentq(lambda nc: power(nc) - POWER, 0.0, 1000.0)


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment of one family's p-values (nan: not a test, not counted): the
    k-th smallest of m is multiplied by m - k + 1, capped at 1 and never below the one before."""
    tests = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    out, floor = [math.nan] * len(ps), 0.0
    for k, (p, i) in enumerate(tests):
        floor = out[i] = max(floor, min(1.0, (len(tests) - k) * p))
    return out


def reading(x: Paired, holm_p: float, fmt: str = ".3f", sign: int = 0) -> str:
    """One line: "higher" / "lower" (or, against a claimed sign, "agrees" / "disagrees") where the
    Holm-adjusted p is below ALPHA; the same "before correction only" where only the raw p is; else
    "inconclusive" with the smallest difference these seeds would detect."""
    if math.isnan(x.p):
        return "no test (one seed or no spread)"
    word = ("higher", "lower")[x.mean < 0]
    if sign:
        word = ("agrees", "disagrees")[x.mean * sign < 0]
    if holm_p < ALPHA:
        return word
    if x.p < ALPHA:
        return f"{word} before correction only"
    return f"inconclusive: would detect ≥ {x.mde:{fmt}}"


def cells(x: Paired, fmt: str = ".3f") -> list[str]:
    """Mean ± standard error, sd, minimum detectable effect, raw p; one seed: the difference."""
    if len(x.d) < 2:
        return [f"{x.mean:+{fmt}} (1 seed)", "-", "-", "-"]
    p = "-" if math.isnan(x.p) else f"{x.p:.3f}"
    return [f"{x.mean:+{fmt}} ± {x.se:{fmt}}", f"{x.sd:{fmt}}", f"{x.mde:{fmt}}", p]


def row(*cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def em_tables(runs: dict[str, list[dict]]) -> list[str]:
    first = next(iter(runs.values()))
    steps, end = sorted(first[0]["evals"]), max(first[0]["evals"])
    hops = sorted(k for k in last(first[0]) if k.startswith("eval/em_hop"))
    out = [f"### Greedy test EM, mean ± std over {len(first)} seed(s) (step 0: warm start)", ""]
    for title, members in GROUPS:
        names = [arm_name(f) for f, _ in members if arm_name(f) in runs]
        if names:
            out += [
                f"**{title}**",
                "",
                row(
                    "arm",
                    *(f"step {t}" for t in steps),
                    *(f"{h[len('eval/em_hop') :]}-hop @ {end}" for h in hops),
                ),
                row(*["---"] * (1 + len(steps) + len(hops))),
            ]
            for arm in names:
                seeds = runs[arm]
                out.append(
                    row(
                        arm,
                        *(mean_std([s["evals"][t]["eval/em"] for s in seeds]) for t in steps),
                        *(mean_std([last(s)[h] for s in seeds]) for h in hops),
                    )
                )
            out.append("")
    return out


def pairs(runs: dict[str, list[dict]]) -> list[tuple[str, str]]:
    """Every (arm, reference) of GROUPS once, both run."""
    every = dict.fromkeys(
        (arm_name(f), arm_name(r)) for _, members in GROUPS for f, refs in members for r in refs
    )
    return [p for p in every if p[0] in runs and p[1] in runs]


SIGNIFICANCE = (
    f"sd: of the seeds' differences; MDE: the difference a two-sided paired t-test on these seeds "
    f"detects at p < {ALPHA} with {POWER:.0%} power, for that sd; p: the paired t-test's; Holm p: "
    f"adjusted over the table's tests (Holm's step-down); arm > ref: seeds where the arm is ahead. "
    f'"higher" / "lower" where the Holm p is below {ALPHA}'
)


def difference_table(runs: dict[str, list[dict]]) -> list[str]:
    first = next(iter(runs.values()))[0]
    steps, end = sorted(first["evals"]), max(first["evals"])
    early = steps[1] if len(steps) > 2 else end  # the first evaluation after step 0
    top = max(int(k[len("eval/em_hop") :]) for k in last(first) if k.startswith("eval/em_hop"))
    picks = [
        (f"EM @ step {early}", lambda s: s["evals"][early]["eval/em"]),
        (f"EM @ step {end}", lambda s: measure(s, "em")),
        (f"multi-hop EM @ step {end}", lambda s: measure(s, "multihop")),
        (f"{top}-hop EM @ step {end}", lambda s: last(s)[f"eval/em_hop{top}"]),
    ]
    out = [
        "### Paired differences, arm − reference on the same seeds: one table per measure, each "
        "its own family of tests",
        "",
        SIGNIFICANCE + ".",
        "",
    ]
    for title, pick in picks:
        diffs = {
            (arm, ref): paired([pick(s) for s in runs[arm]], [pick(s) for s in runs[ref]])
            for arm, ref in pairs(runs)
        }
        adjusted = holm([x.p for x in diffs.values()])
        out += [
            f"**{title}**",
            "",
            row("arm", "reference", "Δ ± se", "sd", "MDE", "p", "Holm p", "arm > ref", "reading"),
            row(*["---"] * 9),
        ]
        for ((arm, ref), x), h in zip(diffs.items(), adjusted):
            ahead = f"{sum(v > 0 for v in x.d)}/{len(x.d)}"
            h_text = "-" if math.isnan(h) else f"{h:.3f}"
            out.append(row(arm, ref, *cells(x), h_text, ahead, reading(x, h)))
        out.append("")
    return out


def claims_table(runs: dict[str, list[dict]]) -> list[str]:
    claims = [
        (claim, arm_name(arm), arm_name(ref), m, sign)
        for claim, arm, ref, m, sign in CLAIMS
        if arm_name(arm) in runs and arm_name(ref) in runs
    ]
    diffs = [
        paired([measure(s, m) for s in runs[arm]], [measure(s, m) for s in runs[ref]])
        for _, arm, ref, m, _ in claims
    ]
    adjusted = holm([x.p for x in diffs])
    out = [
        "### The papers' claims beside ours (EM: at the last evaluation; costs: per step, their "
        "ratio of means in brackets); Holm p over the table's claims; "
        '"agrees" / "disagrees" where the Holm p is below ' + f"{ALPHA}",
        "",
        row("claim", "measure", "ours: arm − reference", "Δ ± se", "MDE", "p", "Holm p", "here"),
        row(*["---"] * 8),
    ]
    for (claim, arm, ref, m, sign), x, h in zip(claims, diffs, adjusted):
        fmt = ".3f" if m in ("em", "multihop") else ".2f"
        delta, _, mde, p = cells(x, fmt)
        if m not in ("em", "multihop"):
            ratio = statistics.mean(measure(s, m) for s in runs[arm]) / statistics.mean(
                measure(s, m) for s in runs[ref]
            )
            delta += f" ({ratio - 1:+.0%})"
        h_text = "-" if math.isnan(h) else f"{h:.3f}"
        out.append(row(claim, m, f"{arm} − {ref}", delta, mde, p, h_text, reading(x, h, fmt, sign)))
    return out + [""]


COST = [
    ("generated tokens / prompt / step", "rollout/tokens_per_prompt", ".0f"),
    ("tool calls / prompt / step", "rollout/tool_calls_per_prompt", ".1f"),
    ("leaves / prompt", "tree/leaves_per_prompt", ".1f"),
    ("trained tokens / step", "train/tokens_trained", ".0f"),
    ("update actions / step", "train/actions_trained", ".0f"),
    ("samples / step", "train/samples", ".0f"),
    ("rollout s", "train/time_rollout", ".2f"),
    ("log-prob s", "train/time_logprob", ".2f"),
    ("update s", "train/time_update", ".2f"),
]


def budget(runs: dict[str, list[dict]], arm: str) -> float:
    """An arm's generated tokens per prompt per step: the mean over its steps and seeds."""
    return statistics.mean(s["means"]["rollout/tokens_per_prompt"] for s in runs[arm])


def cost_table(runs: dict[str, list[dict]], walls: dict[str, list[float]]) -> list[str]:
    target = budget(runs, arm_name(G4)) if arm_name(G4) in runs else math.nan
    out = [
        "### Cost per arm: means over steps and seeds; seconds per RL step split as BranPO's "
        "Table 8",
        "",
        row(
            "arm",
            COST[0][0],
            "vs GRPO G=4",
            *(c[0] for c in COST[1:]),
            "step s",
            "whole run: generated tokens, tool calls",
            "arm wall min",
        ),
        row(*["---"] * (len(COST) + 5)),
    ]
    for arm, seeds in runs.items():
        cells = [f"{statistics.mean(s['means'][k] for s in seeds):{fmt}}" for _, k, fmt in COST]
        step_s = statistics.mean(
            sum(s["means"][f"train/time_{x}"] for x in ("rollout", "logprob", "update"))
            for s in seeds
        )
        total = statistics.mean(s["tokens"][max(s["tokens"])] for s in seeds)
        calls = statistics.mean(s["calls"] for s in seeds)
        vs = "-" if math.isnan(target) else f"{budget(runs, arm) / target - 1:+.0%}"
        out.append(
            row(
                arm,
                cells[0],
                vs,
                *cells[1:],
                f"{step_s:.2f}",
                f"{total / 1000:.1f}k, {calls:.0f}",
                f"{statistics.mean(walls[arm]) / 60:.1f}",
            )
        )
    matched = [
        (n, budget(runs, n) / target - 1)
        for n in map(arm_name, MATCHED.values())
        if n in runs and n != arm_name(G4)
    ]
    if matched and not math.isnan(target):
        out += [
            "",
            f"Matched budget: the target is GRPO G=4's {target:.0f} generated tokens per "
            f"prompt per step; achieved: "
            + "; ".join(f"{n} {d:+.0%}" + " (OUTSIDE ±15%)" * (abs(d) > 0.15) for n, d in matched),
        ]
    return out + [""]


def nominal(flags: str) -> float | None:
    """Tree-GRPO's Table 3 budget in complete trajectories: G for GRPO, M (1 + LN/2) for a tree
    (budget-formula in scripts/credit.py); None for the other methods."""
    r, _ = algo_config(flags)
    if r.algo == "grpo":
        return r.grpo_G
    return tree_grpo_budget(r.tree_M, r.tree_N, r.tree_L)[1] if r.algo == "tree_grpo" else None


def matched_by(arm: str, ref: str) -> str:
    """Which budget definition a pairing matches (arms as flags), in words."""
    (r, _), (r_ref, _) = algo_config(arm), algo_config(ref)
    if r == r_ref:
        return "the same rollout"
    b, b_ref = nominal(arm), nominal(ref)
    words = "generated tokens (±15%, calibrated on the default)"
    if b is not None and b == b_ref:
        words = "Tree-GRPO Table 3: M(1 + LN/2) complete trajectories"
    elif b is not None and b_ref is not None:
        words += f"; M(1 + LN/2) = {b:g}, not {b_ref:g}"
    if r.algo == "treeps":
        trained = r.treeps_train or r.treeps_N
        words += f"; not TreePS-RAG's own (trained paths = group size): {trained} vs {r_ref.grpo_G}"
    return words


BUDGET = [  # (column, metric, format): each as the arm's value and its ratio to the reference's
    ("leaves / prompt", "tree/leaves_per_prompt", ".1f"),
    ("generated tokens / prompt", "rollout/tokens_per_prompt", ".0f"),
    ("trained tokens / step", "train/tokens_trained", ".0f"),
    ("rollout s / step", "train/time_rollout", ".2f"),
]


def budget_table(runs: dict[str, list[dict]]) -> list[str]:
    """The budget sweep's and the matched methods' pairings (GROUPS' first two groups): which
    definition each matches, and what each costs against its reference."""
    flags = arms()
    chosen = dict.fromkeys(
        (arm_name(f), arm_name(r)) for _, members in GROUPS[:2] for f, refs in members for r in refs
    )
    out = [
        "### Budgets: each arm against its reference, means over steps and seeds (ratio in "
        "brackets; seconds on shared cores are noisy)",
        "",
        row("arm", "reference", "matched by", "nominal budget", *(c[0] for c in BUDGET)),
        row(*["---"] * (4 + len(BUDGET))),
    ]
    for arm, ref in (p for p in chosen if p[0] in runs and p[1] in runs):
        b, b_ref = nominal(flags[arm]), nominal(flags[ref])
        mean = {
            n: {k: statistics.mean(s["means"][k] for s in runs[n]) for _, k, _ in BUDGET}
            for n in (arm, ref)
        }
        out.append(
            row(
                arm,
                ref,
                matched_by(flags[arm], flags[ref]),
                "-" if b is None or b_ref is None else f"{b:g} vs {b_ref:g}",
                *(
                    f"{mean[arm][k]:{fmt}} ({mean[arm][k] / mean[ref][k] - 1:+.0%})"
                    for _, k, fmt in BUDGET
                ),
            )
        )
    return out + [""]


def figure(runs: dict[str, list[dict]], path: str):
    """Test EM against step (left) and cumulative generated tokens (right), a row per group, a line
    per arm (mean over seeds), the seeds' min-max as a band."""
    groups = [(t, [arm_name(f) for f, _ in m if arm_name(f) in runs]) for t, m in GROUPS]
    groups = [(t, names) for t, names in groups if names]
    fig = Figure(figsize=(11, 3.2 * len(groups)))
    for axes, (title, names) in zip(fig.subplots(len(groups), 2, squeeze=False), groups):
        for i, arm in enumerate(names):
            steps = sorted(runs[arm][0]["evals"])
            em = [[s["evals"][t]["eval/em"] for s in runs[arm]] for t in steps]  # [step][seed]
            tokens = [statistics.mean(s["tokens"][t] for s in runs[arm]) / 1000 for t in steps]
            for ax, x in zip(axes, (steps, tokens)):
                ax.plot(x, [statistics.mean(e) for e in em], "o-", ms=3, color=f"C{i}", label=arm)
                ax.fill_between(
                    x, [min(e) for e in em], [max(e) for e in em], color=f"C{i}", alpha=0.15
                )
        axes[0].set_title(title, fontsize=8, loc="left")
        axes[0].set(xlabel="RL step", ylabel="greedy test EM")
        axes[1].set(xlabel="generated tokens, cumulative (thousands)")
        axes[0].legend(fontsize=7)
        for ax in axes:
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def calibration_table(rows: dict[str, list[dict]], steps: int) -> list[str]:
    """Each candidate's generated tokens per prompt per step against GRPO G=4's (rows: flags ->
    its run's metrics rows)."""
    rows = {f: [r for r in rs if "train/loss" in r] for f, rs in rows.items()}
    mean = {
        f: statistics.mean(r["rollout/tokens_per_prompt"] for r in rs) for f, rs in rows.items()
    }
    if G4 not in rows:
        raise SystemExit("--calibrate measures against GRPO G=4: add it to --arms")
    out = [
        f"### Calibration: generated tokens per prompt per step, {steps} RL steps from the warm "
        f"start",
        "",
        row(
            "method",
            "knobs",
            "per step",
            "mean",
            "vs GRPO G=4",
            "within ±15%",
            "s / step",
            "committed",
        ),
        row(*["---"] * 8),
    ]
    for algo, candidates in CANDIDATES.items():
        for f in (f for f in candidates if f in rows):
            ratio = mean[f] / mean[G4] - 1
            step_s = statistics.mean(
                sum(r[f"train/time_{x}"] for x in ("rollout", "logprob", "update")) for r in rows[f]
            )
            out.append(
                row(
                    algo,
                    arm_name(f),
                    ", ".join(f"{r['rollout/tokens_per_prompt']:.0f}" for r in rows[f]),
                    f"{mean[f]:.0f}",
                    f"{ratio:+.0%}",
                    "yes" if abs(ratio) <= 0.15 else "no",
                    f"{step_s:.1f}",
                    "yes" * (MATCHED[algo] == f),
                )
            )
    return out + [""]


# -------------------------------------------------------------------------------------------------


def merge(paths: list[str], setting: str | None) -> tuple[dict, list[int], str, dict, dict, str]:
    """Several results.json files as one run, seeds in order: their setting (`setting`'s; None:
    any), shared flags and arms must agree and no seed may repeat. Returns what main() writes, and
    where it came from."""
    parts = [json.load(open(p)) for p in paths]
    first, seeds = parts[0], [s for p in parts for s in p["seeds"]]
    keys = ("setting", "world flags", "warm start flags", "train_flags")
    problems = [
        f"{path}: {k} {p.get(k)!r}, not {first.get(k)!r} as in {paths[0]}"
        for path, p in zip(paths, parts)
        for k in keys
        if p.get(k) != first.get(k)
    ] + [
        f"{path}: arms {sorted(p['runs'])}, not {sorted(first['runs'])} as in {paths[0]}"
        for path, p in zip(paths, parts)
        if sorted(p["runs"]) != sorted(first["runs"])
    ]
    if setting is not None and first.get("setting", "default") != setting:
        problems.append(
            f"the files hold setting {first.get('setting', 'default')!r}: pass --setting"
        )
    if len(set(seeds)) < len(seeds):
        problems.append(f"a seed is in two files (seeds {seeds})")
    if problems:
        raise SystemExit(
            "--merge: the files do not make one run (nothing was written):\n  "
            + "\n  ".join(problems)
        )
    order = sorted(range(len(seeds)), key=seeds.__getitem__)

    def steps(d: dict) -> dict:  # JSON made the steps strings
        return {int(k): v for k, v in d.items()}

    runs, walls = {}, {}
    for n in first["runs"]:
        summaries = [s for p in parts for s in p["runs"][n]]
        runs[n] = [
            {**s, "evals": steps(s["evals"]), "tokens": steps(s["tokens"])}
            for s in map(summaries.__getitem__, order)
        ]
        wall = [w for p in parts for w in p["walls"][n]]
        walls[n] = [wall[i] for i in order]
    named = {k: first[k] for k in keys[:3] if k in first}
    source = "; ".join(
        f"seed{'s' * (len(p['seeds']) > 1)} {', '.join(map(str, p['seeds']))} from {path} (commit "
        f"{p.get('commit', 'not recorded')})"
        for path, p in zip(paths, parts)
    )
    return named, sorted(seeds), first["train_flags"], runs, walls, source


def render(named: dict, seeds: list[int], train_flags: str, runs: dict, walls: dict, how: str):
    """Every table as results.md holds it: a function of results.json's contents alone."""
    return "\n".join(
        em_tables(runs)
        + difference_table(runs)
        + claims_table(runs)
        + cost_table(runs, walls)
        + budget_table(runs)
        + [
            "".join(f"{k} {v!r}; " for k, v in named.items())
            + f"Seeds {', '.join(map(str, seeds))}; {len(runs)} arms; shared train.py "
            f"flags {train_flags!r}; {how}"
        ]
    )


def write_report(
    out: str, named: dict, seeds: list[int], train_flags: str, runs: dict, walls: dict, how: str
) -> str:
    """Every table, the figure and results.json in `out`; the tables' text."""
    text = render(named, seeds, train_flags, runs, walls, how)
    os.makedirs(out, exist_ok=True)
    outputs = [os.path.join(out, f) for f in ("results.md", "curves.png", "results.json")]
    figure(runs, outputs[1])
    with open(outputs[2], "w") as f:
        json.dump(
            {
                **named,
                "seeds": seeds,
                "train_flags": train_flags,
                "commit": commit(),
                "how": how,
                "runs": runs,
                "walls": walls,
            },
            f,
            indent=1,
        )
    with open(outputs[0], "w") as f:
        f.write(text + "\n")
    return text + "\n\noutputs: " + ", ".join(outputs)


def report_file(path: str, out: str) -> str:
    """The tables and the figure again from one results.json (a run's or a --merge's), in `out`:
    results.md byte for byte as the run wrote it (its provenance line is stored in the file)."""
    (named, seeds, train_flags, runs, walls, _), stored = merge([path], None), json.load(open(path))
    how = stored.get("how") or f"from {path} (commit {stored.get('commit', 'not recorded')})."
    text = render(named, seeds, train_flags, runs, walls, how)
    os.makedirs(out, exist_ok=True)
    outputs = [os.path.join(out, f) for f in ("results.md", "curves.png")]
    figure(runs, outputs[1])
    with open(outputs[0], "w") as f:
        f.write(text + "\n")
    return text + "\n\noutputs: " + ", ".join(outputs)


def main(a: Args):
    a, chosen, shared = configure(a)
    if a.report:
        print("\n" + report_file(a.report, a.out))
        return
    if a.merge:
        *merged, source = merge(a.merge, a.setting)
        print("\n" + write_report(a.out, *merged, f"merged by --merge: {source}."))
        return
    cfg, _, _, agent, retriever_cfg, _ = parse_train(shared)
    home = {s: os.path.join(a.out, f"seed{s}") for s in a.seeds}
    world_flags = SETTINGS[a.setting]["world"]  # a world of other flags: another directory
    world_cfg = parse(data.WorldConfig, args=world_flags.split())[0]
    where = "world" + f"-{slug(world_flags)}" * bool(world_flags)
    named = {"setting": a.setting, "world flags": world_flags, "warm start flags": a.warm_flags}
    named = named if world_flags else {}  # the default's outputs name no setting
    world = {s: data.ensure_world(os.path.join(home[s], where), world_cfg) for s in a.seeds}
    warm = {
        s: os.path.abspath(a.warmstart) if a.warmstart else os.path.join(home[s], "warmstart")
        for s in a.seeds
    }

    # ---- the warm starts; then the step-0 evaluations and the arms (their keys hash the weights)
    warm_tasks = [
        Task(
            f"seed {s} warm start",
            "train.py",
            ["warmstart", "--seed", str(s), *a.warm_flags.split()],
            ["--out", warm[s], "--world", world[s]],
            home[s],
            "warmstart",
            world=world_flags,
        )
        for s in a.seeds
        if not a.warmstart
    ]
    run_tasks(warm_tasks, a)
    evals, runs = {}, {}
    for s in a.seeds:
        report = os.path.join(home[s], "logs", "step0.json")
        if not a.calibrate:
            evals[s] = Task(
                f"seed {s} step 0",
                "eval.py",
                [
                    "--split",
                    "test",
                    "--n",
                    str(cfg.eval_n),
                    *changed(agent),
                    *changed(retriever_cfg),
                ],
                [
                    "--model",
                    warm[s],
                    "--data",
                    world[s],
                    "--corpus",
                    os.path.join(world[s], "corpus.jsonl"),
                    "--out",
                    report,
                ],
                home[s],
                "step0",
                warm=warm[s],
                report=report,
                world=world_flags,
            )
        for name, knobs in chosen.items():
            run = f"calibrate{a.calibrate_steps}-" * a.calibrate + slug(name)
            flags = [
                "--seed",
                str(s),
                *shared.split(),
                *knobs.split(),
                "--no_eval_start",
                "--checkpoint_every",
                "0",
            ]
            parse_train(" ".join(flags))  # every arm's flags checked before anything runs
            runs[name, s] = Task(
                f"seed {s} {name}",
                "train.py",
                flags,
                ["--model", warm[s], "--out_dir", home[s], "--run_name", run, "--overwrite"]
                + ["--data", world[s], "--corpus", os.path.join(world[s], "corpus.jsonl")]
                * bool(world_flags),  # else train.py reads OUT/seedS/world, the default's
                home[s],
                run,
                warm=warm[s],
                steps=cfg.steps,
                metrics=os.path.join(home[s], "runs", run, "metrics.jsonl"),
                world=world_flags,
            )
    run_tasks([*evals.values(), *runs.values()], a)

    # ---- outputs
    if a.calibrate:
        rows = {chosen[n]: load(runs[n, a.seeds[0]])["rows"] for n in chosen}
        text = "\n".join(calibration_table(rows, a.calibrate_steps))
        path = os.path.join(a.out, f"calibration-{a.calibrate_steps}-steps.md")
        with open(path, "w") as f:
            f.write(text + "\n")
        print("\n" + text + "\n\noutputs: " + path)
        return
    summaries = {
        n: [
            summarize(load(runs[n, s])["rows"], load(evals[s])["rows"][0], cfg.prompts_per_step)
            for s in a.seeds
        ]
        for n in chosen
    }
    walls = {n: [load(runs[n, s])["wall_s"] for s in a.seeds] for n in chosen}
    spent = {
        kind: sum(load(t)["wall_s"] for t in tasks) / 60
        for kind, tasks in (
            ("warm starts", warm_tasks),
            ("step-0 evaluations", evals.values()),
            ("arms", runs.values()),
        )
    }
    how = (
        f"commit {commit()}. Wall time of the stored tasks as they ran (--jobs {a.jobs}, "
        f"--threads {a.threads}): "
        + ", ".join(f"{k} {v:.1f} min" for k, v in spent.items())
        + f"; {sum(spent.values()) / 60:.2f} h in all."
    )
    print("\n" + write_report(a.out, named, a.seeds, a.train_flags, summaries, walls, how))


if __name__ == "__main__":
    main(parse(Args)[0])
