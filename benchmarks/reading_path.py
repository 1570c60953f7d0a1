"""The one-step reading path: what a reader walks to follow one training step of one --algo.

    python benchmarks/reading_path.py            # the shared core, then each algo's own code
    python benchmarks/reading_path.py --verbose  # and their definitions, where the paths stop

Static: it parses the repository's code with `ast` and imports none of it. What it counts:
- A code line is a line that is not blank: comments count, as docstrings do.
- The shared core is what every algo's path holds (the loop, the agent's step, the tree and its
  samples, log-probs, the loss and the update); an algo's own code is the rest of its path (its
  strategy and credit function, with their helpers). The core must stay within CORE_MAX.
- The loop is the first `for` statement in train.py's `main` whose loop variable is `step`, searched
  in all of `main` (nested blocks included), so it is found wherever the loop moves inside `main`.
  Its lines, and those of `main`'s lookups in an algorithm registry (`algo = ALGOS[...]`, before
  the loop), count as one definition, "main (the loop)". A `main` without the loop is an error.
- The path is the loop, the definitions (functions, classes, methods) it refers to, the ones those
  refer to, and so on, in the top-level modules and in the infrastructure package infra/ alike.
  It stops only at MACHINERY, the infra/ modules another RL project could reuse unchanged (each
  named below with why), at the command lines in scripts/ and at installed code. A paper's rule is
  never machinery: the reward, action parsing, abnormal outcomes, TITO contexts, log-probs and
  entropy, the loss are all counted.
- It also stops at a call on an object whose class is chosen at start (`self.engine.generate`,
  `engine.load_weights`, `self.retriever.search`, `self.refiner.summarize`): no class on the path
  has that method, and classes of the code whose names hold the object's do (HFEngine for
  `engine`, RemoteRetriever for `retriever`: the code names an object after its class), each a
  candidate.
- Every stop is printed with the code lines it skipped, exactly: the definition where the path
  stopped (a class with all its methods), and the definitions of its own file it reads (its
  helpers, and a method's calls on `self`), except those on the path and those printed as stops of
  their own; a call's are each candidate's.
- The honest walk (the second table) follows the step into infra/ everywhere but its BOOKKEEPING
  (the loop's metrics, timing, evaluation and checkpoints): its core must stay within HONEST_MAX.
- Names resolve through their module's imports (`import rollout`, `from tree import path`,
  `from infra import protocol`). A name of `main` bound by calling a class (`book = Book(...)`)
  or annotated with one (`args: Args`) has that class's type: `book.lap` reaches `Book.lap`.
  Annotations count: `args: Args` puts the dataclass Args on the path. A module-level variable is
  followed into its value and not counted. An algorithm registry (a module-level dict with
  string keys that the code indexes with `algo` or `X.algo`) is followed only into the chosen
  algo's entry.
- Reaching a class counts its own lines (fields, class attributes; not its methods) and reaches
  what making or calling an instance runs (CALLED: `__init__`, `__post_init__`, `forward`, ...).
  `self.name` reaches that method of the class; `x.name` on any other object reaches the method
  or property `name` of every class on the path, unless x is a parameter annotated with a
  builtin type (`text: str`). No other type is inferred: it errs on more.
"""

