"""`python advantages.py`'s command line (advantages.py runs this file by name; `python -m
scripts.credit` is the same): one prompt's trees -> every step's credit as JSON, the worked demo
with every method side by side, Tree-GRPO's budget; with what only it and the rollout dump
(scripts/dump.py) use: trees on disk, trees as `infra.draw` data. The credit functions are the
registry's, `rollout.ALGOS`.

Deviations from the papers, each cited by its name (argued in docs/paper_code.md):
- budget-formula: Tree-GRPO's E[B] = M*B + M*L*N*B/2 (its Tables 3, 7); its text: M*B + L*N*B/2
"""

import json
import math
import sys
from dataclasses import dataclass
from typing import Literal

import rollout
import tree
from advantages import CreditConfig
from infra import draw, files, flags

# --------------------------------------------------------------------------------------------------
# Trees on disk and as `infra.draw` data


def save_trees(tree_groups: list[list], path_: str) -> None:
    """Write a JSON list with one entry per prompt, each entry that prompt's trees (whole or not at
    all)."""
    files.write_json(path_, [[t.to_dict() for t in trees] for trees in tree_groups], indent=1)


MAX_DEPTH = 100  # steps on one path of a trees file: far more than any rollout's --max_turns, well
# within Python's recursion limit, which tree.py's walks (recursive) stay under
MAX_REWARD = 1e150  # |reward| above it: the group statistics (sums of squared rewards) overflow


