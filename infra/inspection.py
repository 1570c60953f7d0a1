"""The inspection command lines: `python advantages.py` (one prompt's trees -> every step's credit
as JSON, the worked demo side by side, Tree-GRPO's budget) and `python rollout.py --dump` (one
rollout batch of the embedded default as JSON, every method drawn on one of its prompts), with what
only they use: the demo tree, the budget formula, rollout dumps on disk, trees as `infra.draw` data.
advantages.py and rollout.py call them from their `__main__` blocks and pass the modules in
(advantages.py, rollout.py with its algorithm registry, tree.py), as this package never imports the
top level.

Deviations from the papers, each cited by its name:
- budget-formula: Tree-GRPO's text prints the expected budget E[B] = M*B + L*N*B/2; its Tables 3
  and 7 fit M*B + M*L*N*B/2 (N expansions in each of the M trees), which `tree_grpo_budget`
  implements.
"""

import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Literal

from infra import data, draw, flags
from infra.engines import RULES as ENGINE_RULES
from infra.engines import load_policy, make_engine, model_problem
from infra.protocol import AgentConfig
from infra.search import BM25Retriever, load_corpus

# --------------------------------------------------------------------------------------------------
# Trees on disk and as `infra.draw` data


def save_trees(prompts: list[list], path_: str) -> None:
    """Write a JSON list with one entry per prompt, each entry that prompt's trees."""
    with open(path_, "w") as f:
        json.dump([[t.to_dict() for t in trees] for trees in prompts], f, indent=1)


MAX_DEPTH = 100  # steps on one path of a trees file: far more than any rollout's --max_turns, well
# within Python's recursion limit, which tree.py's walks (recursive) stay under


def load_trees(path_: str, prompt: int | None, tree_class, for_credit: bool = False) -> list:
    """The trees of ONE prompt: from a JSON list of tree dicts, or entry `prompt` of a `save_trees`
    rollout dump (`tree_class`: tree.Tree); shaped as tree.py reads them (`check_shape`, then its
    own keys and flags), every error naming the file, the node and the field. With `for_credit`,
    also fit for the credit functions (`check_credit_input`)."""
    try:
        with open(path_) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON or not UTF-8
        raise ValueError(f"{path_} cannot be read as JSON ({type(e).__name__}: {e})") from None
    except RecursionError:
        raise ValueError(
            f"{path_} is nested too deeply for Python's JSON reader (a path of hundreds of "
            f"steps); at most {MAX_DEPTH} steps on a path are read"
        ) from None
    if isinstance(data, list) and data and all(isinstance(x, list) for x in data):  # a rollout dump
        if prompt is None or not 0 <= prompt < len(data):
            raise ValueError(
                f"{path_} is a rollout dump of {len(data)} prompts; pick one with --prompt K "
                f"(0 <= K < {len(data)}), got {prompt}"
            )
        data = data[prompt]
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise ValueError(
            f"{path_}: expected a JSON list of trees (node dicts) for one prompt, "
            f"or a rollout dump (a list of such lists); got {type(data).__name__}"
        )
    check_shape(data, path_)
    trees = [tree_class.from_dict(t) for t in data]  # unknown keys and flags named there
    if for_credit:
        check_credit_input(data, path_)
    return trees


def nodes(trees: list):
    """(node dict, depth, where) for every node of `trees` (JSON tree dicts), depth first, without
    recursion (a file may hold any depth); `where` says how to find the node in the file."""
    stack = [(t, 0, f"tree {i}") for i, t in enumerate(trees)][::-1]  # popped from the end
    while stack:
        node, depth, where = stack.pop()
        yield node, depth, where
        children = node.get("children", []) if isinstance(node, dict) else []
        if isinstance(children, list):
            below = [
                (c, depth + 1, f"child {k} of node {node.get('id')!r}")
                for k, c in enumerate(children)
            ]
            stack += below[::-1]


