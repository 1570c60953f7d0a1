"""The scripts' command lines: `--help` describes every flag and shows its default."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "script",
    [
        "train.py",
        "eval.py",
        "train.py warmstart",
        "-m infra.data",
        "advantages.py",
        "rollout.py",
        "retriever.py serve",
    ],
)
def test_help_gives_every_flag_a_description_and_its_default(script):
    out = subprocess.run(
        [sys.executable, *script.split(), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    options = out.stdout.split("\noptions:\n", 1)[1]
    # one per flag: "  --name VALUE  Description (default: x)"
    entries = re.split(r"\n(?=  -)", options.strip("\n"))
    flags = [e for e in entries if not e.lstrip().startswith("-h, --help")]
    assert len(flags) > 1, out.stdout
    for entry in flags:
        # the description follows 2+ spaces or a new line
        name, _, description = entry.strip().partition("  ")
        assert re.fullmatch(r"\S.* \(default: .*\)", " ".join(description.split())), entry
