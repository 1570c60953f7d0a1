"""Writes tests/fixtures/oracle_credit.json: the official code of GiGPO, AT2PO, TreePO, VinePPO,
IGPO (both orders) and MT-GRPO run on seeded random prompts built as our Trees, their inputs and
outputs side by side.

    python benchmarks/checks/oracle_credit.py \\
        --gigpo ORACLE_DIR/core_gigpo.py --gigpo_from "OWNER/REPO PATH COMMIT" \\
        --at2po ORACLE_DIR/ATPO --at2po_from "OWNER/REPO PATH COMMIT" \\
        --treepo ORACLE_DIR/core_algos.py --treepo_from "OWNER/REPO PATH COMMIT" \\
        --vineppo ORACLE_DIR/math_episode_generator_with_mc_advantages.py \\
        --vineppo_from "OWNER/REPO PATH COMMIT" \\
        --igpo ORACLE_DIR/igpo_core_algos.py --igpo_from "OWNER/REPO PATH COMMIT" \\
        --igpo_first ORACLE_DIR/igpo_first_core_algos.py --igpo_first_from "..." \\
        --mtgrpo ORACLE_DIR/trainers --mtgrpo_from "OWNER/REPO PATH COMMIT"

A method left out keeps its entry of the fixture as it is. The official files are local copies
given on the command line, never part of this repository: their code is read and run here, at
generation time, and only numbers are written. What each file needs and we do not have (verl's
DataProto and torch_functional, a logger, the reward function) is a small shim below; the rest runs
as written:
- GiGPO (`gigpo/core_gigpo.py`): `compute_step_discounted_returns` on a shim batch, then
  `compute_gigpo_outcome_advantage` ("mean_std_norm", exact state matching), once as written
  (episode statistics over step rows) and once with `episode_norm_reward`'s
  `compute_mean_std_cross_steps=False` (per trajectory, Eq. 3); each with the anchor observation
  as text and as a doc-id set. One row per step of every chain not discarded.
- AT2PO (the tree rollout file under `--at2po`): class `ToolTreeNode` and, from
  `generate_sequences`, the three statements that z-score the leaves (`leaf_value_norm`), set
  `node_value_mode`'s values and `node_adv_mode`'s advantages, for every pair of modes.
- TreePO (`verl/trainer/ppo/core_algos.py`): its tree estimator,
  `compute_tree_reinforce_plus_plus_baseline_outcome_advantage`, with its script's "average"
  weighting and the batch whitening left out (treepo-unwhitened).
- VinePPO (`treetune/episode_generators/math_episode_generator_with_mc_advantages.py`): of its
  class MathEpisodeGeneratorWithMCAdvantages, `_compute_mc_value` (V of a state, the mean reward of
  its rollouts; an unfinished one scores the unfinished-response penalty, 0 in its math runs) on
  each context's continuations (a discarded one left out), then `_compute_step_advantages` on each
  trained chain's values. The prompt is one state for all its chains, as the official code's
  de-duplication of equal queries makes it.
- IGPO (`verl/trainer/ppo/core_algos.py`; its part and MT-GRPO's:
  benchmarks/checks/oracle_turns.py): the maintained `compute_grpo_outcome_advantage` ("separate",
  gamma 1: z-scored, then discounted) and the first release's `compute_grpo_discounted_advantage`
  (discounted, then z-scored: IGPO #5) on batches of GRPO chains, a row each, a turn's reward (its
  gain in P = exp(gold_logp), R at the last) at its last token.
- MT-GRPO (`verifiers/trainers/`): `_compute_normalized_advantages` of the turn and outcome rewards
  (its turn reward: our `turns.turn_reward`), `_find_result_positions` and `_assign_advantages` on
  batches of two-turn chains (search, answer), G a prompt.
tests/test_beyond_credit.py, tests/test_vineppo.py and tests/test_turns.py run our functions on the
same trees and compare the numbers.
"""

import ast
import contextlib
import functools
import io
import json
import logging
import random
import sys
import types
import typing
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from advantages import GIGPO_GAMMA
from infra import files, flags
from tree import Node, Tree, leaves, path, scored_leaves, walk

