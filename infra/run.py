"""A training run's bookkeeping: its flags checked (the rules of train.py's Args), its start and end
over one or several processes, its directory and lock, configuration, metrics, learning curves,
checkpoints (saved, and resumed from) and the signals that stop it. train.py calls these; its flags
(`args`: train.py's Args) and what the run holds (engine, model, agent counters) are passed in.
"""

import contextlib
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
from dataclasses import asdict
from pathlib import Path

import accelerate.utils
import torch
from accelerate.commands.config import default_config_file
from matplotlib.figure import Figure

from infra import engines, files, flags, health, loaders, policy, rundir, search, shard, warmstart

TRACKERS = {
    n: getattr(accelerate.utils, f"is_{n}_available")
    for n in (  # --log_with n: its check
        "tensorboard",
        "wandb",
        "mlflow",
        "comet_ml",
        "aim",
        "clearml",
        "dvclive",
        "swanlab",
        "trackio",
    )
}  # that the package (pip install n) imports, as accelerate checks it


# --------------------------------------------------------------------------------------------------
# train.py's flags, checked right after parsing, before any file or model is read

RULES = [  # flags.check: (flags of train.py's Args, what is allowed, test)
    (
        "steps prompts_per_step ppo_mini_batches ppo_epochs micro_batch_size eval_n "
        "env_error_patience",
        "an integer >= 1",
        lambda v: v >= 1,
    ),
    ("warmup_steps eval_every checkpoint_every seed", "an integer >= 0", lambda v: v >= 0),
    ("seed", "below 2**32 (numpy's seeds are 32-bit)", lambda v: v < 2**32),
    ("lr grad_clip", "> 0", lambda v: v > 0),
    ("clip_high kl_coef tis_cap", ">= 0", lambda v: v >= 0),
    ("clip_low", "in [0, 1)", lambda v: 0 <= v < 1),
    ("dual_clip", "0 (off) or > 1", lambda v: v == 0 or v > 1),
    ("vllm_gpu_memory_utilization", "in (0, 1]", lambda v: 0 < v <= 1),
    ("max_env_error_rate", "in [0, 1]", lambda v: 0 <= v <= 1),
    ("run_name", "a name: no '/', not '.' or '..'", lambda v: not rundir.bad_name(v)),
]


def validate(args, configs, rules, depth):
    """Every flag of train.py (`args`; `configs`: its other dataclasses) against RULES, `rules`
    (the top-level modules', passed in), engines' and warmstart's, and the rules that tie flags
    together (`depth`: tree.depth_rule's (broken?, message)); one message lists all broken."""
    warm = next(c for c in configs if isinstance(c, warmstart.WarmConfig))
    one_file = args.data.endswith((".parquet", ".jsonl", ".json"))
    no_model = policy.model_problem(args.model, args.gguf_file) if args.model else ""
    ranks = int(os.environ.get("WORLD_SIZE", "1"))  # the processes `accelerate launch` starts
    no_dir = rundir.unwritable(args.out_dir)
    no_corpus = args.corpus and search.corpus_problem(args.corpus)
    sources = [("data", args.data, "train"), ("test_data", args.test_data, "test")]
    if args.eval_every and not args.test_data and os.path.isdir(args.data):
        sources.append(("data", args.data, "test"))  # the evaluations' questions
    no_data = [
        f"--{flag} {value!r}: {problem}"
        for flag, value, split in sources
        if value and (problem := loaders.source_problem(value, split))
    ]
    flags.check(
        (args, *configs),
        RULES + rules + engines.RULES + warmstart.RULES,
        [
            (
                args.eval_every and one_file and not args.test_data,
                f"--data {args.data!r} is one file and --test_data is empty: evaluation would "
                "score the training questions; pass --test_data FILE, or --eval_every 0",
            ),
            (
                one_file and os.path.realpath(args.test_data) == os.path.realpath(args.data),
                f"--test_data {args.test_data!r} is the --data file: evaluation would score the "
                "training questions; pass a test file",
            ),
            depth,
            (
                args.resume and args.overwrite,
                "--resume and --overwrite contradict each other: pick one",
            ),
            (
                args.gguf_file and not args.model,
                f"--gguf_file {args.gguf_file!r} needs --model, the directory holding it",
            ),
            warmstart.steps_rule(warm),
            (
                args.log_with and not (args.log_with in TRACKERS and TRACKERS[args.log_with]()),
                f"--log_with {args.log_with}: the {args.log_with!r} package is not installed, so "
                f"nothing would reach that tracker; pip install {args.log_with}, or drop "
                "--log_with (metrics.jsonl and the console always log)",
            ),
            (no_model, no_model),
            (
                args.prompts_per_step % ranks,
                f"--prompts_per_step {args.prompts_per_step} does not split over the {ranks} "
                f"processes (each rolls out prompts_per_step / {ranks} of every step's prompts); "
                f"pass a multiple of {ranks}",
            ),
            (no_dir, no_dir),
            (no_corpus, f"--corpus {args.corpus!r}: {no_corpus}"),
            *((True, problem) for problem in no_data),
        ],
    )


