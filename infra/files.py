"""Files written for later reuse (the warm start, the world, indexes, checkpoints, a run's `final/`,
config and metrics, eval reports): each is written whole or not at all. A file is written to
NAME.tmp, then renamed onto NAME (os.replace is atomic), and a directory is written to NAME.tmp,
then swapped in, so a kill or a full disk in the middle of a write leaves the previous version (or
nothing), never a torn one that a later run would read.
"""

import json
import os
import shutil


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


def write_dir(path, write):
    """Fill the directory `path` by `write(tmp)`, whole or not at all: `write` fills NAME.tmp (made
    empty first), which then replaces `path` and what it held. When `write` raises, NAME.tmp is
    deleted and `path` is left as it was."""
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


def remove(path):
    """Delete the file or directory `path` if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