def check_shape(trees: list, path_: str):
    """Raise ValueError, naming the node and the field, where `trees` (JSON tree dicts) is not
    shaped as tree.py reads it: every node an object with a string "id", "children" a list,
    "flags" a list, at most MAX_DEPTH steps deep."""
    for node, depth, where in nodes(trees):
        if not isinstance(node, dict):
            problem = f"{where} is a {type(node).__name__}, not a node object"
        elif not isinstance(node.get("id"), str):
            problem = f"{where}: 'id' must be a string, got {node.get('id')!r}"
        elif not isinstance(node.get("children", []), list):
            got = type(node["children"]).__name__
            problem = f"node {node['id']!r}: 'children' must be a list of nodes, got a {got}"
        elif not isinstance(node.get("flags", []), list):
            problem = f"node {node['id']!r}: 'flags' must be a list, got {node['flags']!r}"
        elif depth > MAX_DEPTH:
            problem = (
                f"node {node['id']!r} is {depth} steps deep; at most {MAX_DEPTH} are read (no "
                "rollout makes more: --max_turns)"
            )
        else:
            continue
        raise ValueError(f"{path_}: {problem}")


def check_credit_input(trees: list, path_: str):
    """Raise ValueError, naming the node and the field, where the credit would silently be wrong:
    an id twice (the output's "nodes" is keyed by id), a reward that is not a finite number, a leaf
    without reward (it would drop out of every group statistic: only a trajectory lost to retrieval,
    flagged env_error, has none), or no step at all (nothing to credit)."""
    seen, steps = {}, 0
    for node, depth, where in nodes(trees):
        name, reward, leaf = node["id"], node.get("reward"), not node.get("children")
        lost = "env_error" in node.get("flags", [])
        if name in seen:
            problem = (
                f"node id {name!r} is used twice ({seen[name]}, and {where}); ids must be unique "
                "across the prompt's trees"
            )
        elif reward is not None and (type(reward) not in (int, float) or not math.isfinite(reward)):
            problem = f"node {name!r}: 'reward' must be a finite number, got {reward!r}"
        elif depth and leaf and reward is None and not lost:
            problem = (
                f"node {name!r} is a leaf without 'reward'; give it one, or flag it "
                '"env_error" (a trajectory lost to retrieval: never scored)'
            )
        else:
            seen[name], steps = where, steps + (depth > 0)
            continue
        raise ValueError(f"{path_}: {problem}")
    if not steps:
        raise ValueError(
            f"{path_}: {len(trees)} tree(s) and no step (a root is the prompt): nothing to credit; "
            'give each tree\'s root its steps as "children"'
        )


def drawing(trees: list, trajectories: list, tree_module) -> list[dict]:
    """Plain data for `infra.draw`, one dict per node of `trees`, parents first: id, parent id, kind
    (prompt, search, answer, invalid, truncated, discarded; step: no action set), the step's credit
    (None: not trained), a leaf's reward, the marks it carries (BranPO's prefix_end and redundant;
    TreePS-RAG's sampled and retained, i.e. kept by the pruning; fork: more than one child) and how
    many of its sampled children were dropped (BranPO's unkept branches, TreePS-RAG's pruned).
    `tree_module`: tree.py."""
    credit, rows = tree_module.step_credit(trajectories), []
    for n in (n for t in trees for n in tree_module.walk(t.root)):
        has = {
            "prefix_end": n.prefix_end,
            "redundant": n.redundant,
            "sampled": n.sampled,
            "fork": len(n.children) > 1,
            "retained": n.parent is not None and (bool(n.children) or n.flags == ["max_turns"]),
        }
        kind = (
            "prompt"
            if n.parent is None
            else "truncated"
            if "truncated" in n.flags
            else "discarded"
            if "env_error" in n.flags
            else n.action or "step"
        )
        rows.append(
            {
                "id": n.id,
                "parent": n.parent and n.parent.id,
                "kind": kind,
                "credit": credit.get(n.id),
                "reward": None if n.children else n.reward,
                "marks": [m for m, on in has.items() if on],
                "dropped": max(n.n_sampled - len(n.children), 0),
            }
        )
    return rows