# --------------------------------------------------------------------------------------------------
# Metrics: the log, the run's last word, learning curves, the stop on retrieval errors


def log(row: dict, history: list[dict], run_dir: str, accelerator, args):
    """Append a row to the history; rank 0 also writes it to metrics.jsonl, the trackers and
    curve.png (a failed write, e.g. on a full disk, names the file and what to do)."""
    history.append(row)
    if accelerator.is_main_process:
        metrics, curve = os.path.join(run_dir, "metrics.jsonl"), os.path.join(run_dir, "curve.png")
        full = "if it is full, free space, then --resume: from the last checkpoint (intact), if any"
        with files.failure_named(metrics, full), open(metrics, "a") as f:
            f.write(json.dumps(row) + "\n")
        if args.log_with:
            accelerator.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
        with files.failure_named(curve, full):
            plot_curves({"": history}, curve)


def summary(history: list[dict], seconds: dict[str, float], wall: float, run_dir: str) -> str:
    """The run's last word: test EM before -> after RL (per hop), the wall time per stage, where the
    outputs are."""
    evals = [h for h in history if "eval/em" in h]
    times = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
    where = f"outputs in {run_dir} (metrics.jsonl, curve.png, final/)" + health.warnings(history)
    if len(evals) < 2:
        return (
            f"done in {wall / 60:.1f} min ({times}); no evaluation before and after RL "
            f"(--eval_every 0); {where}"
        )
    a, b = evals[0], evals[-1]
    gain = b["eval/em"] - a["eval/em"]
    hops = ", ".join(
        f"{k[len('eval/em_hop') :]}-hop {a[k]:.2f} -> {b[k]:.2f}"
        for k in a
        if k.startswith("eval/em_hop")
    )
    # se: the standard error of the gain
    se = math.sqrt(sum(e["eval/em"] * (1 - e["eval/em"]) / max(e["eval/n"], 1) for e in (a, b)))
    verdict = (
        "RL improved the policy"
        if gain > 2 * se
        else "RL made the policy WORSE"
        if gain < -2 * se
        else f"NO clear change from RL (the gain is within 2 standard errors, {2 * se:.3f})"
    )
    return (
        f"done: {verdict}: test EM {a['eval/em']:.3f} (step {a['step']}) -> {b['eval/em']:.3f} "
        f"(step {b['step']}), {gain:+.3f} on {b['eval/n']:.0f} questions"
        + (f" ({hops})" if hops else "")
        + f"; {wall / 60:.1f} min ({times}); {where}"
    )


def plot_curves(
    runs: dict[str, list[dict]], path: str, keys=("rollout/reward", "rollout/em", "eval/em")
):
    """Learning curves, one colour per run ({label: metrics rows}): rollout reward (line) and EM
    (dotted), eval EM."""
    fig = Figure(figsize=(6 + (len(runs) > 1), 3.5))
    ax = fig.subplots()
    styles = {"rollout/reward": "-", "rollout/em": ":", "eval/em": "o--"}
    for i, (name, history) in enumerate(runs.items()):
        for key in keys:
            pts = [(h["step"], h[key]) for h in history if key in h]
            if pts:
                ax.plot(*zip(*pts), styles[key], color=f"C{i}", label=f"{name} {key}".strip())
    ax.set_xlabel("step")
    ax.legend(fontsize=6 if len(runs) > 1 else None, ncol=1 + (len(runs) > 1))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    files.write_files({path: lambda tmp: fig.savefig(tmp, dpi=100, format="png")})  # whole or not