def load_trees(path_: str, prompt: int | None, for_credit: bool = False) -> list[tree.Tree]:
    """The trees of ONE prompt: from a JSON list of tree dicts, or entry `prompt` of a `save_trees`
    rollout dump; shaped as tree.py reads them (`check_shape`, then its
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
    trees = [tree.Tree.from_dict(t) for t in data]  # unknown keys and flags named there
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
    "flags" a list of strings, at most MAX_DEPTH steps deep."""
    for node, depth, where in nodes(trees):
        if not isinstance(node, dict):
            problem = f"{where} is a {type(node).__name__}, not a node object"
        elif not isinstance(node.get("id"), str):
            problem = f"{where}: 'id' must be a string, got {node.get('id')!r}"
        elif not isinstance(node.get("children", []), list):
            got = type(node["children"]).__name__
            problem = f"node {node['id']!r}: 'children' must be a list of nodes, got a {got}"
        elif not isinstance(node.get("flags", []), list) or not all(
            isinstance(flag, str) for flag in node.get("flags", [])
        ):
            problem = (
                f"node {node['id']!r}: 'flags' must be a list of strings, got {node['flags']!r}"
            )
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
    an id twice (the output's "nodes" is keyed by id), a reward that is not a finite number or is
    beyond ±MAX_REWARD (the group's mean and std would overflow: every advantage 0, or NaN), a leaf
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
        elif reward is not None and (
            type(reward) not in (int, float)
            or (type(reward) is float and not math.isfinite(reward))
        ):  # an int of any size is finite (math.isfinite would overflow on it): MAX_REWARD's check
            problem = f"node {name!r}: 'reward' must be a finite number, got {reward!r}"
        elif reward is not None and abs(reward) > MAX_REWARD:
            got = (
                repr(reward)
                if type(reward) is float
                else f"an integer of {len(str(reward))} digits"
            )
            problem = (
                f"node {name!r}: 'reward' {got} is beyond ±{MAX_REWARD:g}, where the group's mean "
                "and std overflow (every advantage 0, or NaN); rescale the rewards"
            )
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


def drawing(trees: list, trajectories: list) -> list[dict]:
    """Plain data for `infra.draw`, one dict per node of `trees`, parents first: id, parent id, kind
    (prompt, search, answer, invalid, truncated, discarded; step: no action set), the step's credit
    (None: not trained), a leaf's reward, the marks it carries (BranPO's prefix_end and redundant;
    TreePS-RAG's sampled and retained, i.e. kept by the pruning; fork: more than one child) and how
    many of its sampled children were dropped (BranPO's unkept branches, TreePS-RAG's pruned)."""
    credit, rows = tree.step_credit(trajectories), []
    for n in (n for t in trees for n in tree.walk(t.root)):
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


ON_CHAINS = (
    "grpo",
    "gigpo",
    "igpo",
    "mtgrpo",
)  # credits of GRPO chains: the demo's paths as chains


def vineppo_chain(worked: tree.Tree) -> tree.Tree:
    """The worked tree as VinePPO reads it: a copy whose first path, q.0 -> q.0.0, is the trained
    chain (its leaf marked `sampled`); the other paths are its Monte Carlo continuations, one from
    the prompt (q.1 -> q.1.0) and two from the context after q.0 (q.0.1 -> q.0.1.0, q.0.2)."""
    copy = tree.Tree.from_dict(worked.to_dict())
    copy.find("q.0.0").sampled = True
    return copy


def demo(credits: dict, cfg):
    """A worked tree (one prompt, two original trajectories: one with branches and a redundant step,
    one split at its last step with no branch kept) and every method's trajectories on it (GRPO's,
    GiGPO's, IGPO's and MT-GRPO's on the tree's root-to-leaf paths, each copied into a chain of its
    own; VinePPO's on `vineppo_chain`). `credits`: name -> credit function (advantages.py's or
    turns.py's), each run with `cfg` (a CreditConfig: the command's credit flags)."""
    worked = tree.Tree.from_dict(
        {
            "id": "q",
            "question": "Who founded Acme?",
            "golden_answers": ["Ivo"],
            "gold_logp": math.log(0.3),  # IGPO's P(gold): 0.3 at the prompt, 0.8 after q.0,
            "children": [  # 0.85 after q.0.1, 0.1 after q.1
                {
                    "id": "q.0",
                    "action": "search",
                    "query": "who founded Acme",
                    "obs_text": "<information>Acme was founded by Ivo Ra.</information>",
                    "gold_logp": math.log(0.8),
                    "prefix_end": True,
                    "children": [
                        {"id": "q.0.0", "action": "answer", "answer": "Ivo", "reward": 1.0},
                        {
                            "id": "q.0.1",
                            "action": "search",
                            "query": "Ivo Ra birthplace",
                            "gold_logp": math.log(0.85),
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
                    "obs_text": "<information>Acme: a firm in Oda.</information>",
                    "gold_logp": math.log(0.1),
                    "prefix_end": True,
                    "children": [
                        {"id": "q.1.0", "action": "answer", "answer": "Oda", "reward": 0.0}
                    ],
                },
            ],
        }
    )
    leaves = tree.scored_leaves(worked.root)
    chains = [tree.Tree.from_dict(worked.to_dict()) for _ in leaves]
    for chain, leaf in zip(chains, leaves):
        for step in tree.path(chain.find(leaf.id)):
            step.parent.children = [step]  # prune the copy to the root-to-leaf path
    given = {name: chains for name in ON_CHAINS} | {"vineppo": [vineppo_chain(worked)]}
    runs = {name: fn(given.get(name, [worked]), cfg) for name, fn in credits.items()}
    return worked, runs


def report(algo: str, trees, trajectories) -> dict:
    """The CLI's JSON: per-node value/advantage and per-trajectory step advantages."""
    return {
        "algo": algo,
        "nodes": {
            n.id: {"value": n.value, "advantage": n.advantage}
            for t in trees
            for n in tree.walk(t.root)
            if n.parent is not None
        },
        "trajectories": [
            {"leaf": tr.leaf.id, "steps": [s.id for s in tr.steps], "advantages": tr.advantages}
            for tr in trajectories
        ],
    }


def demo_table(credits, cfg) -> str:
    """The worked tree, then one row per (trajectory, step) and one column per method (`credits`:
    name -> credit function, run with `cfg`)."""
    worked, runs = demo(credits, cfg)
    table = {
        (name, tr.leaf.id, step.id): a
        for name, trajectories in runs.items()
        for tr in trajectories
        for step, a in zip(tr.steps, tr.advantages)
    }
    credits["treeps"]([worked], cfg)  # leave TreePS-RAG's V and A on the rendered tree
    lines = [
        "TreePS-RAG values (V) and process advantages (A) on the tree:",
        worked.render(),
        "",
        "Advantage multiplying each step's tokens in each trajectory ('-' = not trained there):",
        f"{'leaf':8} {'step':8} " + " ".join(f"{k:>9}" for k in runs),
    ]
    for leaf in tree.scored_leaves(worked.root):
        for step in tree.path(leaf):
            cells = [table.get((k, leaf.id, step.id)) for k in runs]
            lines.append(
                f"{leaf.id:8} {step.id:8} "
                + " ".join(f"{'-' if c is None else f'{c:+.3f}':>9}" for c in cells)
            )
    return "\n".join(lines)


@dataclass
class CreditArgs:
    """`python advantages.py --algo ALGO --trees FILE.json`: per-step advantages of one prompt's
    rollout trees (the credit flags: CreditConfig)."""

    algo: Literal[*rollout.ALGOS] = "tree_grpo"
    """Whose credit function (rollout.ALGOS; with --trees or --budget)."""
    trees: str = ""
    """JSON list of trees for ONE prompt (see tree.py for the node format), or a rollout dump (with
    --prompt)."""
    prompt: int | None = None
    """With a rollout dump (one list of trees per prompt): which prompt."""
    budget: str = ""
    """With --algo tree_grpo: M,N,L -> rollouts and expected budget."""
    demo: bool = False
    """Print a worked tree with every method side by side, under the credit flags given."""
    render: bool = False
    """With --trees: also print the annotated tree(s) to stderr."""
    plot: str = ""
    """With --demo: also draw the tree under each method, steps coloured by credit, to this PNG."""


def main():
    """`python advantages.py ...`: CreditArgs and CreditConfig from the command line."""
    args, cfg = flags.parse(CreditArgs, CreditConfig)
    credits = {name: algo.credit for name, algo in rollout.ALGOS.items()}
    modes = [m for m in ("trees", "budget", "demo") if getattr(args, m)]
    no_plot = args.plot and files.unwritable(args.plot, "--plot")
    flags.check(
        args,
        [],
        [
            (len(modes) > 1, f"give one of --trees, --budget, --demo, not {len(modes)}"),
            (args.plot and not args.demo, "--plot goes with --demo"),
            (no_plot, no_plot),  # checked before the work, not after it
            (args.render and not args.trees, "--render goes with --trees"),
            (args.prompt is not None and not args.trees, "--prompt goes with --trees"),
        ],
    )
    if args.demo:
        print(demo_table(credits, cfg))
        if args.plot:
            worked, runs = demo(credits, cfg)
            chains = "the tree's 4 paths as 4 chains:\na step adds up the chains through it"
            vine = "the chain: to the green square; the\nother paths: its continuations"
            notes = {name: chains for name in ON_CHAINS} | {"vineppo": vine}
            drawn = {"vineppo": [vineppo_chain(worked)]}  # its `sampled` mark shown
            panels = [
                {
                    "algo": k,
                    "nodes": drawing(drawn.get(k, [worked]), trajectories),
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
            args,
            [],
            extra=[
                (args.algo != "tree_grpo", f"--budget goes with --algo tree_grpo, not {args.algo}"),
                (M < 1 or min(N, L) < 0, f"--budget {args.budget!r}: M must be >= 1 and N, L >= 0"),
            ],
        )
        rollouts, budget = tree_grpo_budget(M, N, L)
        print(json.dumps({"rollouts": rollouts, "budget": budget}))
    elif args.trees:
        try:
            trees = load_trees(args.trees, args.prompt, for_credit=True)
        except ValueError as e:  # the message names the file, the node and the field
            raise SystemExit(f"--trees: {e}") from None
        phase1 = any(n.phase1 for t in trees for n in tree.walk(t.root))
        if args.algo == "carl" and not cfg.carl_train_phase1 and not phase1:
            raise SystemExit(
                f'--no_carl_train_phase1: no step of {args.trees} is marked "phase1" (a dump '
                "older than the marks, or a hand-built tree), so the flag would change nothing; "
                'mark the first-phase chains\' steps "phase1": true, or drop the flag (the same '
                "numbers, every step trained)"
            )
        if args.algo == "vineppo" and not any(n.sampled for t in trees for n in tree.walk(t.root)):
            raise SystemExit(
                f'--algo vineppo: no leaf of {args.trees} is marked "sampled", so every path is a '
                "trained chain, none a Monte Carlo continuation, and nothing can be trained; mark "
                'the trained chains\' leaves "sampled": true (the other paths are their '
                "continuations, as rollout.vineppo writes them)"
            )
        try:
            trajectories = credits[args.algo](trees, cfg)
        except ValueError as e:  # a tree the method cannot credit: grpo's chains, branpo's marks
            raise SystemExit(f"--trees {args.trees} (--algo {args.algo}): {e}") from None
        out = report(args.algo, trees, trajectories)
        print(json.dumps(out, indent=1, allow_nan=False))  # valid JSON, or an error
        if args.render:
            print("\n\n".join(t.render() for t in trees), file=sys.stderr)
    else:
        raise SystemExit("give --trees FILE (and --algo), or --budget, or --demo")


if __name__ == "__main__":
    main()
