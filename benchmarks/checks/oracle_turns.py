"""The turn-level credits' part of benchmarks/checks/oracle_credit.py (its command writes them into
tests/fixtures/oracle_credit.json): IGPO's official advantage in both orders and MT-GRPO's, run as
written on seeded random GRPO chains built as our Trees, a row of tokens per chain, each turn's
reward at its last token. Only numbers are written; the official files are local copies.
"""

import ast
import math
import random
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import turns
from benchmarks.checks.oracle_credit import REWARDS, chains, run_quietly
from tree import Node, Tree, leaves, path, scored_leaves, walk


def function(file: str, name: str, ns: dict):
    """Define the module-level function `name` of `file` in `ns`, run as written."""
    module = ast.parse(Path(file).read_text())
    found = [n for n in module.body if getattr(n, "name", "") == name]
    if not found:
        raise SystemExit(f"{file} has no function {name}")
    exec(compile(ast.unparse(found[0]), file, "exec"), ns)
    return ns[name]


def igpo_prompts(rng: random.Random) -> list[list[Tree]]:
    """1-3 prompts of 2-5 chains (`chains`), each inner node with a gold_logp: log P, P uniform in
    (0.01, 0.99) (no two equal: the official code finds a turn's end by a non-zero reward); the
    prompt's P shared by its chains."""
    prompts = []
    for p in range(rng.randint(1, 3)):
        trees, root = chains(f"p{p}", rng), math.log(rng.uniform(0.01, 0.99))
        for t in trees:
            t.root.gold_logp = root
            for n in walk(t.root):
                if n.children and n.parent is not None:
                    n.gold_logp = math.log(rng.uniform(0.01, 0.99))
        prompts.append(trees)
    return prompts


def turn_rows(prompts: list[list[Tree]], rewards) -> tuple:
    """A row per scored chain: each step 1-5 tokens (mask 1; its observation left out, as it is
    out of the loss), `rewards(leaf)` at each step's last token, padded with mask 0. Returns the
    rows' leaves, their turns' last positions, token rewards (n, T), response mask (n, T), the
    prompt index per row."""
    rows = [(p, x) for p, trees in enumerate(prompts) for t in trees for x in scored_leaves(t.root)]
    lengths = [[len(s.logprobs) for s in path(x)] for _, x in rows]
    T = max(sum(n) for n in lengths)
    token_rewards, mask = torch.zeros(len(rows), T), torch.zeros(len(rows), T, dtype=torch.long)
    ends = []
    for i, ((_, x), n) in enumerate(zip(rows, lengths)):
        at = [sum(n[: k + 1]) - 1 for k in range(len(n))]
        token_rewards[i, at] = torch.tensor(rewards(x))
        mask[i, : sum(n)] = 1
        ends.append(at)
    index = np.array([str(p) for p, _ in rows], dtype=object)
    return [x for _, x in rows], ends, token_rewards, mask, index


def igpo_raw(x: Node) -> list[float]:
    """A chain's raw turn rewards: the gain in P = exp(gold_logp) per step but the last, then R."""
    P = [math.exp(s.gold_logp) for s in [path(x)[0].parent, *path(x)[:-1]]]
    return [b - a for a, b in zip(P, P[1:])] + [x.reward]


def igpo_case(maintained, first, prompts: list[list[Tree]]) -> dict:
    """One batch of both official orders (gamma 1, the official run's): the maintained
    `compute_grpo_outcome_advantage` ("separate": gains and outcomes z-scored apart, then
    discounted) and the first release's `compute_grpo_discounted_advantage` (discounted, then
    z-scored by the group's first returns); each turn's advantage read at its last token."""
    leaves_, ends, token_rewards, mask, index = turn_rows(prompts, igpo_raw)
    out = {}
    for name, f, kw in (
        ("normalize", maintained, {"info_gain_norm_mode": "separate"}),
        ("discount", first, {}),
    ):
        if f is None:
            continue
        A, _ = run_quietly(f, token_rewards.clone(), mask.clone(), index, gamma=1.0, **kw)
        out[name] = {
            x.id: [A[i, t].item() for t in at] for i, (x, at) in enumerate(zip(leaves_, ends))
        }
    return {"prompts": [[t.to_dict() for t in trees] for trees in prompts], "advantages": out}