import argparse
import ast
import builtins
import functools
import pathlib
from dataclasses import dataclass
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "infra"  # the infrastructure package: walked, but for its MACHINERY
SCRIPTS = "scripts"  # the command lines: never on a step's path
# Where the path stops: machinery another RL project could reuse unchanged
MACHINERY = {
    "infra.engines": "the rollout engines' protocol, the HF engine and their sampling settings",
    "infra.vllm_engine": "the vLLM engine",
    "infra.search": "search indexes (BM25, dense)",
    "infra.server": "the retrieval server and its client",
    "infra.flags": "flag parsing",
    "infra.shard": "DDP / FSDP2: collectives, gathering, the ranks' padding",
    "infra.pack": "--pack_trees: the rows as one prefix tree (the log-prob rule is train.py's)",
    "infra.startup": "start-up on several processes",
    "infra.data": "the embedded world",
    "infra.loaders": "data loaders",
    "infra.warmstart": "the embedded default's warm start",
    "infra.files": "atomic file writes",
    "infra.policy": "loading a policy and its tokenizer",
}
# the loop's bookkeeping: machinery, and the only stops of the honest walk
BOOKKEEPING = {
    "infra.bookkeeping": "the loop's bookkeeping: metrics, timing, evaluation, checkpoints",
    "infra.run": "the run's start, checks, metrics log and checkpoints",
    "infra.rundir": "run directories, locks, final/",
    "infra.health": "metrics",
    "infra.draw": "pictures",
}
MACHINERY |= BOOKKEEPING
# the shared core's bounds (each paper's knobs are its own class, on its path alone)
CORE_MAX = {"code lines": 600, "definitions": 60, "files": 6}
# the honest walk's core (into infra/ everywhere but BOOKKEEPING)
HONEST_MAX = {"code lines": 770, "files": 10}  # 680 and 9 before --pack_trees' infra/pack.py
LOOP_MODULE, LOOP_FUNCTION, LOOP_VARIABLE = "train", "main", "step"
MAX_LINE = 100  # characters: pyproject.toml's line-length
FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef)
# what making or calling an instance runs: reaching a class reaches these methods of it
CALLED = {"__init__", "__post_init__", "__call__", "forward", "backward"}


@dataclass(frozen=True)
class Definition:
    module: str  # file stem: "rollout"
    name: str  # "grow", "Agent", "Agent.step", "main (the loop)"
    line: int  # where it starts
    code_lines: int


def code_lines(lines: list[str], first: int, last: int, skip=()) -> int:
    """Lines that are not blank among lines first..last (1-based, inclusive) outside the (first,
    last) `skip`s: code, docstrings and comments alike."""
    return sum(
        1
        for i in range(first, last + 1)
        if not any(a <= i <= b for a, b in skip) and lines[i - 1].strip()
    )


def span(node: ast.AST) -> tuple[int, int]:
    """A definition's first and last line, decorators included."""
    decorators = [d.lineno for d in getattr(node, "decorator_list", [])]
    return min([node.lineno, *decorators]), node.end_lineno


def top_statements(body: list[ast.stmt]):
    """Module-level statements, those inside top-level `if` and `try` blocks included."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.If, ast.Try)):
            handlers = [h.body for h in getattr(stmt, "handlers", [])]
            for block in (stmt.body, stmt.orelse, *handlers, getattr(stmt, "finalbody", [])):
                yield from top_statements(block)


class Module:
    """One top-level file: its definitions ("f", "C", "C.m"), imports and module-level variables."""

    def __init__(self, path: pathlib.Path):
        self.name, self.lines = path.stem, path.read_text().splitlines()
        self.defs: dict[str, ast.AST] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}  # name -> (module, member or None)
        self.variables: dict[str, ast.expr] = {}
        for stmt in top_statements(ast.parse(path.read_text(), str(path)).body):
            if isinstance(stmt, (*FUNCTION, ast.ClassDef)):
                self.defs[stmt.name] = stmt
                for m in stmt.body if isinstance(stmt, ast.ClassDef) else []:
                    if isinstance(m, FUNCTION):
                        self.defs[f"{stmt.name}.{m.name}"] = m
            elif isinstance(stmt, ast.Import):  # import a.b: a; import a.b as c: a.b
                for a in stmt.names:
                    self.imports[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0],
                        None,
                    )
            elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0:
                self.imports.update({a.asname or a.name: (stmt.module, a.name) for a in stmt.names})
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
                    if isinstance(target, ast.Name):
                        self.variables[target.id] = stmt.value

    @functools.cached_property
    def algo_lookups(self) -> list[ast.Subscript]:
        """Its definitions' subscripts by `algo` or `X.algo` (registries read them)."""
        return [
            n
            for d in self.defs.values()
            for n in ast.walk(d)
            if isinstance(n, ast.Subscript)
            and "algo" in (getattr(n.slice, "id", None), getattr(n.slice, "attr", None))
        ]

    def definition(self, name: str) -> Definition:
        """`name`'s Definition; a class's lines leave out its methods."""
        node = self.defs[name]
        methods = [span(m) for m in node.body if isinstance(m, FUNCTION)]
        skip = methods if isinstance(node, ast.ClassDef) else []
        return Definition(self.name, name, span(node)[0], code_lines(self.lines, *span(node), skip))


