"""Which credit assignment learns more, at which rollout budget? The five methods and Tree-GRPO's
budget sweep side by side over seeds, each arm a train.py run from the same warm start.

    python benchmarks/compare.py --jobs 2       # seeds 0-4, every arm, two at once:
                                                # docs/comparison.md
    python benchmarks/compare.py --calibrate    # generated tokens / prompt / step of knob choices
    python benchmarks/compare.py --quick        # one seed, two arms, 2 steps, a tiny warm start
    python benchmarks/compare.py --setting hard # the same in a harder world (SETTINGS), in
                                                # out/compare-hard
    python benchmarks/compare.py --setting hard --merge A/results.json B/results.json
                                                # one report over both files' seeds
    python benchmarks/compare.py --report docs/comparison_hard.json
                                                # its results.md again, byte for byte
    python benchmarks/compare.py --setting hard --arms matched --train_flags="" --seeds 5 6
                                                # more seeds to --merge (docs/comparison.md)

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
what differs (--redo recomputes those tasks instead). One sitting at a time per OUT (it holds
OUT/compare.lock). SIGTERM or Ctrl-C stops a sitting: each running arm finishes its step and saves
a checkpoint, which the same command, run again, resumes; a sitting killed outright (SIGKILL) takes
its tasks down with it, and no sitting touches an arm's run directory while a train.py holds it
(compare_tasks.py).

Threads: each task runs pinned to --threads cores (its CPU affinity, which train.py's torch threads
follow, and OMP_NUM_THREADS) whatever --jobs is, so the figures do not depend on --jobs. One thread
by default: on shared cores a second one made the tiny model 5-15x slower (docs/comparison.md).

Outputs in OUT: results.md (every table, also printed), results.json (every seed's numbers),
curves.png (test EM against step and against cumulative generated tokens, one line per arm, the
seeds' min-max as a band); --calibrate writes calibration-STEPS-steps.md. --merge writes the three
from several sittings' results.json files (their seeds in one report; each summary as stored);
--report writes results.md and curves.png from one. Each evaluation's per-question outcomes stay in
the run directories (runs/ARM/eval_stepN.jsonl; step 0's in logs/step0.json).

The arms, the groups and families each table compares, the claims and the settings:
compare_arms.py; the tasks (their keys, processes and results): compare_tasks.py; the tables and
figure: compare_report.py; the statistics (paired t, interval, equivalence, pooled sd, detectable
effect, Holm, Dunnett): compare_stats.py.
"""

import os
import statistics
import sys
from dataclasses import dataclass, field, fields, replace
from typing import Literal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import train  # noqa: E402  (the project's modules, from the repository root)
from advantages import CreditConfig  # noqa: E402
from benchmarks.compare_arms import (  # noqa: E402
    CANDIDATES,
    G4,
    MATCHED,
    QUICK_ARMS,
    SETS,
    SETTINGS,
    arm_name,
    arm_prompts,
    arms,
    slug,
)
from benchmarks.compare_report import (  # noqa: E402
    commit,
    merge,
    refuse_overwrite,
    report_file,
    row,
    summarize,
    write_report,
)
from benchmarks.compare_tasks import Sitting, Task, load, run_tasks  # noqa: E402
from infra import data, files  # noqa: E402
from infra.flags import check, parse  # noqa: E402
from infra.warmstart import WarmConfig  # noqa: E402
from retriever import RetrieverConfig  # noqa: E402
from rollout import AgentConfig, RolloutConfig  # noqa: E402

# -------------------------------------------------------------------------------------------------
# Flags