def load_igpo(file: str, name: str):
    ns = {"torch": torch, "np": np, "defaultdict": defaultdict}
    ns["verl_F"] = SimpleNamespace(masked_whiten=lambda values, mask: values)
    if name == "compute_grpo_outcome_advantage":
        function(file, "_compute_turn_level_advantage", ns)
    return function(file, name, ns)


def mtgrpo_prompts(rng: random.Random) -> list[list[Tree]]:
    """1-3 prompts of G = 2-5 chains (the official code reshapes by G), each its two turns: a
    search whose observation holds the gold ("Ivo") or not, then the answer, rewarded from
    REWARDS; none discarded (its batch has no notion of it)."""
    G, prompts = rng.randint(2, 5), []
    for p in range(rng.randint(1, 3)):
        trees = []
        for i in range(G):
            root = Node(f"p{p}c{i}")
            found = rng.random() < 0.5
            s = root.add_child(action="search", logprobs=[-1.0] * rng.randint(1, 4))
            s.obs_text = "<information>Doc 1 about IVO</information>" if found else "nothing"
            end = s.add_child(action="answer", logprobs=[-1.0] * rng.randint(1, 4))
            end.reward = rng.choice(REWARDS)
            trees.append(Tree(root, "q", ["Ivo"]))
        prompts.append(trees)
    return prompts


def load_mtgrpo(folder: str):
    """`_compute_normalized_advantages` (GRPOEnvTrainer), `_find_result_positions` and
    `_assign_advantages` (MTGRPOEnvTrainer), as functions of (self, ...), run as written."""
    found = {}
    for file, cls, name in (
        ("grpo_env_trainer.py", "GRPOEnvTrainer", "_compute_normalized_advantages"),
        ("mt_grpo_env_trainer.py", "MTGRPOEnvTrainer", "_find_result_positions"),
        ("mt_grpo_env_trainer.py", "MTGRPOEnvTrainer", "_assign_advantages"),
    ):
        module = ast.parse((Path(folder) / file).read_text())
        (c,) = [n for n in module.body if getattr(n, "name", "") == cls]
        (f,) = [n for n in c.body if getattr(n, "name", "") == name]
        ns = {"torch": torch}
        exec(compile(ast.unparse(f), file, "exec"), ns)
        found[name] = ns[name]
    return tuple(found.values())


def mtgrpo_case(normalized, find, assign, prompts: list[list[Tree]]) -> dict:
    """One batch of the official code (coefficient 1, its run's): turn and outcome rewards
    z-scored per prompt's G rows, then turn-1 tokens (before the first tool result) A_O + A_T,
    the rest A_O; each step's advantage read at its first token. The turn reward given it is our
    `turns.turn_reward` (its search rubric on our observations)."""
    rows = [x for trees in prompts for t in trees for x in leaves(t.root)]
    G = len(prompts[0])
    self = SimpleNamespace(
        num_generations=G,
        turn_advantage_coef=1.0,
        accelerator=SimpleNamespace(process_index=0, device="cpu"),
    )
    turn = torch.tensor([turns.turn_reward(path(x)[0], ["Ivo"]) for x in rows])
    outcome = torch.tensor([x.reward for x in rows])
    _, _, A_T = normalized(self, turn, len(rows))
    _, _, A_O = normalized(self, outcome, len(rows))
    _, _, A_C = normalized(self, turn + outcome, len(rows))
    n1 = [len(path(x)[0].logprobs) for x in rows]
    n2 = [len(path(x)[1].logprobs) for x in rows]
    T = max(a + 1 + b for a, b in zip(n1, n2))
    mask = torch.zeros(len(rows), T, dtype=torch.long)  # turn 1, a result token (0), turn 2
    for i, (a, b) in enumerate(zip(n1, n2)):
        mask[i, :a] = 1
        mask[i, a + 1 : a + 1 + b] = 1
    turn = [  # each row's conversation: the search, its tool result, the answer
        {"role": "assistant", "content": "<tool>search</tool>"},
        {"role": "user", "content": "<result>passages</result>"},
        {"role": "assistant", "content": "<answer>it</answer>"},
    ]
    segments = find(self, None, [turn] * len(rows))
    A = assign(self, mask, A_T, A_O, A_C, segments)
    return {
        "prompts": [[t.to_dict() for t in trees] for trees in prompts],
        "advantages": {x.id: [A[i, 0].item(), A[i, n1[i] + 1].item()] for i, x in enumerate(rows)},
    }