def load_modules(root: pathlib.Path = ROOT) -> dict[str, Module]:
    """The modules a path may enter: every *.py at `root` and in its PACKAGE folder ("infra.x")."""
    top = {p.stem: Module(p) for p in sorted(root.glob("*.py"))}
    package = sorted((root / PACKAGE).glob("*.py"))
    inner = {f"{PACKAGE}.{p.stem}": Module(p) for p in package if p.stem != "__init__"}
    for name, module in inner.items():
        module.name = name
    return {**top, **inner}


def find_loop(modules: dict[str, Module]) -> ast.For:
    """The first `for LOOP_VARIABLE in ...` in LOOP_MODULE.LOOP_FUNCTION, in source order."""
    where, fix = f"{LOOP_MODULE}.py's {LOOP_FUNCTION}", "at the top of benchmarks/reading_path.py"
    if LOOP_FUNCTION not in getattr(modules.get(LOOP_MODULE), "defs", {}):
        raise SystemExit(f"reading_path: found no {where}; update LOOP_MODULE, LOOP_FUNCTION {fix}")
    loops = [
        n
        for n in ast.walk(modules[LOOP_MODULE].defs[LOOP_FUNCTION])
        if isinstance(n, ast.For) and getattr(n.target, "id", None) == LOOP_VARIABLE
    ]
    if not loops:
        raise SystemExit(
            f"reading_path: {where} has no `for {LOOP_VARIABLE} in ...` loop, the training loop "
            f"this script starts from; name its variable {LOOP_VARIABLE!r} or update "
            f"LOOP_VARIABLE {fix}"
        )
    return min(loops, key=lambda n: n.lineno)


def bound_names(nodes: list[ast.AST]) -> set[str]:
    """Names bound inside `nodes` (arguments, assignments, loop variables, imports): locals."""
    names = set()
    for node in (n for root in nodes for n in ast.walk(root)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (*FUNCTION, ast.ClassDef)) and node not in nodes:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
    return names


def registries(modules: dict[str, Module]) -> dict[tuple[str, str], list[str]]:
    """The algorithm registries, (module, variable) -> keys: dicts indexed by `algo` or `X.algo`."""
    found = {}
    for module in modules.values():
        for node in module.algo_lookups:
            home, name = module.name, getattr(node.value, "id", None)  # REGISTRY[...]
            if name in module.imports and module.imports[name][1]:  # from m import REGISTRY
                home, name = module.imports[name]
            elif isinstance(node.value, ast.Attribute):  # m.REGISTRY[...]
                owner = getattr(node.value.value, "id", None)
                home, name = module.imports.get(owner, ("", None))[0], node.value.attr
            value = modules[home].variables.get(name) if home in modules else None
            keys = getattr(value, "keys", None) if isinstance(value, ast.Dict) else None
            if keys and all(isinstance(getattr(k, "value", None), str) for k in keys):
                found[home, name] = [k.value for k in keys]
    return found


def algos(modules: dict[str, Module]) -> list[str]:
    """The algorithm names: the registries' keys (they must agree)."""
    found = registries(modules)
    if len({frozenset(keys) for keys in found.values()}) != 1:
        raise SystemExit(
            f"reading_path: expected algorithm registries (module-level dicts indexed by `algo` or "
            f"`X.algo`) with one set of names; found {found or 'none'}"
        )
    return next(iter(found.values()))