REWARDS = [0.0, 1.0, 0.5, 0.25, -0.5]  # exact in float32: the official code's ties stay exact
AT2PO_MODES = {"child": "child_mean", "entropy": "child_softmax", "leaf": "leaf_mean"}
AT2PO_ADVANTAGES = {
    "value": "node_value",
    "parent": "diff_parent",
    "root": "diff_global",
    "both": "diff_localglobal",
}
AT2PO_FILE = (
    "ATPO/verl_atpo/verl/workers/rollout/vllm_rollout/vllm_rollout_with_tools_tree_offline.py"
)


@dataclass
class Args:
    gigpo: str = ""
    """A local copy of verl-agent's gigpo/core_gigpo.py ("": GiGPO's entry kept as it is)."""
    gigpo_from: str = ""
    """Where it came from: "OWNER/REPO PATH COMMIT"."""
    at2po: str = ""
    """A local copy of the AT2PO repository (at least its tree rollout file, at its path)."""
    at2po_from: str = ""
    """Where it came from: "OWNER/REPO PATH COMMIT"."""
    treepo: str = ""
    """A local copy of TreePO's verl/trainer/ppo/core_algos.py."""
    treepo_from: str = ""
    """Where it came from: "OWNER/REPO PATH COMMIT"."""
    vineppo: str = ""
    """A local copy of VinePPO's math_episode_generator_with_mc_advantages.py."""
    vineppo_from: str = ""
    """Where it came from: "OWNER/REPO PATH COMMIT"."""
    igpo: str = ""
    """A local copy of IGPO's verl/trainer/ppo/core_algos.py as maintained (normalise, then
    discount)."""
    igpo_from: str = ""
    """Where it came from: "OWNER/REPO PATH COMMIT"."""
    igpo_first: str = ""
    """A local copy of the first released IGPO core_algos.py (discount, then normalise: IGPO #5)."""
    igpo_first_from: str = ""
    """Where it came from: "OWNER/REPO PATH COMMIT"."""
    mtgrpo: str = ""
    """A local copy of MT-GRPO's verifiers/trainers/ folder (mt_grpo_env_trainer.py and
    grpo_env_trainer.py)."""
    mtgrpo_from: str = ""
    """Where it came from: "OWNER/REPO PATH COMMIT"."""
    out: str = "tests/fixtures/oracle_credit.json"
    """The fixture to write."""
    seed: int = 0
    """Seed of the random prompts."""
    cases: int = 8
    """Random batches (GiGPO, TreePO) or trees (AT2PO) per method."""


def source(spec: str) -> dict:
    repo, path_, commit = spec.split()
    return {"repo": repo, "path": path_, "commit": commit}


def run_quietly(f, *args, **kwargs):
    """Call `f`, its prints (group-size summaries, progress) swallowed."""
    with contextlib.redirect_stdout(io.StringIO()):
        return f(*args, **kwargs)


# --------------------------------------------------------------------------------------------------
# Random trees


def step(parent: Node, rng: random.Random) -> Node:
    """A random step under `parent`: a few log-probs, an observation text and doc ids drawn from
    small pools, so that states repeat across chains."""
    lp = [round(-3 * rng.random(), 3) for _ in range(rng.randint(1, 5))]
    docs = rng.sample(["d1", "d2", "d3"], rng.randint(0, 2))
    return parent.add_child(logprobs=lp, obs_text=rng.choice(["o1", "o2"]), doc_ids=docs)


def end(leaf: Node, rng: random.Random, discard: bool) -> None:
    """Reward a leaf; now and then flag it truncated (still scored) or, if `discard`, env_error."""
    leaf.reward = rng.choice(REWARDS)
    if rng.random() < 0.15:
        leaf.flags.append("truncated")
    elif discard and rng.random() < 0.15:
        leaf.flags.append("env_error")


def chains(prompt: str, rng: random.Random) -> list[Tree]:
    """A prompt's GRPO chains (2-5, 1-4 steps each); at least two are scored."""
    while True:
        trees = []
        for i in range(rng.randint(2, 5)):
            node = Node(f"{prompt}c{i}")
            trees.append(Tree(node))
            for _ in range(rng.randint(1, 4)):
                node = step(node, rng)
            end(node, rng, discard=True)
        if sum(len(scored_leaves(t.root)) for t in trees) >= 2:
            return trees


