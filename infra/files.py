"""Files written for later reuse (the warm start, the world, indexes, checkpoints, a run's `final/`,
config and metrics, eval reports): each is written whole or not at all. A file is written to
NAME.tmp, then renamed onto NAME (os.replace is atomic), and a directory is written to NAME.tmp,
then swapped in, so a kill or a full disk in the middle of a write leaves the previous version (or
nothing), never a torn one that a later run would read. Also here: a script's check of an output
path before its work (`unwritable`), write errors that name their file (`failure_named`), and the
lock that gives a folder one writer at a time (`hold_lock`: a run directory, a comparison's --out).
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket


def write_text(path, text: str):
    """Write `text` to the file `path`, whole or not at all (NAME.tmp, then renamed)."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
    except BaseException:
        remove(tmp)  # a torn temporary file only takes space
        raise
    os.replace(tmp, path)


def write_json(path, obj, **dump_kwargs):
    """`obj` as JSON in the file `path`, whole or not at all (`dump_kwargs`: json.dumps')."""
    write_text(path, json.dumps(obj, **dump_kwargs))


def write_files(writers: dict):
    """Write several files whole or not at all, as one: `writers` maps each file's path to a
    function that writes it, given the path NAME.tmp to write to; the files are renamed onto their
    names only once all are written, and none is when one fails."""
    try:
        for path, write in writers.items():
            write(f"{path}.tmp")
    except BaseException:
        for path in writers:
            remove(f"{path}.tmp")  # a torn temporary file only takes space
        raise
    for path in writers:
        os.replace(f"{path}.tmp", path)


def write_dir(path, write):
    """Fill the directory `path` by `write(tmp)`, whole or not at all: `write` fills NAME.tmp (made
    empty first), which then replaces `path` and what it held (`path` -> NAME.old, NAME.tmp ->
    `path`, NAME.old deleted). When `write` raises, NAME.tmp is deleted and `path` is left as it
    was; a swap a kill cut short is finished first (`finish_swap`)."""
    finish_swap(path)
    tmp = f"{os.fspath(path).rstrip('/')}.tmp"
    remove(tmp)
    os.makedirs(tmp)
    try:
        write(tmp)
    except BaseException:
        remove(tmp)
        raise
    old = f"{os.fspath(path).rstrip('/')}.old"
    remove(old)
    if os.path.exists(path):
        os.replace(path, old)  # a directory cannot be renamed onto a non-empty one
    os.replace(tmp, path)
    remove(old)


def finish_swap(path) -> str:
    """Finish the swap of a `write_dir` into `path` that a kill cut short between its renames
    (NAME.old and NAME.tmp left, `path` gone); the caller holds the lock of whatever writes `path`.
    NAME.old exists only once NAME.tmp was written whole, so NAME.tmp becomes `path`; NAME.old, the
    previous version, goes (with no NAME.tmp it is put back). Returns what was done, or ""."""
    path = os.fspath(path).rstrip("/")
    old, tmp = f"{path}.old", f"{path}.tmp"
    if not os.path.isdir(old):
        return ""
    if os.path.exists(path):  # killed after the swap, before NAME.old was deleted
        remove(old)
        return ""
    if os.path.isdir(tmp):
        os.replace(tmp, path)
        remove(old)
        return f"{path}: a write killed between its renames was finished ({tmp} -> {path})"
    os.replace(old, path)
    return f"{path}: a write killed between its renames was undone ({old} -> {path})"


def unwritable(path: str, flag: str) -> str:
    """Why the file `path` (given as the flag `flag`, e.g. "--out") cannot be written: its directory
    is missing or not writable, or it is a directory; empty when it can. A script checks this with
    its flags, before the work, not after it."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{flag} {path!r}: the directory {folder} does not exist; create it, or pass another"
    if not os.access(folder, os.W_OK | os.X_OK) or os.path.isdir(path):
        return f"{flag} {path!r}: cannot write a file there; pass a file path in a writable folder"
    return ""


@contextlib.contextmanager
def failure_named(path, what_to_do: str):
    """Re-raise an OSError of the block that writes the file `path` (a full disk, a lost mount:
    errors that name no file) as one that names it, the space left on its disk and `what_to_do`."""
    try:
        yield
    except OSError as e:
        folder = os.path.dirname(os.path.abspath(path))
        free = shutil.disk_usage(folder).free / 2**20 if os.path.isdir(folder) else None
        space = "" if free is None else f"; {free:.0f} MiB free on the disk holding it"
        raise OSError(
            f"writing {path} failed ({type(e).__name__}: {e}){space}: {what_to_do}"
        ) from e


def hold_lock(path, what: str):
    """Take the exclusive lock on the file `path` (created), which makes this process the one
    writer of `what` (a run directory, a comparison's folder), and write "PID HOST" into it; refuse
    when another process holds it, naming that process and what to do. Returns the open file: the
    lock lasts while it is open, and flock frees it when the process ends, however it ends (a kill
    -9 leaves no stale lock)."""
    lock = open(path, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        _in_use(path, what)
    lock.truncate(0)
    print(os.getpid(), socket.gethostname(), file=lock, flush=True)
    return lock


def refuse_if_held(path, what: str):
    """Refuse, as `hold_lock` does, when a live process holds the lock on the existing file
    `path`; else return, having taken and written nothing (the file keeps "PID HOST" as it was)."""
    with open(path) as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _in_use(path, what)


def _in_use(path, what: str):
    """Stop with the message naming the lock's holder ("PID HOST" in `path`) and what to do."""
    holder = open(path).read().strip() or "?"
    raise SystemExit(
        f"{what} is in use by process {holder} ({path}): wait for it to end or stop it "
        f"(kill {holder.split()[0]})"
    ) from None


def remove(path):
    """Delete the file or directory `path` if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def sha256(path) -> str:
    """The sha256 of the file `path`'s bytes, in hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