class Walker:
    """One algo's path: visits definitions and variables, and what they refer to, once each."""

    def __init__(self, modules: dict[str, Module], algo: str, types=None, machinery=MACHINERY):
        self.modules, self.algo, self.registries = modules, algo, registries(modules)
        self.types = types or {}  # main's names bound by calling a class: name -> (module, class)
        self.machinery = machinery  # where it stops: MACHINERY, or the honest walk's BOOKKEEPING
        self.reached: dict[tuple[str, str], Definition] = {}
        self.variables: set[tuple[str, str]] = set()
        self.classes: set[tuple[str, str]] = set()
        self.attributes: set[str] = set()  # the `name`s of x.name with x of unknown type
        self.receivers: dict[str, set[str]] = {}  # name -> each x of x.name (`engine`, `tok`)
        self.stops: set[str] = set()  # where the path met MACHINERY or SCRIPTS

    def lookup(self, module: str, name: str):
        """`name` in `module`: ("def" or "var", module, name), ("module", dotted name) or None."""
        m = self.modules[module]
        if name in m.defs or name in m.variables:
            return ("def" if name in m.defs else "var"), module, name
        if name in m.imports:
            source, member = m.imports[name]
            return ("module", source) if member is None else self.member(source, member)
        return None  # a builtin

    def member(self, module: str, name: str):
        """`module.name`: a module of the package, or its lookup; None (a stop) at MACHINERY and
        SCRIPTS, None at installed code."""
        if f"{module}.{name}" in self.modules:  # from infra import protocol
            return "module", f"{module}.{name}"
        if module in self.machinery or module.split(".")[0] == SCRIPTS:
            self.stops.add(f"{module}.{name}")
        elif module in self.modules:
            return self.lookup(module, name)
        return None

    def method(self, module: str, cls: str, name: str):
        qualified = f"{cls}.{name}"
        return ("def", module, qualified) if qualified in self.modules[module].defs else None

    def visit(self, target):
        """Reach a definition or variable (once), then follow its code."""
        kind, module, name = target if target and target[0] != "module" else (None, None, None)
        if kind == "var" and (module, name) not in self.variables:
            self.variables.add((module, name))
            value = self.modules[module].variables[name]
            if (module, name) in self.registries:  # only the chosen algo's entry
                value = value.values[[k.value for k in value.keys].index(self.algo)]
            self.follow(module, [value])
        elif kind == "def" and (module, name) not in self.reached:
            node = self.modules[module].defs[name]
            self.reached[module, name] = self.modules[module].definition(name)
            if not isinstance(node, ast.ClassDef):
                self.follow(module, [node], cls=name.split(".")[0] if "." in name else None)
                return
            self.classes.add((module, name))
            for method in self.attributes | CALLED:
                self.visit(self.method(module, name, method))
            own = [s for s in node.body if not isinstance(s, FUNCTION)]
            self.follow(module, [*node.bases, *node.keywords, *node.decorator_list, *own])

    def follow(self, module: str, nodes: list[ast.AST], local=frozenset(), cls=None):
        """Visit what the names and attributes in `nodes`, code of `module`, refer to."""
        local = set(local) | bound_names(nodes)
        walked = [n for root in nodes for n in ast.walk(root)]
        typed = [n for n in walked if isinstance(n, ast.arg) and isinstance(n.annotation, ast.Name)]
        builtin = {n.arg for n in typed if n.annotation.id in dir(builtins)}  # as `text: str`
        for node in walked:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.visit(None if node.id in local else self.lookup(module, node.id))
            elif isinstance(node, ast.Attribute):
                owner = getattr(node.value, "id", None)
                if cls and owner in ("self", "cls"):
                    self.visit(self.method(module, cls, node.attr))
                    continue
                if module == LOOP_MODULE and owner in self.types:  # book.lap: Book.lap
                    home, name = self.types[owner]
                    if home in self.machinery:
                        self.stops.add(f"{home}.{name}.{node.attr}")
                    else:  # that method only: main's own lines are the loop's
                        self.visit(self.method(home, name, node.attr))
                    continue
                target = self.lookup(module, owner) if owner and owner not in local else None
                if target and target[0] == "module":  # m.name
                    self.visit(self.member(target[1], node.attr))
                elif target and target[0] == "def":  # C.name, a method of class C
                    self.visit(self.method(*target[1:], node.attr))
                elif owner not in builtin:  # x.name: that method of every class on the path
                    self.attributes.add(node.attr)
                    x = ast.unparse(node.value).removeprefix("self.")
                    self.receivers.setdefault(node.attr, set()).add(x)
                    for m, c in list(self.classes):
                        self.visit(self.method(m, c, node.attr))


