"""The scripts' command lines: `--help` describes every flag and shows its default; every flag the
rules name exists."""

import re
import subprocess
import sys
from dataclasses import fields
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


def test_every_flag_a_rule_names_is_a_flag_of_train_py():
    # flags.check skips a rule whose flag none of the parsed dataclasses has (eval.py parses
    # AgentConfig, not RolloutConfig, both ruled by rollout.RULES): a misspelled name would go
    # unchecked
    import retriever
    import rollout
    import train
    from advantages import CreditConfig
    from infra import engines, warmstart

    configs = (train.Args, rollout.RolloutConfig, CreditConfig, rollout.AgentConfig)
    configs += (retriever.RetrieverConfig, warmstart.WarmConfig)
    rules = train.RULES + rollout.RULES + retriever.RULES + engines.RULES + warmstart.RULES
    named = {name for names, _, _ in rules for name in names.split()}
    assert named <= {f.name for c in configs for f in fields(c)}
