"""Command-line flags for every script: dataclasses parsed by tyro, then checked against a table of
rules. The scripts' progress bars (`progress`) are made here too, so that a log file can hold them.
"""

import dataclasses
import math
import sys
import typing

import tyro
from tqdm import tqdm


def parse(*classes, args=None):
    """Parse the command line (or `args`) into one instance per dataclass, every field a flag of its
    own name (--tree_M, --no_eval_start); `--help` shows each field's docstring and default."""
    flags = dataclasses.make_dataclass(
        "Flags", [(c.__name__, c, dataclasses.field(default_factory=c)) for c in classes]
    )
    config = (tyro.conf.OmitArgPrefixes,)
    parsed = tyro.cli(flags, args=args, use_underscores=True, config=config)
    return tuple(getattr(parsed, c.__name__) for c in classes)


def check(configs, rules, extra=()):
    """Stop with one message listing every flag of `configs` (a dataclass instance or a tuple of
    them) that is a float but not finite (NaN, inf), or breaks its rule. rules: [(flag names
    separated by spaces, what is allowed, test(value) -> bool)], a module's RULES, whose flags
    `configs` need not all have (rollout.py's cover two dataclasses); extra: [(broken?, message)]
    for rules that involve several flags."""
    configs = configs if isinstance(configs, tuple) else (configs,)
    owner = lambda name: next((c for c in configs if hasattr(c, name)), None)
    # NaN passes every `v > 0` test false and inf most: no number flag may be either
    errors = [
        f"--{f.name} {getattr(c, f.name)!r}: must be a finite number"
        for c in configs
        for f in dataclasses.fields(c)
        if isinstance(getattr(c, f.name), float) and not math.isfinite(getattr(c, f.name))
    ]
    errors += [
        f"--{name} {getattr(owner(name), name)!r}: must be {allowed}"
        for names, allowed, test in rules
        for name in names.split()
        if owner(name) is not None and not test(getattr(owner(name), name))
    ]
    errors += [message for broken, message in extra if broken]
    if errors:
        raise SystemExit("invalid flags (nothing was loaded or run):\n  " + "\n  ".join(errors))


def progress(iterable, **kwargs):
    """A tqdm bar over `iterable`: redrawn as usual on a terminal, at most every 20 s when stderr is
    a file or a pipe (`> log 2>&1`: a few lines a minute, not every redraw). Update its postfix
    with refresh=False: a refresh redraws at once."""
    return tqdm(iterable, mininterval=0.1 if sys.stderr.isatty() else 20, **kwargs)


def check_choices(config) -> None:
    """A config dataclass's `__post_init__`: every Literal field within its choices, else a
    ValueError naming the field, the value and the choices (tyro refuses them on the command line;
    this, in direct Python calls)."""
    hints = typing.get_type_hints(type(config))
    choices = {f.name: typing.get_args(hints[f.name]) for f in dataclasses.fields(config)}
    choices = {k: v for k, v in choices.items() if typing.get_origin(hints[k]) is typing.Literal}
    bad = [
        f"{k}={getattr(config, k)!r} (one of {', '.join(map(repr, v))})"
        for k, v in choices.items()
        if getattr(config, k) not in v
    ]
    if bad:
        raise ValueError(f"{type(config).__name__}: {'; '.join(bad)}; pass one of the choices")