def locate(modules: dict[str, Module], module: str, dotted: str):
    """Where the definition `dotted` ("Book", "rollout.Agent") used in `module` lives, following
    imports through MACHINERY too: (module, name), or None (installed code, a variable)."""
    head, _, rest = dotted.partition(".")
    m = modules[module]
    if not rest and head in m.defs:
        return module, head
    source, member = m.imports.get(head, (None, None))
    if source is None:
        return None
    if member is None or f"{source}.{member}" in modules:  # a module: look `rest` up there
        home = source if member is None else f"{source}.{member}"
        return locate(modules, home, rest) if rest and home in modules else None
    return locate(modules, source, member) if source in modules and not rest else None


def class_locals(modules: dict[str, Module]) -> dict[str, tuple[str, str]]:
    """`main`'s names bound by calling a class (`book = Book(...)`) or annotated with one (`args:
    Args`): name -> (module, class)."""
    main, types = modules[LOOP_MODULE].defs[LOOP_FUNCTION], {}
    for arg in main.args.args:
        home = locate(modules, LOOP_MODULE, ast.unparse(arg.annotation)) if arg.annotation else None
        if home and isinstance(modules[home[0]].defs.get(home[1]), ast.ClassDef):
            types[arg.arg] = home
    for node in ast.walk(main):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            home = locate(modules, LOOP_MODULE, ast.unparse(node.value.func))
            if home and isinstance(modules[home[0]].defs.get(home[1]), ast.ClassDef):
                types.update({t.id: home for t in node.targets if isinstance(t, ast.Name)})
    return types


def registry_lookups(modules: dict[str, Module], found) -> list[ast.Assign]:
    """`main`'s assignments from an algorithm registry outside the loop (`algo = ALGOS[...]`)."""
    loop, main = find_loop(modules), modules[LOOP_MODULE].defs[LOOP_FUNCTION]
    inside = {id(n) for n in ast.walk(loop)}
    names = {name for _, name in found}
    return [
        n
        for n in ast.walk(main)
        if isinstance(n, ast.Assign)
        and id(n) not in inside
        and isinstance(n.value, ast.Subscript)
        and getattr(n.value.value, "id", getattr(n.value.value, "attr", None)) in names
    ]


class Walk(NamedTuple):
    """One algo's path and where it stopped."""

    path: list[Definition]  # in file and line order
    stops: list[str]  # at machinery and scripts: "infra.shard.deal", "infra.bookkeeping.Book.lap"
    calls: dict[str, list[tuple[str, str]]]  # "engine.generate" -> its candidates (module, name)


def reading_path(modules: dict[str, Module], algo: str, machinery=MACHINERY) -> Walk:
    """`algo`'s path, in file and line order, the names where it stopped (`machinery`) and the
    calls it could not follow: x.name on an object of unknown type, where no class on the path
    has the method `name` and classes of the code do (its candidates)."""
    if algo not in algos(modules):
        raise SystemExit(f"reading_path: unknown algo {algo!r}; the registries: {algos(modules)}")
    loop, train = find_loop(modules), modules[LOOP_MODULE]
    walker = Walker(modules, algo, class_locals(modules), machinery)
    lookups = registry_lookups(modules, walker.registries)  # `algo = ALGOS[...]` before the loop
    lines = code_lines(train.lines, *span(loop)) + sum(
        code_lines(train.lines, *span(n)) for n in lookups
    )
    name = f"{LOOP_FUNCTION} (the loop)"
    walker.reached[LOOP_MODULE, ""] = Definition(LOOP_MODULE, name, loop.lineno, lines)
    local = bound_names([train.defs[LOOP_FUNCTION]])
    walker.follow(LOOP_MODULE, [loop, *(n.value for n in lookups)], local=local)
    calls = {}
    for attr, receivers in walker.receivers.items():
        if any(f"{c}.{attr}" in modules[m].defs for m, c in walker.classes):
            continue  # followed: that method of a class on the path
        candidates = [(m.name, f"{c}.{attr}") for m in modules.values() for c in classes(m)]
        candidates = [(m, name) for m, name in candidates if name in modules[m].defs]
        for x in receivers:  # the object's name within its class's: engine, HFEngine
            named = x.split(".")[-1].lower()
            calls[f"{x}.{attr}"] = [c for c in candidates if named in c[1].split(".")[0].lower()]
    calls = {call: found for call, found in sorted(calls.items()) if found}
    path = sorted(walker.reached.values(), key=lambda d: (d.module, d.line))
    return Walk(path, sorted(walker.stops), calls)


