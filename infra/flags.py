"""Command-line flags for every script: dataclasses parsed by HfArgumentParser, then checked against
a table of rules. The scripts' progress bars (`progress`) are made here too, so that a log file can
hold them.
"""

import ast
import dataclasses
import inspect
import sys
import textwrap
import types

from tqdm import tqdm
from transformers import HfArgumentParser


def parse(*classes, args=None):
    """Parse the command line (or `args`) into one instance per dataclass; `--help` gives
    docstrings, defaults.

    HfArgumentParser reads a field's `--help` only from `metadata["help"]`: first copy the string
    written under each field into that metadata, read from the source with `ast` (classes defined
    under `if __name__ == "__main__":` included); `--help` also shows each field's default."""
    for cls in classes:
        # field name -> the string literal written right under it, in cls and its dataclass bases
        docs = {}
        for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
            for stmt, after in zip(body, body[1:]):
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    docs[stmt.target.id] = " ".join(after.value.value.split())
        for f in dataclasses.fields(cls):
            if f.name in docs and "help" not in f.metadata:
                f.metadata = types.MappingProxyType(
                    {**f.metadata, "help": docs[f.name].replace("%", "%%")}
                )
    return HfArgumentParser(classes).parse_args_into_dataclasses(args=args)


def check(configs, rules, extra=()):
    """Stop with one message listing every flag of `configs` (a dataclass instance or a tuple of
    them) that breaks its rule. rules: [(flag names separated by spaces, what is allowed,
    test(value) -> bool)], a module's RULES, whose flags `configs` need not all have (rollout.py's
    cover two dataclasses); extra: [(broken?, message)] for rules that involve several flags."""
    configs = configs if isinstance(configs, tuple) else (configs,)
    owner = lambda name: next((c for c in configs if hasattr(c, name)), None)
    errors = [
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
