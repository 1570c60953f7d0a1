"""benchmarks/reading_path.py: it finds train.py's loop and the registry lookup before it, follows
only the chosen algo's registry entries, walks into infra/ but for its machinery (where it stops and
says exactly what it skipped), lists the calls on objects made at start that it cannot follow,
counts what it reaches (comments as docstrings) and splits it into the shared core and each algo's
own code; the honest walk stops at bookkeeping only (on a hand-built repository, then on this
one)."""

import importlib.util
import pathlib

import pytest

import rollout

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location(
    "reading_path", ROOT / "benchmarks" / "reading_path.py"
)
reading_path = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reading_path)

TRAIN = """import credit
from infra import engines, parse
from infra.run import Book


def main(args):
    book = Book()
    engine = engines.make()
    chosen = credit.ALGOS[args.algo]
    for step in range(3):
        # one step
        credit.step(args, engines.load(), parse.words(chosen))
        engine.sync(step)
        book.log(step)
"""
ENGINES = """def load():
    return credit.first()


def make():
    return FakeEngine()


class FakeEngine:
    def sync(self, step):
        return _copy(step)


def _copy(step):
    return step
"""
PARSE = '''def words(text):
    """Split."""
    return text.split()
'''
RUN = "class Book:\n    def log(self, step):\n        return step\n"
CREDIT = '''from dataclasses import dataclass

ALGOS = {"a": lambda: first(), "b": lambda: second()}


@dataclass
class Config:
    algo: str = "a"


def step(cfg: Config, model):
    """Run the chosen algo."""
    return ALGOS[cfg.algo]()


def first():
    return 1


def second():
    return 2


def unused():
    return 3
'''


def test_a_hand_built_repository_gives_the_hand_counted_path(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "credit.py").write_text(CREDIT)
    (tmp_path / "infra").mkdir()
    # machinery (engines, run): the path stops there; infra/parse.py is not machinery: walked
    (tmp_path / "infra" / "engines.py").write_text(ENGINES)
    (tmp_path / "infra" / "parse.py").write_text(PARSE)
    (tmp_path / "infra" / "run.py").write_text(RUN)
    modules = reading_path.load_modules(tmp_path)
    assert reading_path.algos(modules) == ["a", "b"]
    for algo, fn in (("a", "first"), ("b", "second")):
        path, stops, calls = reading_path.reading_path(modules, algo)
        # the loop 5 lines (for, a comment, three calls) + the registry lookup before it 1, step 3
        # (def, docstring, return), Config 3 (decorator, class, field), the algo's function 2 (not
        # the other's, nor unused, nor engines.load, which would reach `first`), parse.words 3:
        # 5 definitions, 17 lines, 3 files; `book.log` is Book.log, a stop in infra.run
        assert [(d.module, d.name, d.code_lines) for d in path] == [
            ("credit", "Config", 3),
            ("credit", "step", 3),
            ("credit", fn, 2),
            ("infra.parse", "words", 3),
            ("train", "main (the loop)", 6),
        ]
        assert stops == ["infra.engines.load", "infra.run.Book.log"]
        # `engine` is made at start (no type the walk knows): FakeEngine's sync is its candidate
        assert calls == {"engine.sync": [("infra.engines", "FakeEngine.sync")]}
        home = lambda stop: reading_path.home(modules, stop)
        assert home("infra.engines.load") == ("infra.engines", "load")
        assert reading_path.skipped(modules, home("infra.engines.load")) == 2
        assert reading_path.skipped(modules, home("infra.run.Book.log")) == 2
        # what a reader reads there: sync 2 and the helper it calls, _copy 2
        assert reading_path.skipped(modules, ("infra.engines", "FakeEngine.sync")) == 4
        # the honest walk stops at bookkeeping only: engines.load is read (2 lines), no stop there
        path, stops, _ = reading_path.reading_path(modules, algo, {"infra.run": "bookkeeping"})
        assert ("infra.engines", "load", 2) in [(d.module, d.name, d.code_lines) for d in path]
        assert stops == ["infra.run.Book.log"]
    # the core: what both paths hold; each algo owns its function
    core, own = reading_path.core_and_own(modules)
    assert reading_path.size(core) == {"code lines": 15, "definitions": 4, "files": 3}
    assert {a: [d.name for d in defs] for a, defs in own.items()} == {
        "a": ["first"],
        "b": ["second"],
    }


def test_a_train_py_without_the_step_loop_is_a_clear_error(tmp_path):
    (tmp_path / "train.py").write_text("def main():\n    for i in range(3):\n        pass\n")
    with pytest.raises(SystemExit, match="has no `for step in ...` loop"):
        reading_path.find_loop(reading_path.load_modules(tmp_path))


def test_the_loop_is_found_in_train_main():
    modules = reading_path.load_modules(ROOT)
    loop = reading_path.find_loop(modules)
    assert modules["train"].lines[loop.lineno - 1].lstrip().startswith("for step in ")


def test_the_registry_read_from_the_code_holds_the_algorithm_names():
    assert reading_path.algos(reading_path.load_modules(ROOT)) == list(rollout.ALGOS)