def classes(module: Module) -> list[str]:
    """The names of `module`'s classes."""
    return [n for n, node in module.defs.items() if isinstance(node, ast.ClassDef)]


def home(modules: dict[str, Module], stop: str) -> tuple[str, str] | None:
    """Where the definition a stop names ("infra.shard.deal", "infra.bookkeeping.Book.lap") is:
    (module, name); None for a value or a module of SCRIPTS."""
    for cut in (2, 3):
        module, name = ".".join(stop.split(".")[:cut]), ".".join(stop.split(".")[cut:])
        if module in modules:
            found = locate(modules, module, name) if "." not in name else (module, name)
            if found and found[1] in modules[found[0]].defs:
                return found
    return None


def reads(modules: dict[str, Module], module: str, name: str) -> set[tuple[str, str]]:
    """What a reader reads from definition `name` of `module` on: it (a class with all its
    methods), then, again and again, the definitions of the same file it names and a method's
    calls on `self`."""
    m, todo, seen = modules[module], [name], set()
    while todo:
        n = todo.pop()
        if n in seen or n not in m.defs:
            continue
        seen.add(n)
        node, cls = m.defs[n], n.split(".")[0]
        if isinstance(node, ast.ClassDef):
            todo += [f"{n}.{f.name}" for f in node.body if isinstance(f, FUNCTION)]
        for x in ast.walk(node):
            if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Load):
                todo.append(x.id)
            elif isinstance(x, ast.Attribute) and getattr(x.value, "id", None) in ("self", "cls"):
                todo.append(f"{cls}.{x.attr}")
    return {(module, n) for n in seen}


def skipped(modules: dict[str, Module], where: tuple[str, str], exclude=frozenset()) -> int:
    """The code lines a stop skipped: what a reader reads from its definition `where` (`reads`),
    but the definitions in `exclude` (on a path, or another stop's own)."""
    kept = reads(modules, *where) - (set(exclude) - {where})
    return sum(modules[m].definition(n).code_lines for m, n in kept)


def core_and_own(
    modules: dict[str, Module], machinery=MACHINERY
) -> tuple[list[Definition], dict[str, list]]:
    """The shared core (the definitions on every algo's path) and each algo's own definitions."""
    paths = {algo: reading_path(modules, algo, machinery).path for algo in algos(modules)}
    core = set.intersection(*(set(path) for path in paths.values()))
    own = {algo: [d for d in path if d not in core] for algo, path in paths.items()}
    return sorted(core, key=lambda d: (d.module, d.line)), own


def files(definitions: list[Definition]) -> list[str]:
    """The files that hold `definitions`, in path order."""
    return sorted({d.module.replace(".", "/") + ".py" for d in definitions})


def size(definitions: list[Definition]) -> dict[str, int]:
    """Code lines, definitions and files of a list of definitions (CORE_MAX's keys)."""
    return {
        "code lines": sum(d.code_lines for d in definitions),
        "definitions": len(definitions),
        "files": len({d.module for d in definitions}),
    }


def line_stats(root: pathlib.Path = ROOT) -> dict:
    """Code lines per top-level file; the longest line and the lines over MAX_LINE in every .py."""
    texts = {p.relative_to(root): p.read_text().splitlines() for p in sorted(root.rglob("*.py"))}
    texts = {p: t for p, t in texts.items() if not {"out", "__pycache__"} & set(p.parts)}
    texts = {p: t for p, t in texts.items() if not any(s.startswith(".") for s in p.parts)}
    lengths = [(len(line), f"{p}:{i}") for p, t in texts.items() for i, line in enumerate(t, 1)]
    return {
        "top": {p.name: code_lines(t, 1, len(t)) for p, t in texts.items() if len(p.parts) == 1},
        "longest": max(lengths),
        "over": sum(n > MAX_LINE for n, _ in lengths),
        "files": len(texts),
    }


