"""The core's shape: the top level holds exactly the six core modules; imports between them flow one
way, with no circle (every import statement counts, wherever it sits, but a script's command-line
block); the infra package never imports the top level; one algorithm registry pairs each rollout
strategy with a credit function of advantages.py; no file over 700 lines."""

import ast
import inspect
import pathlib
import typing

import advantages
import rollout

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = {p.stem: p for p in ROOT.glob("*.py")}
INFRA = sorted((ROOT / "infra").glob("*.py"))


def local_imports(path: pathlib.Path, main_block: bool = True) -> set[str]:
    """The top-level modules of this repository that `path` imports, anywhere in the file; with
    main_block=False, not in its `if __name__ == "__main__":` block (it runs only when the file is
    the script, never when the module is imported, so it is outside the import graph)."""
    module = ast.parse(path.read_text())
    main = [n for n in module.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    skipped = set() if main_block else {id(n) for block in main for n in ast.walk(block)}
    found = set()
    for node in (n for n in ast.walk(module) if id(n) not in skipped):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(MODULES)


def test_the_top_level_holds_the_six_core_modules():
    assert sorted(MODULES) == ["advantages", "eval", "retriever", "rollout", "train", "tree"]


def test_imports_flow_one_way():
    graph = {name: local_imports(path, main_block=False) - {name} for name, path in MODULES.items()}
    order, done = [], set()

    def visit(name, stack):
        assert name not in stack, f"import circle: {' -> '.join(stack + [name])}"
        if name not in done:
            for dep in sorted(graph[name]):
                visit(dep, stack + [name])
            done.add(name)
            order.append(name)

    for name in sorted(graph):
        visit(name, [])
    # leaves: they stand on the infra package only
    assert graph["tree"] == graph["retriever"] == set()
    assert "rollout" not in graph["advantages"] | graph["tree"] and "eval" not in graph["rollout"]


def test_infra_never_imports_the_top_level():
    assert INFRA and {p.name: local_imports(p) for p in INFRA} == {p.name: set() for p in INFRA}


def test_the_registry_pairs_a_strategy_with_a_credit_function_and_the_knobs_they_take():
    # --algo's choices are the registry's names
    assert typing.get_args(typing.get_type_hints(rollout.RolloutConfig)["algo"]) == tuple(
        rollout.ALGOS
    )
    r, c = rollout.RolloutConfig(), advantages.CreditConfig()
    for name, algo in rollout.ALGOS.items():
        # a strategy of rollout.py, a credit function of advantages.py
        assert getattr(rollout, algo.grow.__name__) is algo.grow, name
        assert getattr(advantages, algo.credit.__name__) is algo.credit, name
        # the knobs read fields that exist (else AttributeError) and name parameters of the function
        for fn, knobs in ((algo.grow, algo.grow_knobs(r)), (algo.credit, algo.credit_knobs(r, c))):
            assert set(knobs) <= set(inspect.signature(fn).parameters), (name, fn.__name__)


def test_no_file_over_700_lines():
    code = {
        name: sum(
            1
            for line in path.read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")
        )
        for name, path in [*MODULES.items(), *((f"infra/{p.name}", p) for p in INFRA)]
    }
    assert max(code.values()) <= 700, code