def branching(root_id: str, rng: random.Random, discard: bool) -> Tree:
    """A random tree of 2 or more leaves: each node below depth 4 has 1-3 children."""
    while True:
        root = Node(root_id)
        grow = [root]
        while grow:
            node = grow.pop()
            k = rng.choice([1, 1, 2, 3]) if node.depth < 4 else 0
            k = max(k, 2) if node.parent is None else k
            if node.parent is not None and (k == 0 or rng.random() < 0.25):
                end(node, rng, discard)
                continue
            grow += [step(node, rng) for _ in range(k)]
        if len(scored_leaves(root)) >= 2:
            return Tree(root)


# --------------------------------------------------------------------------------------------------
# GiGPO


def load_gigpo(file: str) -> dict:
    """The namespace of core_gigpo.py, run with a stub for `from verl import DataProto`."""
    verl = types.ModuleType("verl")
    verl.DataProto = object  # only a type annotation there
    sys.modules.setdefault("verl", verl)
    ns = {"__name__": "core_gigpo"}
    exec(compile(Path(file).read_text(), file, "exec"), ns)
    return ns


def anchor(node: Node, docs: bool):
    """The anchor observation of the step `node` as verl-agent's search setting has it: the question
    at the first step, else the latest observation; `docs`: the doc ids, sorted (text if none)."""
    parent = node.parent
    if parent.parent is None:
        return "question"
    return tuple(sorted(parent.doc_ids)) if docs and parent.doc_ids else parent.obs_text


def gigpo_case(ns: dict, prompts: list[list[Tree]]) -> dict:
    """One batch of the official code: a row per step of every scored chain of every prompt."""
    rows = [
        (p, leaf, s)
        for p, trees in enumerate(prompts)
        for t in trees
        for leaf in scored_leaves(t.root)
        for s in path(leaf)
    ]
    n = len(rows)
    batch = SimpleNamespace(
        non_tensor_batch={
            "rewards": np.array([leaf.reward if s is leaf else 0.0 for _, leaf, s in rows]),
            "traj_uid": np.array([leaf.id for _, leaf, _ in rows], dtype=object),
            "active_masks": np.ones(n, dtype=bool),
        },
        batch={"input_ids": torch.zeros(n, 1)},
    )
    returns = run_quietly(ns["compute_step_discounted_returns"], batch, gamma=GIGPO_GAMMA)  # (n,)
    # every row carries its episode's reward at its last token, as verl-agent's reward manager
    token_rewards = torch.zeros(n, 3, dtype=torch.float64)  # (n, T)
    token_rewards[:, -1] = torch.tensor([leaf.reward for _, leaf, _ in rows], dtype=torch.float64)
    index = np.array([str(p) for p, _, _ in rows], dtype=object)
    traj = np.array([leaf.id for _, leaf, _ in rows], dtype=object)
    out = {}
    original = ns["episode_norm_reward"]
    for stats, cross_steps in (("rows", True), ("chains", False)):
        ns["episode_norm_reward"] = functools.partial(
            original, compute_mean_std_cross_steps=cross_steps
        )
        for state in ("obs", "docs"):
            obs = np.empty(n, dtype=object)
            obs[:] = [anchor(s, state == "docs") for _, _, s in rows]
            scores, _ = run_quietly(
                ns["compute_gigpo_outcome_advantage"],
                token_rewards,
                returns.double(),  # (n,): the float32 returns, exactly, in float64 from here on
                torch.ones(n, 3, dtype=torch.float64),
                obs,
                index,
                traj,
                epsilon=1e-6,
                step_advantage_w=1.0,
                mode="mean_std_norm",
            )
            adv = defaultdict(list)
            for (_, leaf, _), a in zip(rows, scores[:, 0].tolist()):
                adv[leaf.id].append(a)
            out[f"{state},{stats}"] = dict(adv)
    ns["episode_norm_reward"] = original
    R = defaultdict(list)
    for (_, leaf, _), r in zip(rows, returns.tolist()):
        R[leaf.id].append(r)
    return {
        "prompts": [[t.to_dict() for t in trees] for trees in prompts],
        "returns": dict(R),
        "advantages": out,
    }