def stop_report(modules: dict[str, Module], walks: list[Walk], machinery=MACHINERY) -> list[str]:
    """Every stop of `walks` (each algo's) with the code lines it skipped (`skipped`): the
    machinery's, by module, then the calls no path follows, by candidate; and all of it once."""
    stops = sorted({stop for w in walks for stop in w.stops})
    calls = {call: found for w in walks for call, found in w.calls.items()}
    homes = {stop: home(modules, stop) for stop in stops}
    on_path = {(d.module, d.name) for w in walks for d in w.path}
    exclude = on_path | {h for h in homes.values() if h} | {c for f in calls.values() for c in f}
    lines = ["machinery, where every path stops (code lines skipped):"]
    module_of = lambda stop: next((m for m in machinery if stop.startswith(m + ".")), SCRIPTS)
    for module in sorted({module_of(stop) for stop in stops}):
        mine = [stop for stop in stops if module_of(stop) == module]
        said = lambda stop: (
            f"{skipped(modules, homes[stop], exclude)}" if homes[stop] else "(a value)"
        )
        names = ", ".join(f"{stop[len(module) + 1 :]} {said(stop)}" for stop in mine)
        lines.append(f"    {module}: {names} ({machinery.get(module, 'the command lines')})")
    lines.append("calls on an object made at start, not followed (code lines of each candidate):")
    for call, found in calls.items():
        each = ", ".join(f"{m}.{n} {skipped(modules, (m, n), exclude)}" for m, n in found)
        lines.append(f"    {call}: {each}")
    read = set().union(*(reads(modules, *h) for h in exclude - on_path)) - on_path
    total = sum(modules[m].definition(n).code_lines for m, n in read)
    lines.append(f"skipped in all, each definition once: {total:,} code lines")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verbose", action="store_true", help="list each part's definitions")
    parser.add_argument("--root", default=str(ROOT), help="the repository to measure")
    args = parser.parse_args()
    root = pathlib.Path(args.root)
    modules = load_modules(root)
    start = f"{LOOP_MODULE}.py's loop (line {find_loop(modules).lineno})"
    where = lambda d: f"{d.module.replace('.', '/')}.py:{d.line}"
    listing = lambda defs: [f"    {where(d):24} {d.name:30} {d.code_lines:4}" for d in defs]
    for title, machinery, bound in (
        (f"one step's reading path: from {start}, into {PACKAGE}/ too", MACHINERY, CORE_MAX),
        (
            f"the honest walk: into {PACKAGE}/ everywhere but its bookkeeping",
            BOOKKEEPING,
            HONEST_MAX,
        ),
    ):
        print(f"{title}, stopping at {'machinery' if machinery is MACHINERY else 'bookkeeping'}")
        core, own = core_and_own(modules, machinery)
        bounds = " / ".join(f"<= {v} {k}" for k, v in bound.items())
        c = size(core)
        n_lines, n_defs = c["code lines"], c["definitions"]
        print(f"shared core (every algo): {n_lines} code lines, {n_defs} definitions")
        print(f"    {c['files']} files: {', '.join(files(core))} (bounds {bounds})")
        for line in listing(core) if args.verbose else []:
            print(line)
        print(
            f"{'algo':12} {'own lines':>9} {'own definitions':>15} {'path lines':>10} {'files':>5}"
        )
        for algo, defs in own.items():
            o = size(defs)
            total = c["code lines"] + o["code lines"]
            n = len(files([*core, *defs]))
            print(f"{algo:12} {o['code lines']:>9} {o['definitions']:>15} {total:>10} {n:>5}")
            for line in listing(defs) if args.verbose else []:
                print(line)
        walks = [reading_path(modules, algo, machinery) for algo in own]
        for line in stop_report(modules, walks, machinery):
            print(line)
    s = line_stats(root)
    top, (longest, at) = s["top"], s["longest"]
    largest = max(top, key=top.get)
    print(f"top level: {sum(top.values()):,} code lines in {len(top)} files", end=" ")
    print(f"(largest {largest}, {top[largest]})")
    print(f"longest line: {longest} characters ({at});", end=" ")
    print(f"{s['over']:,} lines over {MAX_LINE} in {s['files']} .py files")


if __name__ == "__main__":
    main()