# --------------------------------------------------------------------------------------------------
# python advantages.py


def tree_grpo_budget(M: int, N: int, L: int) -> tuple[int, float]:
    """Tree-GRPO §4.2.3 (budget-formula): M trees, L rounds of N expansions per tree, each one new
    leaf starting at a uniform depth (B/2 on average). Returns rollouts = M (L N + 1) and E[B_tree]
    = M B + M L N B / 2 in units of B, the full trajectory: Table 3's budgets 2, 4, 8, 16 for
    (M,N,L) = (1,2,1) .. (8,2,1), ~16 for (6,3,1), (4,5,1)."""
    return M * (L * N + 1), M * (1 + L * N / 2)


def demo(credits: dict, tree_module):
    """A worked tree (one prompt, two original trajectories: one with branches and a redundant step,
    one split at its last step with no branch kept) and every method's trajectories on it (GRPO's on
    the tree's root-to-leaf paths, each copied into a chain of its own). `credits`: name -> credit
    function, rollout.ALGOS's, each run with its defaults; `tree_module`: tree.py."""
    tree = tree_module.Tree.from_dict(
        {
            "id": "q",
            "children": [
                {
                    "id": "q.0",
                    "action": "search",
                    "query": "who founded Acme",
                    "prefix_end": True,
                    "children": [
                        {"id": "q.0.0", "action": "answer", "answer": "Ivo", "reward": 1.0},
                        {
                            "id": "q.0.1",
                            "action": "search",
                            "query": "Ivo Ra birthplace",
                            "redundant": True,
                            "children": [
                                {
                                    "id": "q.0.1.0",
                                    "action": "answer",
                                    "answer": "Ivo",
                                    "reward": 1.0,
                                }
                            ],
                        },
                        {"id": "q.0.2", "action": "answer", "answer": "Oda", "reward": 0.0},
                    ],
                },
                {
                    "id": "q.1",
                    "action": "search",
                    "query": "Acme founder",
                    "prefix_end": True,
                    "children": [
                        {"id": "q.1.0", "action": "answer", "answer": "Oda", "reward": 0.0}
                    ],
                },
            ],
        }
    )
    leaves = tree_module.scored_leaves(tree.root)
    chains = [tree_module.Tree.from_dict(tree.to_dict()) for _ in leaves]
    for chain, leaf in zip(chains, leaves):
        for step in tree_module.path(chain.find(leaf.id)):
            step.parent.children = [step]  # prune the copy to the root-to-leaf path
    return tree, {name: fn(chains if name == "grpo" else [tree]) for name, fn in credits.items()}


def report(algo: str, trees, trajectories, walk) -> dict:
    """The CLI's JSON: per-node value/advantage and per-trajectory step advantages (`walk`:
    tree.walk)."""
    return {
        "algo": algo,
        "nodes": {
            n.id: {"value": n.value, "advantage": n.advantage}
            for t in trees
            for n in walk(t.root)
            if n.parent is not None
        },
        "trajectories": [
            {"leaf": tr.leaf.id, "steps": [s.id for s in tr.steps], "advantages": tr.advantages}
            for tr in trajectories
        ],
    }


def demo_table(advantages, credits, tree_module) -> str:
    """The worked tree, then one row per (trajectory, step) and one column per method (`credits`:
    name -> credit function)."""
    tree, runs = demo(credits, tree_module)
    table = {
        (name, tr.leaf.id, step.id): a
        for name, trajectories in runs.items()
        for tr in trajectories
        for step, a in zip(tr.steps, tr.advantages)
    }
    advantages.treeps([tree])  # leave TreePS-RAG's V and A on the rendered tree
    lines = [
        "TreePS-RAG values (V) and process advantages (A) on the tree:",
        tree.render(),
        "",
        "Advantage multiplying each step's tokens in each trajectory ('-' = not trained there):",
        f"{'leaf':8} {'step':8} " + " ".join(f"{k:>9}" for k in runs),
    ]
    for leaf in tree_module.scored_leaves(tree.root):
        for step in tree_module.path(leaf):
            cells = [table.get((k, leaf.id, step.id)) for k in runs]
            lines.append(
                f"{leaf.id:8} {step.id:8} "
                + " ".join(f"{'-' if c is None else f'{c:+.3f}':>9}" for c in cells)
            )
    return "\n".join(lines)


