"""The core's shape: the top level holds exactly the six core modules; imports between them flow one
way, with no circle (every import statement counts, wherever it sits); the infra package never
imports the top level; the rollout strategies and the credit functions share one set of algorithm
names; no file over 700 lines."""

import ast
import pathlib

import advantages
import rollout

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = {p.stem: p for p in ROOT.glob("*.py")}
INFRA = sorted((ROOT / "infra").glob("*.py"))


def local_imports(path: pathlib.Path) -> set[str]:
    """The top-level modules of this repository that `path` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(MODULES)


def test_the_top_level_holds_the_six_core_modules():
    assert sorted(MODULES) == ["advantages", "eval", "retriever", "rollout", "train", "tree"]


def test_imports_flow_one_way():
    graph = {name: local_imports(path) - {name} for name, path in MODULES.items()}
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


def test_one_set_of_algorithm_names():
    assert list(rollout.STRATEGIES) == list(advantages.ALGOS)


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
