"""What a run may do to its directory, OUT_DIR/runs/NAME, beyond claiming it (infra/run.py): the
name that places it, the flags a `--resume` may change, the deletion `--overwrite` asks for (only
once every input was checked and the models loaded), and `final/`, written whole or not at all.
"""

import json
import os
import shlex
import shutil
from pathlib import Path

from safetensors import SafetensorError

from infra import files, loaders

NEXT_CONFIG = "config.next.json"  # an --overwrite run's config.json until the old run is deleted

# flags a --resume may change: they cannot change a step's numbers (--steps: where the run ends)
RESUME_MAY_CHANGE = {
    "steps": "not below the checkpoint's step",
    "eval_every": "when to evaluate",
    "eval_start": "used at step 0 only",
    "log_with": "logging",
    "checkpoint_every": "when to save",
    "retriever_url": "where the same index answers",
    "retriever_timeout_s": "how patiently",
    "retriever_retries": "how patiently",
    "max_env_error_rate": "when to stop",
    "env_error_patience": "when to stop",
    "resume": "",
    "overwrite": "",
    "out_dir": "the same directory, however spelt",
    "run_name": "the same directory, however spelt",
}
RECORDED = ("inputs", "mixed_precision")  # config.json's entries that are not flags: `recorded`


def bad_name(name: str) -> bool:
    """Whether --run_name is not a plain name: a path (a separator), '.' or '..', which would place
    the run, and what --overwrite deletes, outside OUT_DIR/runs."""
    return name in (".", "..") or "/" in name or os.sep in name or "\0" in name


def unwritable(out_dir: str) -> str:
    """Why the run cannot write under `out_dir` (it, or its nearest existing parent, is not a
    writable directory); empty when it can."""
    path = os.path.abspath(out_dir)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"--out_dir {out_dir!r}: {path} is a file, not a directory; pass a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return (
            f"--out_dir {out_dir!r}: {path} is not writable by this user, so no run could be "
            "saved there; pass a directory you can write (or fix its permissions)"
        )
    return ""


def recorded(args, mixed_precision: str) -> dict:
    """What config.json records beside the flags, so that a --resume refuses a change the flags do
    not show: the sha256 of each question and corpus file the run reads (`args`: train.py's Args;
    an empty --data, --test_data or --corpus reads the embedded world in OUT_DIR/world; a datasets
    name has no file, and a world not written yet is recorded as null) and the mixed precision
    (`mixed_precision`: the accelerator's), which sets pi_old's source and the reference's dtype."""
    world = os.path.join(args.out_dir, "world")
    sources = {
        "data": (args.data or world, "train"),
        "test_data": (args.test_data or args.data or world, "test"),
        "corpus": (args.corpus or os.path.join(world, "corpus.jsonl"), ""),
    }
    inputs = {}
    for name, (source, split) in sources.items():
        path = loaders.split_file(source, split) if split else source
        if path and os.path.isfile(path):
            inputs[name] = {"file": path, "sha256": files.sha256(path)}
    return {"inputs": inputs, "mixed_precision": mixed_precision}


