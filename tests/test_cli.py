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
        "-m scripts.dump",
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
    # one box per dataclass: its docstring, a rule, then one entry per flag, "--name VALUE" and its
    # description (on the same line after 2+ spaces, or on the next lines), then its default
    entries = []
    for box in out.stdout.split("╭")[1:]:
        lines = [line[2:].rstrip("│ ") for line in box.splitlines()[1:] if line.startswith("│")]
        rules = [i for i, line in enumerate(lines) if set(line) == {"─"}]
        for line in lines[rules[0] + 1 :] if rules else lines:
            if line.startswith("-"):  # a flag; its description's next lines are indented
                entries.append(line)
            elif entries:
                entries[-1] += "  " + line
    flags = [e for e in entries if not e.startswith("-h, --help")]
    assert len(flags) > 1, out.stdout
    for entry in flags:
        name, _, description = entry.partition("  ")
        description = " ".join(description.split())
        assert re.fullmatch(r"\S.* \((default: .*|required)\)", description), entry


def test_every_flag_a_rule_names_is_a_flag_of_train_py():
    # flags.check skips a rule whose flag none of the parsed dataclasses has (eval.py parses
    # AgentConfig, not RolloutConfig, both ruled by rollout.RULES): a misspelled name would go
    # unchecked
    import retriever
    import rollout
    import train
    from advantages import CreditConfig
    from infra import engines, protocol, run, warmstart

    configs = (train.Args, rollout.RolloutConfig, CreditConfig, protocol.AgentConfig)
    configs += (retriever.RetrieverConfig, warmstart.WarmConfig)
    rules = run.RULES + rollout.RULES + retriever.RULES + engines.RULES + warmstart.RULES
    named = {name for names, _, _ in rules for name in names.split()}
    assert named <= {f.name for c in configs for f in fields(c)}
