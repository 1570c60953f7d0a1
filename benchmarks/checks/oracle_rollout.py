"""Writes tests/fixtures/oracle_rollout.json: the official code's rollout decisions for AT2PO and
ARPO on seeded random inputs, which tests/test_beyond_rollout.py checks `rollout.at2po_pick`,
`rollout.at2po_fit` and `rollout.arpo_branch` against. The official code is never copied into the
project: this script runs it from local copies of its files, given on the command line.

    git -C ATPO_GIT show HEAD:ATPO/verl_atpo/verl/workers/rollout/vllm_rollout/\\
vllm_rollout_with_tools_tree_offline.py > ATPO_COPY.py
    git -C ARPO_GIT show HEAD:ARPO/verl_arpo_entropy/verl/workers/rollout/vllm_rollout/\\
vllm_rollout_with_tools.py > ARPO_COPY.py
    python benchmarks/checks/oracle_rollout.py --atpo ATPO_COPY.py --atpo_git ATPO_GIT \\
        --arpo ARPO_COPY.py --arpo_git ARPO_GIT

ATPO_GIT and ARPO_GIT are git directories of zzfoutofspace/ATPO and dongguanting/ARPO (a bare
mirror will do): each copy must be its file at that directory's HEAD, whose commit the fixture
records. What runs, with the heavy imports (verl, vLLM, torch) left out:
- AT2PO: the class ToolTreeNode, taken from the file with `ast` and executed alone; its
  `sample_expansion_nodes(n, mode="entropy")` on random trees (entropies drawn from a few values,
  so that scores tie) and `sample_leaves(k)` (pruning and padding), its `random` a seeded
  random.Random.
- ARPO: the block of `generate_sequences` between "# Apply beam search" and "# Add new branches to
  existing lists", executed on random waves (prompts, their rollouts, the open ones and their
  entropies) with the official run's settings (beam 2, entropy weight 0.2, threshold 0.5) and a
  seeded random.Random as its `random`.
"""

import argparse
import ast
import json
import logging
import pathlib
import random
import subprocess
import sys
import textwrap
import types
from typing import Optional  # the official class's annotations name it, and List

import numpy

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "oracle_rollout.json"
ATPO = (
    "zzfoutofspace/ATPO",
    "ATPO/verl_atpo/verl/workers/rollout/vllm_rollout/vllm_rollout_with_tools_tree_offline.py",
)
ARPO = (
    "dongguanting/ARPO",
    "ARPO/verl_arpo_entropy/verl/workers/rollout/vllm_rollout/vllm_rollout_with_tools.py",
)
ARPO_SETTINGS = {"beam_size": 2, "entropy_weight": 0.2, "branch_probability": 0.5}
BLOCK = ("# Apply beam search", "# Add new branches to existing lists")
ENTROPIES = [0.0, 0.25, 0.5, 0.75, 1.0, 0.3, 0.35, 0.7]  # few values: many ties


def source(copy: str, git_dir: str, repo_path: tuple[str, str]) -> tuple[str, dict]:
    """The copy's text and {repo, path, commit}, after checking that the copy is the file at the
    git directory's HEAD."""
    repo, path = repo_path
    git = lambda *a: subprocess.run(["git", "-C", git_dir, *a], capture_output=True, text=True)
    head, committed = git("rev-parse", "HEAD"), git("show", f"HEAD:{path}")
    if head.returncode or committed.returncode:
        sys.exit(f"{git_dir}: not a git directory of {repo} with {path} at HEAD: {head.stderr}")
    text = pathlib.Path(copy).read_text(encoding="utf-8")
    if text != committed.stdout:
        sys.exit(f"{copy} is not {path} at {git_dir}'s HEAD; copy it with git show HEAD:{path}")
    return text, {"repo": repo, "path": path, "commit": head.stdout.strip()}


def tool_tree_node(text: str) -> tuple[type, dict]:
    """The official ToolTreeNode class, executed alone, and the namespace its methods read."""
    (cls,) = [n for n in ast.parse(text).body if getattr(n, "name", "") == "ToolTreeNode"]
    names = {"List": list, "Optional": Optional, "np": numpy}
    logger = logging.getLogger("official")
    logger.setLevel(logging.ERROR)  # its padding warns on every call
    names |= {"logger": logger, "random": random.Random(0)}
    exec(compile(ast.get_source_segment(text, cls), "ToolTreeNode", "exec"), names)
    return names["ToolTreeNode"], names


def random_tree(r: random.Random) -> tuple[list, list]:
    """(parents, entropies) of a random tree, node 0 the root (entropy 0: it samples nothing),
    every node's children in index order; the root has 1 to 4 children, a step 0 to 3."""
    parents, entropies, todo = [None], [0.0], [(0, 0)]
    while todo:
        node, depth = todo.pop(0)
        n = (
            r.randint(1, 4)
            if node == 0
            else 0
            if depth >= 4 or r.random() < 0.4
            else r.randint(1, 3)
        )
        for _ in range(n):
            parents.append(node)
            h = r.choice(ENTROPIES) if r.random() < 0.7 else round(r.uniform(0, 1.5), 4)
            entropies.append(h)
            todo.append((len(parents) - 1, depth + 1))
    return parents, entropies