@dataclass
class CreditArgs:
    """`python advantages.py --algo ALGO --trees FILE.json`: per-step advantages of one prompt's
    rollout trees."""

    trees: str = ""
    """JSON list of trees for ONE prompt (see tree.py for the node format), or a rollout dump (with
    --prompt)."""
    prompt: int | None = None
    """With a rollout dump (one list of trees per prompt): which prompt."""
    budget: str = ""
    """With --algo tree_grpo: M,N,L -> rollouts and expected budget."""
    demo: bool = False
    """Print a worked tree with every method side by side."""
    render: bool = False
    """Also print the annotated tree(s) to stderr."""
    plot: str = ""
    """With --demo: also draw the tree under each method, steps coloured by credit, to this PNG."""


def credit_cli(advantages, rollout, tree_module):
    """`python advantages.py ...`: `advantages`, `rollout`, `tree_module`: the modules
    advantages.py, rollout.py (its registry ALGOS: name -> credit function and knobs) and tree.py,
    passed in."""
    args, r, c = flags.parse(CreditArgs, rollout.RolloutConfig, advantages.CreditConfig)
    flags.check(r, rollout.RULES)
    credits = {name: algo.credit for name, algo in rollout.ALGOS.items()}
    if args.demo:
        print(demo_table(advantages, credits, tree_module))
        if args.plot:
            tree, runs = demo(credits, tree_module)
            notes = {
                "grpo": "the tree's 4 paths as 4 chains:\na step adds up the chains through it"
            }
            panels = [
                {
                    "algo": k,
                    "nodes": drawing([tree], trajectories, tree_module),
                    "note": notes.get(k, ""),
                }
                for k, trajectories in runs.items()
            ]
            draw.figure(
                panels, args.plot, "python advantages.py --demo: the worked tree, each method"
            )
    elif args.budget:
        try:
            M, N, L = (int(x) for x in args.budget.split(","))
        except ValueError:
            raise SystemExit(
                f"--budget {args.budget!r}: must be three integers M,N,L (trees, expansions, "
                "rounds), e.g. 2,2,1"
            ) from None
        flags.check(
            r,
            [],
            extra=[
                (r.algo != "tree_grpo", f"--budget goes with --algo tree_grpo, not {r.algo}"),
                (M < 1 or min(N, L) < 0, f"--budget {args.budget!r}: M must be >= 1 and N, L >= 0"),
            ],
        )
        rollouts, budget = tree_grpo_budget(M, N, L)
        print(json.dumps({"rollouts": rollouts, "budget": budget}))
    elif args.trees:
        try:
            trees = load_trees(args.trees, args.prompt, tree_module.Tree, for_credit=True)
        except ValueError as e:  # the message names the file, the node and the field
            raise SystemExit(f"--trees: {e}") from None
        algo = rollout.ALGOS[r.algo]
        trajectories = algo.credit(trees, **algo.credit_knobs(r, c))
        out = report(r.algo, trees, trajectories, tree_module.walk)
        print(json.dumps(out, indent=1, allow_nan=False))  # valid JSON, or an error
        if args.render:
            print("\n\n".join(t.render() for t in trees), file=sys.stderr)
    else:
        raise SystemExit("give --trees FILE (and --algo), or --budget, or --demo")


# --------------------------------------------------------------------------------------------------
# python rollout.py --dump