@pytest.mark.parametrize("algo", list(rollout.ALGOS))
def test_each_algo_path_holds_its_own_strategy_and_credit_and_no_other_credit(algo):
    path, stops, calls = reading_path.reading_path(reading_path.load_modules(ROOT), algo)
    names = {(d.module, d.name) for d in path}
    assert (
        len(path) > 0
        and sum(d.code_lines for d in path) > 0
        and all(d.code_lines > 0 for d in path)
    )
    assert ("train", "main (the loop)") in names
    assert ("rollout", rollout.ALGOS[algo].grow.__name__) in names
    credits = {(e.credit.__module__, e.credit.__name__) for e in rollout.ALGOS.values()}
    mine = rollout.ALGOS[algo].credit
    assert names & credits == {(mine.__module__, mine.__name__)}
    assert stops and all(s.rsplit(".", 1)[0].split(".")[0] == "infra" for s in stops)
    # where it stops is machinery only: never a paper's rule (reward, parsing, log-probs, loss)
    assert {s.split(".")[1] for s in stops} <= {m.split(".")[1] for m in reading_path.MACHINERY}
    assert not {"infra.protocol", "infra.squad"} & {m for m in reading_path.MACHINERY}
    # the calls on the objects made at start are stops it names, each with its candidates
    assert {
        "engine.generate",
        "engine.load_weights",
        "engine.sleep",
        "retriever.search",
        "refiner.summarize",
    } <= set(calls)
    assert ("infra.engines", "HFEngine.generate") in calls["engine.generate"]
    assert ("retriever", "Refiner.summarize") in calls["refiner.summarize"]


def test_every_stop_is_printed_with_the_lines_it_skipped():
    modules = reading_path.load_modules(ROOT)
    walks = [reading_path.reading_path(modules, algo) for algo in rollout.ALGOS]
    said = "\n".join(reading_path.stop_report(modules, walks))
    for stop in {s for w in walks for s in w.stops} | {c for w in walks for c in w.calls}:
        assert stop.rsplit(".", 1)[-1] in said, stop
    for call in ("engine.generate", "engine.load_weights", "engine.sleep", "retriever.search"):
        assert f"    {call}: " in said
    # a class stop counts its methods: Sampling's checks, RetrievalError's __init__
    home = lambda stop: reading_path.home(modules, stop)
    sampling = modules["infra.engines"].definition("Sampling").code_lines
    check = modules["infra.engines"].definition("Sampling.__post_init__").code_lines
    assert reading_path.skipped(modules, home("infra.engines.Sampling")) == sampling + check


def test_the_honest_walk_reads_infra_but_bookkeeping_within_its_bounds():
    modules = reading_path.load_modules(ROOT)
    core, _ = reading_path.core_and_own(modules, reading_path.BOOKKEEPING)
    size = reading_path.size(core)
    assert all(size[k] <= bound for k, bound in reading_path.HONEST_MAX.items()), size
    # it reads what the first walk stops at, the mini-batches' dealing and the sampling settings
    names = {(d.module, d.name) for d in core}
    assert ("infra.shard", "deal") in names and ("infra.engines", "Sampling") in names
    counted, _ = reading_path.core_and_own(modules)
    assert reading_path.size(counted)["code lines"] < size["code lines"]


def test_the_shared_core_is_within_its_bounds_and_each_algo_owns_its_paper():
    core, own = reading_path.core_and_own(reading_path.load_modules(ROOT))
    size = reading_path.size(core)
    assert all(size[k] <= bound for k, bound in reading_path.CORE_MAX.items()), size
    names = {(d.module, d.name) for d in core}
    assert ("train", "main (the loop)") in names and ("train", "ppo_loss") in names
    assert ("rollout", "Agent.step") in names and ("tree", "to_samples") in names
    # the step's own code is home: log-probs beside the update, the parser beside the protocol's
    # tags (infra/ but not machinery: counted)
    assert {
        ("train", "TokenLogp.forward"),
        ("train", "collate"),
        ("infra.protocol", "parse_action"),
    } <= names
    assert ("infra.squad", "token_f1") in names  # the reward is counted, wherever it lives
    for algo, entry in rollout.ALGOS.items():  # the paper's strategy and credit: its own
        mine = {(d.module, d.name) for d in own[algo]}
        credit = (entry.credit.__module__, algo)  # advantages.py's, or turns.py's
        assert ("rollout", entry.grow.__name__) in mine and credit in mine, (algo, mine)
    # each paper's knobs are its own class, on its path alone: no config every path reads
    assert not {"RolloutConfig", "CreditConfig"} & {n for _, n in names}
    mine = {(d.module, d.name) for d in own["tree_grpo"]}
    assert {("tree", "TreeGRPORollout"), ("advantages", "TreeGRPOCredit")} <= mine
    # nothing on the path only logs, evaluates, times, checkpoints or stops the run
    assert not any(m == "eval" for m, _ in names) and not {"run_eval", "sample_metrics"} & {
        n for _, n in names
    }


def test_line_stats_count_the_top_level_and_find_the_longest_line():
    stats = reading_path.line_stats(ROOT)
    assert (
        set(stats["top"]) == {p.name for p in ROOT.glob("*.py")} and min(stats["top"].values()) > 0
    )
    length, where = stats["longest"]
    file, line = where.rsplit(":", 1)
    assert len((ROOT / file).read_text().splitlines()[int(line) - 1]) == length