# --------------------------------------------------------------------------------------------------
# AT2PO


def load_at2po(folder: str):
    """ToolTreeNode and the credit statements of `generate_sequences` (steps 1-3 of its
    `node_adv_mode != "vanilla"` branch), as a function credit(self, root_nodes,
    samples_per_tree)."""
    file = Path(folder) / AT2PO_FILE
    module = ast.parse(file.read_text())
    (node_class,) = [n for n in module.body if getattr(n, "name", "") == "ToolTreeNode"]
    (method,) = [n for n in ast.walk(module) if getattr(n, "name", "") == "generate_sequences"]
    (branch,) = [
        n
        for n in ast.walk(method)
        if isinstance(n, ast.If) and "node_adv_mode == 'vanilla'" in ast.unparse(n.test)
    ]
    credit = [
        s
        for s in branch.orelse
        if isinstance(s, ast.If)
        and any(
            k in ast.unparse(s.test) for k in ("leaf_value_norm", "node_value_mode", "node_adv")
        )
    ]
    if len(credit) != 3:
        raise SystemExit(f"{file}: expected the 3 credit statements, found {len(credit)}")
    body = "\n".join("    " + line for s in credit for line in ast.unparse(s).splitlines())
    code = f"{ast.unparse(node_class)}\n\ndef credit(self, root_nodes, samples_per_tree):\n{body}\n"
    ns = {"np": np, "logger": logging.getLogger("at2po"), "random": random}
    ns |= {"List": list, "Dict": dict, "Optional": typing.Optional}
    exec(compile(code, str(file), "exec"), ns)
    return ns["ToolTreeNode"], ns["credit"]


def at2po_case(ToolTreeNode, credit, t: Tree) -> dict:
    """The official credit of one tree for every (node_value_mode, node_adv_mode)."""
    out = {}
    for value, value_mode in AT2PO_MODES.items():
        for advantage, adv_mode in AT2PO_ADVANTAGES.items():
            theirs = {}
            for n in walk(t.root):
                lp = n.logprobs
                theirs[n] = ToolTreeNode(
                    tree_uid="t",
                    node_uid=n.id,
                    prompt_token_ids=[],
                    curr_token_ids=[],
                    result_mask=[],
                    parent_node=theirs.get(n.parent),
                    is_root=n.parent is None,
                    is_leaf=not n.children,
                    depth=n.depth,
                    entropy=-sum(lp) / len(lp) if lp else 0.0,  # as its rollout sets it
                )
                if n.parent is not None:
                    theirs[n.parent].add_child(theirs[n])
                    theirs[n].value = n.reward if not n.children else None
            self = SimpleNamespace(
                leaf_value_norm=True, node_value_mode=value_mode, node_adv_mode=adv_mode
            )
            run_quietly(credit, self, [theirs[t.root]], len(t.leaves()))
            out[f"{value},{advantage}"] = {
                n.id: [float(x.value), float(x.advantage)] for n, x in theirs.items() if n.parent
            }
    return {"tree": t.to_dict(), "credit": out}


# --------------------------------------------------------------------------------------------------
# TreePO


def load_treepo(file: str):
    """compute_tree_reinforce_plus_plus_baseline_outcome_advantage, its batch whitening an
    identity (treepo-unwhitened)."""
    module = ast.parse(Path(file).read_text())
    name = "compute_tree_reinforce_plus_plus_baseline_outcome_advantage"
    (f,) = [n for n in module.body if getattr(n, "name", "") == name]
    verl_F = SimpleNamespace(masked_whiten=lambda values, mask: values)
    ns = {"torch": torch, "np": np, "defaultdict": defaultdict, "verl_F": verl_F}
    exec(compile(ast.unparse(f), file, "exec"), ns)
    return ns[name]