@dataclass
class Args:
    """What to run; every arm's shared settings are train.py's defaults and --train_flags."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    """Seeds: each its own warm start, every arm trained from it."""
    arms: list[str] = field(default_factory=list)
    """Only these arms (names as the tables print them, e.g. "GRPO G=4", or a set's: "matched",
    the five methods at GRPO G=4's budget; "later", the later ones (IGPO and MT-GRPO among them);
    "ceiling", VinePPO's two); empty = every arm."""
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
    """CPU cores and torch threads per task (docs/comparison.md: why 1); in every result's key."""
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
    if not a.calibrate:  # a set's name (SETS) stands for its arms
        named = [[arm_name(f) for f in SETS[x]] if x in SETS else [x] for x in a.arms]
        a = replace(a, arms=list(dict.fromkeys(n for names in named for n in names)))
    unknown, cores = [n for n in a.arms if n not in table], len(os.sched_getaffinity(0))
    own = set("seed model out_dir run_name overwrite resume eval_start checkpoint_every".split())
    own |= {f.name for c in (RolloutConfig, CreditConfig) for f in fields(c)}  # per task or per arm
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
            (
                bool(unknown),
                f"--arms: no arm is named {unknown}; the arms are {list(table)}, the sets "
                f"{list(SETS) * (not a.calibrate)}",
            ),
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


def calibration_table(rows: dict[str, list[dict]], steps: int, prompts: int) -> list[str]:
    """Each candidate's generated tokens per prompt per step (rows: flags -> its run's metrics
    rows) and its tokens per step against GRPO G=4's: the same ratio, unless the candidate sets
    its own prompts per step (`arm_prompts`; the others have the shared `prompts`)."""
    rows = {f: [r for r in rs if "train/loss" in r] for f, rs in rows.items()}
    mean = {
        f: statistics.mean(r["rollout/tokens_per_prompt"] for r in rs) for f, rs in rows.items()
    }
    step = {f: m * (arm_prompts(f) or prompts) for f, m in mean.items()}  # tokens per step
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
            ratio = step[f] / step[G4] - 1
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
                    "yes" * (MATCHED.get(algo) == f),
                )
            )
    return out + [""]


def main(a: Args):
    a, chosen, shared = configure(a)
    if a.report:
        print("\n" + report_file(a.report, a.out))
        return
    if a.merge:
        *merged, source = merge(a.merge, a.setting)
        refuse_overwrite(a.out, a.merge, merging=True)
        print("\n" + write_report(a.out, *merged, f"merged by --merge: {source}."))
        return
    # one sitting per --out, before anything is written there: a second one would rewrite the
    # running arms' logs and delete their metrics (the lock lasts while this process does)
    os.makedirs(a.out, exist_ok=True)
    lock = files.hold_lock(  # noqa: F841 (held while main runs)
        os.path.join(a.out, "compare.lock"), f"the comparison folder {a.out} (--out)"
    )
    sitting = Sitting(a.out)  # SIGTERM, Ctrl-C: passed on to the running tasks (compare_tasks.py)
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
    run_tasks(warm_tasks, a, sitting)
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
                ["--model", warm[s], "--out_dir", home[s], "--run_name", run]
                + ["--data", world[s], "--corpus", os.path.join(world[s], "corpus.jsonl")]
                * bool(world_flags),  # else train.py reads OUT/seedS/world, the default's
                home[s],
                run,
                warm=warm[s],
                steps=cfg.steps,
                run=os.path.join(home[s], "runs", run),  # --overwrite or --resume: run_task
                world=world_flags,
            )
    run_tasks([*evals.values(), *runs.values()], a, sitting)

    # ---- outputs
    if a.calibrate:
        rows = {chosen[n]: load(runs[n, a.seeds[0]])["rows"] for n in chosen}
        text = "\n".join(calibration_table(rows, a.calibrate_steps, cfg.prompts_per_step))
        path = os.path.join(a.out, f"calibration-{a.calibrate_steps}-steps.md")
        with open(path, "w") as f:
            f.write(text + "\n")
        print("\n" + text + "\n\noutputs: " + path)
        return
    summaries = {
        n: [
            summarize(
                load(runs[n, s])["rows"],
                load(evals[s])["rows"][0],
                arm_prompts(chosen[n]) or cfg.prompts_per_step,  # VinePPO's budget arm: its own
            )
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