def check_resume(run_dir: str, whole: dict, args):
    """Refuse a --resume (`args`: train.py's Args) that would not continue the run it names: the run
    directory does not exist (a mistyped --run_name or --seed: the runs that exist are listed), the
    run finished without a checkpoint (a resume would train it again from step 0 and replace it),
    or a flag of `whole` (flag -> value, this run's whole configuration, with `recorded`'s inputs
    and mixed precision) differs from its config.json where that changes the numbers (every such
    flag is listed; only RESUME_MAY_CHANGE's may differ), checkpoint or not."""
    if not args.resume:
        return
    runs = Path(run_dir).parent
    if not os.path.isdir(run_dir):
        there = sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
        raise SystemExit(
            f"--resume: there is no run {run_dir} to continue; the runs in {runs}: "
            f"{', '.join(there) or 'none'}. Pass one of them as --run_name (a run's default name "
            "is ALGO-seedSEED), or drop --resume to start a new run"
        )
    config, latest = Path(run_dir, "config.json"), Path(run_dir, "latest")
    finished = any(Path(run_dir, n).is_dir() for n in ("final", "final.old"))  # .old: mid-swap
    if finished and not latest.exists():
        held = sorted(n for n in os.listdir(run_dir) if n != "run.lock")
        raise SystemExit(
            f"--resume: {run_dir} holds a finished run ({', '.join(held)}) and no checkpoint to "
            "go on from (it ran with --checkpoint_every 0, or fewer --steps than "
            "--checkpoint_every): a resume would train it again from step 0 and replace its "
            "final/ and metrics. Keep it and start a new run with another --run_name, or pass "
            "--overwrite to replace it"
        )
    if not config.exists():
        return  # killed before its config.json was written: nothing to compare; from step 0
    try:
        saved = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(
            f"--resume: {config} cannot be read ({type(e).__name__}: {e}), so this run's flags "
            "cannot be compared with the checkpoint's; restore that file, or start over with "
            "--overwrite"
        ) from None
    now = json.loads(json.dumps(whole))  # as config.json holds it (tuples as lists)
    changed = [
        f"{flag(k, v)} (the run: {flag(k, saved[k]).split(' ', 1)[-1]})"
        for k, v in now.items()
        if k in saved and saved[k] != v and k not in RESUME_MAY_CHANGE and k not in RECORDED
    ]
    was_inputs = saved.get("inputs") if isinstance(saved.get("inputs"), dict) else {}
    for name, now_file in now.get("inputs", {}).items():
        was = was_inputs.get(name) or {}
        if was.get("sha256") not in (None, now_file["sha256"]):
            changed.append(
                f"the contents of --{name}'s file {now_file['file']} (sha256 "
                f"{now_file['sha256'][:12]}..., the run's {was['sha256'][:12]}...: the file "
                "changed since the run started; put the run's file back)"
            )
    was_mp = saved.get("mixed_precision")
    if was_mp is not None and was_mp != now.get("mixed_precision", was_mp):
        changed.append(
            f"mixed precision {now['mixed_precision']} (the run: {was_mp}; it sets pi_old's "
            "source and the reference's dtype: launch with the run's, e.g. `accelerate launch "
            f"--mixed_precision {was_mp}`)"
        )
    at = latest.read_bytes().decode(errors="replace") if latest.exists() else ""
    at = at.strip().removeprefix("checkpoint-")
    if at.isdigit() and args.steps < int(at):
        changed.append(f"--steps {args.steps} (the checkpoint is at step {at})")
    if changed:
        raise SystemExit(
            f"--resume continues the run in {run_dir}, but these flags differ from its "
            "config.json, and a step trained under them would not be that run's: "
            + "; ".join(changed)
            + ". Pass the run's values, or start a new run with another --run_name. --resume may "
            "change only: " + ", ".join(f"--{k}" for k in RESUME_MAY_CHANGE if k != "resume")
        )


def flag(name: str, value) -> str:
    """A flag as it is typed: `--lr 0.01`, `--no_eval_start`."""
    if isinstance(value, bool):
        return f"--{'no_' * (not value)}{name}"
    return f"--{name} {shlex.quote(str(value))}"


def config_name(run_dir: str, overwrite: bool) -> str:
    """Where this run's config goes: config.json, or with --overwrite NEXT_CONFIG, so that the old
    run keeps its own until `clear_old_run` deletes it."""
    if overwrite:
        return NEXT_CONFIG
    files.remove(os.path.join(run_dir, NEXT_CONFIG))  # a failed --overwrite's: never used
    return "config.json"


def clear_old_run(run_dir: str):
    """--overwrite's deletion, made once every input was checked and the models loaded (so a bad
    flag, file or model leaves the old run as it was): all that run_dir holds but run.lock, then
    NEXT_CONFIG becomes config.json. Without --overwrite there is no NEXT_CONFIG: nothing to do."""
    pending = os.path.join(run_dir, NEXT_CONFIG)
    if not os.path.exists(pending):
        return
    for name in os.listdir(run_dir):
        if name not in ("run.lock", NEXT_CONFIG):
            files.remove(os.path.join(run_dir, name))
    os.replace(pending, os.path.join(run_dir, "config.json"))


def save_final(model, weights: dict, tok, run_dir: str):
    """Write the trained policy (`model`, with its full state dict `weights`: infra/shard.py's
    gather, whole even under FSDP2) and its tokenizer to run_dir/final, whole or not at all. On
    failure
    (a full disk) nothing is left there but a previous complete final/, and the message says how
    much space the weights need and where the last good state is."""
    final = os.path.join(run_dir, "final")

    def write(d):
        model.save_pretrained(d, state_dict=weights)
        tok.save_pretrained(d)

    try:
        files.write_dir(final, write)
    except (OSError, RuntimeError, SafetensorError) as e:  # torch: RuntimeError
        need = sum(p.numel() * p.element_size() for p in weights.values()) / 2**20
        free = shutil.disk_usage(run_dir).free / 2**20
        latest = Path(run_dir, "latest")
        last = (
            f"{run_dir}/{latest.read_text().strip()} (--resume goes on from it)"
            if latest.exists()
            else "none on disk (no checkpoint was saved: --checkpoint_every 0)"
        )
        raise SystemExit(
            f"saving {final} failed ({type(e).__name__}: {e}); nothing was saved there. The "
            f"weights need about {need:.0f} MiB, {free:.0f} MiB are free on the disk holding "
            f"{run_dir}; the last good state: {last}"
        ) from e