def check_env_errors(history: list[dict], args, where: str) -> bool:
    """Stop the run when the share of trajectories lost to retrieval errors stayed above
    --max_env_error_rate for --env_error_patience steps in a row: it would train on almost nothing
    while looking like a model that fails. Returns whether the last step was degraded so (said on
    the console): train.py saves no checkpoint of it, so a --resume after an outage goes on from
    the last step before it and runs the degraded ones again."""
    rows = [row for row in history if "abnormal/env_error" in row]
    degraded = bool(rows) and rows[-1]["abnormal/env_error"] > args.max_env_error_rate
    if degraded and accelerate.PartialState().is_main_process:
        print(
            f"step {rows[-1]['step']}: {rows[-1]['abnormal/env_error']:.0%} of its trajectories "
            f"lost to retrieval errors ({where}), above --max_env_error_rate "
            f"{args.max_env_error_rate}: not checkpointed",
            flush=True,
        )
    rates = [row["abnormal/env_error"] for row in rows][-args.env_error_patience :]
    if len(rates) == args.env_error_patience and min(rates) > args.max_env_error_rate:
        raise SystemExit(
            f"stopping: abnormal/env_error above --max_env_error_rate {args.max_env_error_rate} "
            f"for {len(rates)} steps in a row ({', '.join(f'{r:.2f}' for r in rates)}): the "
            f"retriever ({where}) is failing; fix it, then rerun with --resume: it goes on from "
            "the last checkpoint before the outage (no step above the rate is checkpointed) and "
            "runs the degraded steps again"
        )
    return degraded


# --------------------------------------------------------------------------------------------------
# The run directory: one writer (run.lock), never overwritten by accident, resumable after a kill


def claim_run_dir(run_dir: str, args):
    """Lock run_dir and refuse a run already there unless --resume or --overwrite (deletes all but
    the lock, later: rundir.clear_old_run) says what to do. Returns the open run.lock ("PID HOST";
    files.hold_lock), held until the process ends."""
    os.makedirs(run_dir, exist_ok=True)
    lock = files.hold_lock(os.path.join(run_dir, "run.lock"), run_dir)
    swapped = files.finish_swap(os.path.join(run_dir, "final"))  # under the lock: no one writes it
    if swapped:
        print(swapped)
    held = sorted(
        n
        for n in os.listdir(run_dir)
        if n in ("latest", "final")
        or n.startswith("checkpoint-")
        or (n == "metrics.jsonl" and os.path.getsize(os.path.join(run_dir, n)))
    )
    if held and not (args.resume or args.overwrite):
        raise SystemExit(
            f"{run_dir} already holds a run ({', '.join(held)}); pass --resume to continue it, "
            f"--overwrite to delete it and start fresh, or --run_name NAME for a new run"
        )
    if args.resume and held and "latest" not in held:
        print(
            f"resume: no checkpoint in {run_dir} yet; starting from step 0 (the metrics logged so "
            "far are dropped)"
        )
    return lock