@dataclass
class DumpArgs:
    """`python rollout.py --algo ALGO --dump FILE`: one rollout batch on the embedded default,
    dumped as JSON."""

    dump: str
    """Output JSON: one list of trees per prompt (advantages.py --trees FILE --prompt I)."""
    n_prompts: int = 4
    """Questions of --split to roll out (spread over the hops)."""
    model: str = "out/warmstart"
    """Policy directory or hub name (train.py writes the warm start to out/warmstart)."""
    world: str = "out/world"
    """Embedded world directory (written on first use)."""
    engine: Literal["auto", "hf", "vllm"] = "auto"
    """Generation engine."""
    split: Literal["train", "dev", "test"] = "train"
    """Which questions of the world."""
    plot: str = ""
    """Also grow every other method on the same questions (at the knobs given); draw all to this
    PNG."""
    plot_prompt: int = 0
    """With --plot: which of the prompts to draw."""
    seed: int = 0
    """Seed of the engine's sampling and the strategies' random choices (train.py's --seed)."""


def dump_cli(rollout, advantages, tree_module):
    """`python rollout.py --dump ...`: `rollout`, `advantages`, `tree_module`: the modules
    rollout.py, advantages.py and tree.py, passed in."""
    args, r, c, agent_cfg = flags.parse(
        DumpArgs, rollout.RolloutConfig, advantages.CreditConfig, AgentConfig
    )
    no_model = model_problem(args.model)
    if args.model == "out/warmstart" and not os.path.exists(args.model):
        no_model = (
            "no policy in out/warmstart: train one first (python train.py warmstart, ~5 min "
            "on 2 cores, or any train.py run), or pass --model DIR"
        )
    flags.check(
        (args, r, agent_cfg),
        rollout.RULES + ENGINE_RULES + [("n_prompts", "an integer >= 1", lambda v: v >= 1)],
        [
            rollout.depth_rule(r, agent_cfg),
            (no_model, no_model),
            (
                not 0 <= args.plot_prompt < args.n_prompts,
                f"--plot_prompt {args.plot_prompt}: must be in [0, --n_prompts)",
            ),
        ],
    )
    world = data.ensure_world(args.world)
    rows = data.spread(data.load_rows(world, args.split), args.n_prompts)
    model, tok = load_policy(args.model)
    engine = make_engine(args.engine, model, tok, args.model)
    retriever = BM25Retriever(load_corpus(os.path.join(world, "corpus.jsonl")))
    agent = rollout.Agent(engine, retriever, tok, agent_cfg, args.seed)
    algo = rollout.ALGOS[r.algo]
    t0 = time.perf_counter()
    prompts = algo.grow(agent, rows, random.Random(args.seed), **algo.grow_knobs(r))
    save_trees(prompts, args.dump)
    print(
        f"{r.algo} {algo.grow_knobs(r)}: {len(prompts)} prompts in "
        f"{time.perf_counter() - t0:.1f} s -> {args.dump}"
    )
    for k, v in {**rollout.metrics(prompts), **agent.counters}.items():
        print(f"  {k:40} {v:10.2f}")
    print(
        f"credit assignment of the first prompt: python advantages.py --algo {r.algo} --trees "
        f"{args.dump} --prompt 0 --render"
    )
    if args.plot:  # every other method on the same questions, from a fresh agent as its own dump
        panels = []
        for name, other in rollout.ALGOS.items():
            fresh = rollout.Agent(engine, retriever, tok, agent_cfg, args.seed)
            rng, knobs = random.Random(args.seed), other.grow_knobs(r)
            batch = prompts if name == r.algo else other.grow(fresh, rows, rng, **knobs)
            trees = batch[args.plot_prompt]
            used = ", ".join(f"{k}={v}" for k, v in knobs.items())
            tokens = sum(t.stats["generated_tokens"] for t in trees)
            credit = other.credit(trees, **other.credit_knobs(r, c))
            panels.append(
                {
                    "algo": name,
                    "nodes": drawing(trees, credit, tree_module),
                    "note": f"{used}\n{tokens} tokens generated",
                }
            )
        ex = rows[args.plot_prompt]
        draw.figure(panels, args.plot, f"{ex.question}  (answer: {' / '.join(ex.golden_answers)})")
        print(f"prompt {args.plot_prompt} under every method -> {args.plot}")