def treepo_case(f, prompts: list[list[Tree]]) -> dict:
    """One batch: a row per scored leaf, its uid the prompt and the ids on its path joined by "#"
    (a tree's root among them when the prompt has several trees)."""
    rows = []
    for p, trees in enumerate(prompts):
        for t in trees:
            top = [t.root.id] if len(trees) > 1 else []
            rows += [
                (leaf, "#".join([f"p{p}", *top, *(s.id for s in path(leaf))]))
                for leaf in scored_leaves(t.root)
            ]
    token_rewards = torch.zeros(len(rows), 3, dtype=torch.float64)  # (n, T)
    token_rewards[:, -1] = torch.tensor([leaf.reward for leaf, _ in rows], dtype=torch.float64)
    index = np.array([uid for _, uid in rows], dtype=object)
    scores, _ = f(
        token_rewards, torch.ones_like(token_rewards), index, adv_weight_strategy="average"
    )
    return {
        "prompts": [[t.to_dict() for t in trees] for trees in prompts],
        "advantages": {leaf.id: a for (leaf, _), a in zip(rows, scores[:, 0].tolist())},
    }


# --------------------------------------------------------------------------------------------------
# VinePPO

VINEPPO_CLASS = "MathEpisodeGeneratorWithMCAdvantages"


def vine_chain(node: Node, steps: int, rng: random.Random) -> Node:
    """A chain of `steps` random steps below `node`, its leaf rewarded by `end`; one cut by the
    token budget gets reward 0, as the agent gives it (the official code: the unfinished-response
    penalty, 0 in its math runs)."""
    for _ in range(steps):
        node = step(node, rng)
    end(node, rng, discard=True)
    if "truncated" in node.flags:
        node.reward = 0.0
    return node


def vine_tree(prompt: str, rng: random.Random) -> Tree:
    """One prompt as rollout.vineppo grows it: 1-4 chains of 1-4 steps from the root, their leaves
    marked `sampled`; from the root and every step but the last of each scored chain, 1-4
    continuations of 1-3 steps, at least one of them not discarded."""
    root = Node(prompt)
    mains = [vine_chain(root, rng.randint(1, 4), rng) for _ in range(rng.randint(1, 4))]
    for leaf in mains:
        leaf.sampled = True
    for s in dict.fromkeys(s for x in mains if x.scored for s in [root, *path(x)[:-1]]):
        ends = [vine_chain(s, rng.randint(1, 3), rng) for _ in range(rng.randint(1, 4))]
        while not any(x.scored for x in ends):
            ends.append(vine_chain(s, 1, rng))
    return Tree(root)


def load_vineppo(file: str):
    """`_compute_mc_value` and `_compute_step_advantages` of MathEpisodeGeneratorWithMCAdvantages,
    as functions of (self, ...), run as written."""
    module = ast.parse(Path(file).read_text())
    (cls,) = [n for n in module.body if getattr(n, "name", "") == VINEPPO_CLASS]
    wanted = ("_compute_mc_value", "_compute_step_advantages")
    found = {n.name: n for n in cls.body if getattr(n, "name", "") in wanted}
    if set(found) != set(wanted):
        raise SystemExit(f"{file}: {VINEPPO_CLASS} lacks {sorted(set(wanted) - set(found))}")
    ns = {"json": json} | {k: getattr(typing, k) for k in ("Any", "Dict", "List", "Tuple", "Union")}
    exec(compile("\n\n".join(ast.unparse(found[k]) for k in wanted), file, "exec"), ns)
    return ns["_compute_mc_value"], ns["_compute_step_advantages"]


class Rewards:
    """The official reward function's interface on our leaves: the rollout text is a leaf id."""

    def __init__(self, t: Tree):
        self.reward = {x.id: x.reward for x in walk(t.root) if not x.children}

    def __call__(self, query, rollout, data_instance):
        return self.reward[rollout], False

    def get_unfinished_response_penalty(self) -> float:
        return 0.0  # its math runs' unfinished_response_penalty