def official_tree(Node: type, parents: list, entropies: list):
    """The tree as the official ToolTreeNode objects; node uids are the indices."""
    nodes = []
    for k, (p, h) in enumerate(zip(parents, entropies)):
        leaf = k not in parents
        node = Node(
            "t", str(k), [], [], [], parent_node=None if p is None else nodes[p],
            is_root=p is None, is_leaf=leaf, entropy=h,
        )  # fmt: skip
        if p is not None:
            nodes[p].add_child(node)
        nodes.append(node)
    return nodes


def at2po_cases(Node: type, names: dict, r: random.Random, count: int) -> tuple[list, list]:
    picks, fits = [], []
    for _ in range(count):
        parents, entropies = random_tree(r)
        root = official_tree(Node, parents, entropies)[0]
        n = r.randint(1, len(root.get_non_leaf_nodes()) + 3)
        picked = root.sample_expansion_nodes(n, mode="entropy")
        picks.append({"parents": parents, "entropies": entropies, "n": n})
        picks[-1]["picked"] = [int(x.node_uid) for x in picked]
        parents, entropies = random_tree(r)
        root = official_tree(Node, parents, entropies)[0]
        k, seed = r.randint(1, len(root.get_all_leaves()) + 3), r.randrange(2**31)
        names["random"] = random.Random(seed)
        root.sample_leaves(k)
        after = [root] + root.get_subtree_nodes()  # breadth first
        nodes = [[x.node_uid, x.parent_node and x.parent_node.node_uid] for x in after]
        fits.append({"parents": parents, "entropies": entropies, "k": k, "seed": seed})
        fits[-1]["nodes"] = nodes  # [uid, parent uid]; a copy's uid is "<leaf>_dup<j>"
    return picks, fits


def arpo_cases(text: str, r: random.Random, count: int) -> list:
    lines = text.splitlines()
    first, last = (next(i for i, x in enumerate(lines) if x.strip().startswith(m)) for m in BLOCK)
    block = compile(textwrap.dedent("\n".join(lines[first:last])), "beam block", "exec")
    cases = []
    for _ in range(count):
        prompts, M = r.randint(1, 4), r.randint(2, 8)
        n0 = r.randint(1, M)
        extra = [p for p in range(prompts) for _ in range(r.randint(0, M - n0))]
        r.shuffle(extra)
        owner = [p for p in range(prompts) for _ in range(n0)] + extra  # index -> prompt
        made = [owner.count(p) for p in range(prompts)]
        active = [i for i in range(len(owner)) if r.random() < 0.6]
        h_now = [round(r.uniform(0, 2.5), 4) for _ in active]
        h_first = [h if r.random() < 0.2 else round(r.uniform(0, 1.5), 4) for h in h_now]
        seed = r.randrange(2**31)
        self = types.SimpleNamespace(
            initial_entropy_dict=dict(zip(active, h_first)),
            entropy_weight=ARPO_SETTINGS["entropy_weight"],
            branch_probability=ARPO_SETTINGS["branch_probability"],
        )
        indices = {p: [i for i, o in enumerate(owner) if o == p] for p in range(prompts)}
        names = {
            "self": self, "random": random.Random(seed), "final_active_indices": list(active),
            "sample_to_indices": indices, "rollouts_per_sample": list(made), "num_samples": M,
            "batch_size": prompts, "beam_size": ARPO_SETTINGS["beam_size"],
            "current_entropy_dict": dict(zip(active, h_now)),
            "curr_inputs": [[str(i)] for i in range(len(owner))],
            "init_inputs": [[f"root{o}"] for o in owner],
            "result_masks": [[] for _ in owner], "call_counters": [0 for _ in owner],
        }  # fmt: skip
        exec(block, names)
        new = [[o, x[0]] for o, x in zip(names["new_sample_origins"], names["new_inputs"])]
        cases.append({"M": M, "owner": owner, "made": made, "active": active, "h_now": h_now})
        cases[-1] |= {"h_first": h_first, "seed": seed, "new": new}
        cases[-1]["made_after"] = names["rollouts_per_sample"]  # new: [prompt, "<index>" or root]
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atpo", required=True, help="a copy of " + ATPO[1])
    parser.add_argument("--atpo_git", required=True, help="a git directory of " + ATPO[0])
    parser.add_argument("--arpo", required=True, help="a copy of " + ARPO[1])
    parser.add_argument("--arpo_git", required=True, help="a git directory of " + ARPO[0])
    parser.add_argument("--cases", type=int, default=200, help="random cases of each kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    atpo_text, atpo = source(args.atpo, args.atpo_git, ATPO)
    arpo_text, arpo = source(args.arpo, args.arpo_git, ARPO)
    r = random.Random(args.seed)
    Node, names = tool_tree_node(atpo_text)
    picks, fits = at2po_cases(Node, names, r, args.cases)
    fixture = {"at2po_source": atpo, "arpo_source": arpo, "arpo_settings": ARPO_SETTINGS}
    fixture |= {"at2po_pick": picks, "at2po_fit": fits}
    fixture["arpo_branch"] = arpo_cases(arpo_text, r, args.cases)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    ties = sum(len({s for s in c["entropies"][1:]}) < len(c["entropies"]) - 1 for c in picks)
    print(
        f"wrote {args.out}: {len(picks)} AT2PO selections ({ties} trees with tied entropies), "
        f"{len(fits)} leaf fits, {len(fixture['arpo_branch'])} ARPO waves; sources: "
        f"{atpo['repo']}@{atpo['commit'][:12]}, {arpo['repo']}@{arpo['commit'][:12]}"
    )


if __name__ == "__main__":
    main()