def save_config(run_dir: str, whole: dict, classes, name: str = "config.json"):
    """Write the run's whole configuration (`whole`: flag -> value, and rundir.recorded's) to
    run_dir/config.json (`name`) and print the flags that differ from the defaults of `classes`
    (the run's flag dataclasses)."""
    files.write_json(Path(run_dir, name), whole, indent=1)
    default = {k: v for c in classes for k, v in asdict(c()).items()}
    changed = " ".join(
        rundir.flag(k, v) for k, v in whole.items() if k in default and v != default[k]
    )
    print(f"config: {run_dir}/config.json; not the defaults: {changed or 'none'}")


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.jsonl: a missing file is empty, and a torn last line (a kill in the
    middle of a write) is dropped, each with a note; any other line that is not JSON raises."""
    if not os.path.exists(path):
        print(
            f"resume: {path} is missing; the checkpoint is intact, the metrics before it are lost"
        )
        return []
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines):
                raise ValueError(
                    f"{path}: line {i} is not JSON ({line[:80]!r}); only a last line may be torn "
                    "by a kill: fix or delete that line, then --resume"
                ) from None
            print(f"resume: dropped the torn last line of {path} ({line[:40]!r})")
    return rows


def save_checkpoint(accelerator, run_dir: str, step: int, state: dict, main_proc: bool, parts):
    """Save checkpoint-STEP (accelerate state + trainer_state.json, which records every file's
    size; `parts`: the model, optimizer and scheduler, shard.save_state's), point `latest` at it,
    then delete the checkpoints before the previous one. `latest` moves
    only once the new checkpoint is complete (os.replace is atomic), so a run killed or out of disk
    space while saving resumes from the previous checkpoint, never a torn one; and the previous one
    stays, for `load_checkpoint` to fall back to."""
    name, latest = f"checkpoint-{step}", Path(run_dir, "latest")
    path = os.path.join(run_dir, name)
    previous = latest.read_text().strip() if latest.exists() else ""
    accelerator.wait_for_everyone()
    try:
        shard.save_state(accelerator, *parts, path)
        accelerator.wait_for_everyone()  # every rank's files are written
        if main_proc:
            sizes = {
                f: os.path.getsize(os.path.join(path, f))
                for f in sorted(os.listdir(path))
                if f != "trainer_state.json"
            }
            Path(path, "trainer_state.json").write_text(json.dumps({**state, "files": sizes}))
            files.write_text(latest, name)
    except (OSError, RuntimeError) as e:
        # torch reports a full disk as RuntimeError("... file write failed")
        shutil.rmtree(path, ignore_errors=True)  # the torn checkpoint: only frees space
        free_mib = shutil.disk_usage(run_dir).free / 2**20
        raise OSError(
            f"writing {name} failed ({type(e).__name__}: {e}); {free_mib:.0f} MiB free on the "
            f"disk holding {run_dir}: if it is full, free space, then --resume continues from "
            f"{previous or 'step 0 (no checkpoint yet)'} (`latest` is unchanged)"
        ) from e
    # only now delete the older ones (Accelerate's ProjectConfiguration(total_limit=...) is not
    # used: it deletes the oldest checkpoint before writing the new one, so a failed save could
    # leave none)
    if main_proc:
        for old in os.listdir(run_dir):
            if old.startswith("checkpoint-") and old not in (name, previous):
                shutil.rmtree(os.path.join(run_dir, old))


def checkpoint_problem(path: str) -> str:
    """What makes the checkpoint directory `path` unreadable, found without loading it:
    trainer_state.json missing or not JSON, a file missing or not the size it was saved with; empty
    when nothing is found."""
    try:
        files = json.loads(Path(path, "trainer_state.json").read_text()).get("files", {})
    except (OSError, ValueError) as e:
        return f"trainer_state.json cannot be read ({type(e).__name__}: {e})"
    for f, saved in files.items():
        size = os.path.getsize(Path(path, f)) if Path(path, f).exists() else None
        if size != saved:
            return (
                f"{f} is missing"
                if size is None
                else f"{f} has {size} bytes, {saved} when saved (truncated or overwritten)"
            )
    return ""


def load_checkpoint(accelerator, run_dir: str, parts) -> dict | None:
    """Restore the state (`parts`: model, optimizer, scheduler; the RNGs) of the checkpoint `latest`
    names and return its trainer_state.json; None when the run has no checkpoint yet. An unreadable
    checkpoint is named with its problem, and the one before it is loaded instead (`latest` then
    names that one); with none left, the run stops, saying what to do."""
    latest = Path(run_dir, "latest")
    if not latest.exists():
        return None
    newest = latest.read_bytes().decode(errors="replace").strip()
    step_of = lambda name: int(name.removeprefix("checkpoint-"))
    named = re.fullmatch(r"checkpoint-\d+", newest)
    if not named:  # empty or garbage (a damaged disk, an edit): every checkpoint is a candidate
        accelerator.print(
            f"resume: {latest} holds {newest[:40]!r}, not a checkpoint's name; falling back to "
            "the newest readable checkpoint"
        )
    names = sorted(
        (
            n
            for n in os.listdir(run_dir)
            if re.fullmatch(r"checkpoint-\d+", n) and (not named or step_of(n) <= step_of(newest))
        ),
        key=step_of,
        reverse=True,
    )  # newest first
    problems = [] if newest in names or not named else [f"{newest}: missing"]
    for name in names:
        ckpt_dir = os.path.join(run_dir, name)
        problem = checkpoint_problem(ckpt_dir)
        if not problem:
            try:
                shard.load_state(accelerator, *parts, ckpt_dir)
            except Exception as e:  # any loader's (safetensors, torch, pickle): named, next one
                problem = (
                    f"loading it failed ({type(e).__name__}: {e}); its files have the sizes "
                    f"they were saved with"
                )
        if not problem:
            break
        problems.append(f"{name}: {problem}")
        accelerator.print(f"resume: {ckpt_dir} is unreadable: {problem}")
    else:
        raise SystemExit(
            f"resume: no readable checkpoint in {run_dir} ({'; '.join(problems)}): "
            f"put back the named files (from a backup), or start over with "
            f"--overwrite (deletes the run)"
        )
    state = json.loads(Path(ckpt_dir, "trainer_state.json").read_text())
    if name != newest:
        accelerator.print(
            f"resume: fell back to {'the previous checkpoint, ' * bool(named)}{name}; the steps "
            f"after {state['step']} run again"
        )
        if accelerator.is_main_process:
            files.write_text(latest, name)
    print(f"resumed from {ckpt_dir} at step {state['step']}")
    return state


def stop_on_signals() -> dict:
    """From now on SIGTERM (how clusters preempt a job) and SIGINT (Ctrl-C) ask the run to stop
    instead of ending it: the returned dict receives {"signal": the signal}, and the loop finishes
    its step, saves a checkpoint and exits. A second signal ends the process at once (its default
    action); the last checkpoint stays."""
    asked = {}

    def ask(signum, frame):
        asked["signal"] = signal.Signals(signum)
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        os.write(
            2,
            f"\n{asked['signal'].name}: finishing this step, then saving a checkpoint "
            f"and stopping (send it again to stop at once, without saving)\n".encode(),
        )

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, ask)
    return asked


# --------------------------------------------------------------------------------------------------
# The run's start and end, over several processes (accelerate launch): each rolls out its share with
# its own engine

RANK_SEED = 1_000_003  # rank r samples with seed + RANK_SEED x r: a prime, so no rank's per-wave
# seeds (rollout.Agent: seed + rollout.WAVE_SEED_STEP x wave, 7919) meet another's before 7919 ranks


def quiet(silent: bool):
    """A context that swallows what is printed to stdout when `silent` (the ranks other than 0
    repeat rank 0's start-up lines)."""
    return contextlib.redirect_stdout(io.StringIO()) if silent else contextlib.nullcontext()


def start(accelerator, run_dir: str, args, configs, warm):
    """Before anything loads: give one CPU process every core it may use, seed (--seed); then rank
    0 checks a --resume, claims run_dir and records the run (claim_and_record); a refusal there
    ends every rank, rank 0 saying why. Returns the open run.lock on rank 0 (hold it while the run
    lasts), else None."""
    ranks = accelerator.num_processes
    if ranks == 1 and accelerator.device.type == "cpu":
        # `accelerate launch` sets OMP_NUM_THREADS=1; one process may use every core it is allowed
        # (taskset / cpuset)
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    accelerate.utils.set_seed(args.seed)
    lock, refused = None, (False, None)
    if accelerator.is_main_process:
        try:
            lock = claim_and_record(accelerator, run_dir, args, configs, warm)
        except SystemExit as e:  # a refusal (a --resume that would not continue, a live lock)
            refused = (True, e.code)
    if ranks > 1:  # rank 0's decision, every rank's: the others would go on to a collective and
        # die there when rank 0 leaves, each with gloo's "Connection closed by peer" traceback
        refused = accelerate.utils.broadcast_object_list([refused])[0]
    if refused[0]:  # rank 0 says why; the others leave without repeating it
        raise SystemExit(refused[1] if accelerator.is_main_process else 1)
    return lock


def claim_and_record(accelerator, run_dir: str, args, configs, warm):
    """start's part on rank 0: check a --resume, claim run_dir, write config.json, start the
    trackers (start's arguments); returns the open run.lock. A refusal is a SystemExit."""
    config = {k: v for c in configs for k, v in asdict(c).items()}
    whole = {**config, **(asdict(warm) if not args.model else {})}  # warm: embedded default
    whole |= rundir.recorded(args, accelerator.mixed_precision)  # the files read, the precision
    rundir.check_resume(run_dir, whole, args)  # before config.json is rewritten
    lock = claim_run_dir(run_dir, args)
    name = rundir.config_name(run_dir, args.overwrite)
    save_config(run_dir, whole, [type(c) for c in (*configs, warm)], name)
    if os.path.isfile(default_config_file) and "ACCELERATE_DYNAMO_BACKEND" not in os.environ:
        # a user's accelerate config, and no launcher (each sets that variable): not in use
        print(
            f"accelerate: {default_config_file} is not used by a run started without "
            f"`accelerate launch`; start it with `accelerate launch train.py ...` to use it"
        )
    if args.log_with:
        accelerator.init_trackers("train", config=config)
    return lock


def resume(accelerator, run_dir: str, asked: bool, rng, counters, engine, parts):
    """With --resume (`asked`) and a checkpoint: restore it (load_checkpoint: `parts`, the model,
    optimizer and scheduler), this rank's sampling stream (`rng`, the agent's `counters`) and the
    engine's weights. Returns the step to start from, the metrics logged up to it and the skipped
    updates so far; (0, [], 0) otherwise. metrics.jsonl is rewritten to those rows: what an
    interrupted run logged after its checkpoint is dropped. Without --resume, what an --overwrite
    replaces is deleted here, once the inputs and models all loaded (rundir.clear_old_run)."""
    rank, ranks = accelerator.process_index, accelerator.num_processes
    start, history, skipped = 0, [], 0
    state = load_checkpoint(accelerator, run_dir, parts) if asked else None
    if state:
        start, skipped = state["step"], state["skipped"]
        saved = 1 + len(state.get("ranks", []))  # rank 0's stream, then the others'
        if saved != ranks:
            raise SystemExit(
                f"resume: checkpoint-{start} of {run_dir} was saved by {saved} processes, and "
                f"each one's sampling stream goes on from it; resume it with {saved} "
                f"(accelerate launch --num_processes {saved}), or start over with --overwrite"
            )
        mine = state if rank == 0 else state["ranks"][rank - 1]
        rng.setstate((mine["rng"][0], tuple(mine["rng"][1]), mine["rng"][2]))
        counters.update(mine["counters"])
        engine.load_weights(shard.gather(accelerator, parts[0]))
        history = [
            row
            for row in read_metrics(os.path.join(run_dir, "metrics.jsonl"))
            if row["step"] <= start
        ]
    accelerator.wait_for_everyone()  # every rank has read the metrics before rank 0 rewrites them
    if accelerator.is_main_process:  # drop what an interrupted run logged after its checkpoint
        if not asked:
            rundir.clear_old_run(run_dir)
        files.write_text(
            os.path.join(run_dir, "metrics.jsonl"), "".join(json.dumps(r) + "\n" for r in history)
        )
    return start, history, skipped


def stop_asked(accelerator, asked: dict) -> bool:
    """Whether any rank was asked to stop (`asked`: stop_on_signals'); every rank calls it, and all
    get the same answer."""
    return (
        accelerator.reduce(
            torch.tensor(float(bool(asked)), device=accelerator.device), "sum"
        ).item()
        > 0
    )


def checkpoint(accelerator, run_dir: str, step: int, skipped: int, rng, counters, parts):
    """save_checkpoint with the trainer state: the step, the skipped updates and each rank's
    sampling stream (`rng`, the agent's `counters`): rank 0's as one process saves it, then the
    others'."""
    streams = accelerate.utils.gather_object([{"rng": rng.getstate(), "counters": dict(counters)}])
    state = {
        "step": step,
        "skipped": skipped,
        **streams[0],
        **({"ranks": streams[1:]} if accelerator.num_processes > 1 else {}),
    }
    save_checkpoint(accelerator, run_dir, step, state, accelerator.is_main_process, parts)


def stopped_message(run_dir: str, stopped: signal.Signals, step: int, steps: int) -> str:
    """What a run stopped by a signal after `step` of `steps` says: where its checkpoint is, and
    the command that goes on from it."""
    again = " ".join(shlex.quote(a) for a in ["python", *sys.argv] if a != "--overwrite")
    return (
        f"stopped by {stopped.name} after step {step} of {steps}: saved {run_dir}/"
        f"checkpoint-{step}; to go on, run the same command with --resume: {again}"
        + " --resume"
        * ("--resume" not in sys.argv)
    )


def end(accelerator, engine, stopped: signal.Signals | None):
    """Close the engine and end every process together (end_processes); a run stopped by a signal
    exits with the shell's code for it."""
    # every rank done with its collectives (rank 0 with the final model) before any rank closes
    # anything; the engine's close comes next, as vLLM's shutdown (external_launcher) still uses
    # torch.distributed
    accelerator.wait_for_everyone()
    engine.close()
    end_processes(accelerator, 128 + stopped if stopped else 0)


def end_processes(accelerator, code: int):
    """Finish the trackers and exit with `code`; one process returns when `code` is 0.

    Several processes leave with os._exit, never tearing torch.distributed down: gloo's teardown
    joins its worker threads holding the GIL, while a worker may still wait for the GIL to free a
    finished collective's tensors, and both wait for ever (a barrier just before makes it rare, not
    impossible: two processes hung there in CI). The interpreter's own exit would run the same
    join. stdout and stderr are flushed first; the OS frees the sockets, the run lock and the
    memory."""
    if accelerator.num_processes == 1:
        accelerator.end_training()
        if code:
            raise SystemExit(code)  # 128 + a signal: the shell's code for a process it ended
        return
    for tracker in accelerator.trackers:
        tracker.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