def vineppo_case(mc_value, step_advantages, t: Tree) -> dict:
    """V of every context of a scored chain (the official `_compute_mc_value` on its continuations,
    the children that lead to no `sampled` leaf, a discarded one left out) and each such chain's
    step advantages (`_compute_step_advantages`, the reward on its last step)."""
    self = SimpleNamespace(reward_function=Rewards(t))
    chains_ = [x for x in leaves(t.root) if x.sampled and x.scored]
    values = {}
    for s in dict.fromkeys(s for x in chains_ for s in [t.root, *path(x)[:-1]]):
        rollouts = [
            {"answer": x.id, "finish_reason": "length" if "truncated" in x.flags else "stop"}
            for c in s.children
            if not any(y.sampled for y in leaves(c))
            for x in scored_leaves(c)
        ]
        result = {"_treetune__reasoning_tree": json.dumps({"children": rollouts})}
        values[s.id] = mc_value(self, query="", value_estimation_result=result, data_instance={})
    advantages = {}
    for x in chains_:
        states = [t.root, *path(x)[:-1]]
        trajectory = {
            "step_rewards": [0.0] * (len(states) - 1) + [x.reward],
            "values": [values[s.id] for s in states] + [None],  # the terminal state's: 0
        }
        advantages[x.id] = step_advantages(self, trajectory)
    return {"tree": t.to_dict(), "values": values, "advantages": advantages}


def main():
    (args,) = flags.parse(Args)
    methods = ("gigpo", "at2po", "treepo", "vineppo", "igpo", "igpo_first", "mtgrpo")
    given = [m for m in methods if getattr(args, m)]
    flags.check(
        args,
        [],
        [(not given, f"give the official code of at least one of {methods} (--gigpo FILE ...)")]
        + [
            (not getattr(args, m + "_from"), f'--{m} needs --{m}_from "OWNER/REPO PATH COMMIT"')
            for m in given
        ],
    )
    fixture = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    fixture["about"] = (
        "written by benchmarks/checks/oracle_credit.py, read by tests/test_beyond_credit.py, "
        "tests/test_vineppo.py and tests/test_turns.py"
    )
    fixture.setdefault("sources", {}).update({m: source(getattr(args, m + "_from")) for m in given})
    # GiGPO's, then AT2PO's, then TreePO's cases: one stream, so a method given alone draws other
    # cases than in a full run (VinePPO's stream is its own)
    rng = random.Random(args.seed)
    if args.gigpo:
        gigpo_ns = load_gigpo(args.gigpo)
        fixture["gigpo"] = [
            gigpo_case(gigpo_ns, [chains(f"p{p}", rng) for p in range(rng.randint(1, 3))])
            for _ in range(args.cases)
        ]
    if args.at2po:
        ToolTreeNode, credit = load_at2po(args.at2po)
        fixture["at2po"] = [
            at2po_case(ToolTreeNode, credit, branching(f"t{i}", rng, discard=False))
            for i in range(args.cases)
        ]
    if args.treepo:
        treepo = load_treepo(args.treepo)
        fixture["treepo"] = [
            treepo_case(
                treepo,
                [
                    [branching(f"p{p}t{m}", rng, True) for m in range(rng.choice([1, 1, 2]))]
                    for p in range(rng.randint(1, 3))
                ],
            )
            for _ in range(args.cases)
        ]
    if args.vineppo:
        vine_rng, (mc_value, step_advantages) = random.Random(args.seed), load_vineppo(args.vineppo)
        fixture["vineppo"] = [
            vineppo_case(mc_value, step_advantages, vine_tree(f"p{i}", vine_rng))
            for i in range(args.cases)
        ]
    from benchmarks.checks.oracle_turns import (  # the turn-level credits' cases
        igpo_case,
        igpo_prompts,
        load_igpo,
        load_mtgrpo,
        mtgrpo_case,
        mtgrpo_prompts,
    )

    if args.igpo or args.igpo_first:  # one stream for both orders: the same batches
        igpo_rng = random.Random(args.seed)
        maintained = load_igpo(args.igpo, "compute_grpo_outcome_advantage") if args.igpo else None
        first = (
            load_igpo(args.igpo_first, "compute_grpo_discounted_advantage")
            if args.igpo_first
            else None
        )
        fixture["igpo"] = [
            igpo_case(maintained, first, igpo_prompts(igpo_rng)) for _ in range(args.cases)
        ]
    if args.mtgrpo:
        mt_rng, official = random.Random(args.seed), load_mtgrpo(args.mtgrpo)
        fixture["mtgrpo"] = [
            mtgrpo_case(*official, mtgrpo_prompts(mt_rng)) for _ in range(args.cases)
        ]
    files.write_json(args.out, fixture)
    print(f"wrote {args.out}: {args.cases} cases of {', '.join(given)}")


if __name__ == "__main__":
    main()
