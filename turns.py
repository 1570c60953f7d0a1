"""Turn-level credit: a reward at every turn of a chain, not only at its end, turned into per-step
advantages; advantages.py's contract (one prompt's trees in, one `Trajectory` per trained leaf out,
`advantage` written on the nodes for display), its helpers and its option classes (IGPOCredit,
MTGRPOCredit, gathered in CreditConfig).
- IGPO: the turn's information gain, the rise in the policy's own probability of the gold answer
  (rollout.igpo writes each node's `gold_logp`); the outcome reward at the last turn.
- MT-GRPO: a verifiable turn reward (the gold answer in the retrieved information), per turn index,
  in the paper's biased form and in an unbiased one.
Both train GRPO's chains (rollout.igpo's, rollout.chain's).

Deviations from the papers, each cited by its name (argued in docs/paper_code.md):
- igpo-first-gold: P is the first gold answer's (rollout.py), as IGPO's official code
- igpo-forced-step: the forced answer is a step of its own (its think tag opened), as our agent's
- mtgrpo-k-turns: MT-GRPO's two fixed turns generalised to K turns by a sum to go per turn index
- mtgrpo-no-exec-reward: MT-GRPO's turn reward without its +0.2 for a tool call that executed
- mtgrpo-unbiased: the unbiased baseline is ours, from verl #7244's diagnosis (its fix unread)
"""

import math
from statistics import fmean, stdev

from advantages import (
    IGPOCredit,
    MTGRPOCredit,
    _clear_then_scored_leaves,
    _refuse_branching,
    _with_node_advantages_marked,
    group_normalize,
)
from tree import Node, Trajectory, Tree, path, scored_leaves

IGPO_GAMMA = 1.0  # IGPO's turn discount γ (Eq. 7), its official run's (algorithm.gamma=1.0)


def _igpo_z(x: list[float]) -> list[float]:
    """IGPO's group z-score (official `compute_group_stats`): (x - mean) / (std + 1e-6), std the
    population one, sqrt(var + 1e-8), and 1 for a group of one (whose z is then 0)."""
    if not x:
        return []
    mean = fmean(x)
    std = math.sqrt(fmean((v - mean) ** 2 for v in x) + 1e-8) if len(x) > 1 else 1.0
    return [(v - mean) / (std + 1e-6) for v in x]


def _returns(r: list[float], gamma: float) -> list[float]:
    """Discounted sums to go: A_t = r_t + γ A_{t+1}, A past the last turn 0."""
    out = [0.0] * (len(r) + 1)
    for t in reversed(range(len(r))):
        out[t] = r[t] + gamma * out[t + 1]
    return out[:-1]


def igpo(trees: list[Tree], cfg: IGPOCredit) -> list[Trajectory]:
    """IGPO (Wang et al. 2026, §3; this project keeps no copy of its text: Eqs. 6-7 as IGPO #5
    quotes them; the oracle test checks the official code) on GRPO chains, chain i of T steps, P_t
    = exp(gold_logp) after step t (P_0 the prompt's; written by rollout.igpo):
        r_t = P_t - P_{t-1} for t < T (the information gain), r_T = the outcome reward
        r̂   = r z-scored over the group, gains with gains, outcomes with outcomes    (Eq. 6)
        A_t = r̂_t + γ A_{t+1}, broadcast to step t's tokens        (Eq. 7; γ = IGPO_GAMMA)
    z-scored by `_igpo_z` (its official code's "separate" mode). `cfg.igpo_gain="logprob"`: r_t is
    the gain in mean log-prob (its official run); `cfg.igpo_order="discount"`: discount the raw r,
    then z-score each A_t with the group's mean and unbiased std of A_1 (the first released code,
    IGPO #5). Each step is trained in its one chain; a group of one trains nothing."""
    scored = _clear_then_scored_leaves(trees)
    _refuse_branching(trees, "igpo")
    for n in (n for leaf in scored for n in [path(leaf)[0].parent, *path(leaf)[:-1]]):
        if n.gold_logp is None:
            raise ValueError(
                f"igpo reads each turn's gold-answer log-prob, but node {n.id!r} has no gold_logp; "
                "grow the trees with --algo igpo (rollout.igpo writes it) or set it by hand"
            )
    P = (lambda n: math.exp(n.gold_logp)) if cfg.igpo_gain == "prob" else lambda n: n.gold_logp
    r = {x: [P(s) - P(s.parent) for s in path(x)[:-1]] + [x.reward] for x in scored}
    if cfg.igpo_order == "discount":
        G = {x: _returns(r[x], IGPO_GAMMA) for x in scored}
        first = [G[x][0] for x in scored]  # each chain's whole return
        mean, std = fmean(first or [0.0]), stdev(first) if len(first) > 1 else math.inf
        A = {x: [(g - mean) / (std + 1e-6) for g in G[x]] for x in scored}
    else:
        gains = iter(_igpo_z([g for x in scored for g in r[x][:-1]]))
        ends = iter(_igpo_z([x.reward for x in scored]))
        normalized = {x: [next(gains) for _ in r[x][:-1]] + [next(ends)] for x in scored}
        A = {x: _returns(normalized[x], IGPO_GAMMA) for x in scored}
    return _with_node_advantages_marked([Trajectory(x, A[x]) for x in scored])


MTGRPO_TURN_REWARD = 0.5  # its official search reward: a gold answer in the retrieved results
MTGRPO_EPS = 1e-4  # its official z-score: (r - mean) / (std + 1e-4)


def turn_reward(step: Node, golds: list[str]) -> float:
    """MT-GRPO's verifiable turn reward of a search step (its official code's search rubric,
    `exist_answer_in_search_results`): MTGRPO_TURN_REWARD if a gold answer, lower-cased, is in the
    step's lower-cased observation, else 0 (mtgrpo-no-exec-reward)."""
    seen = step.obs_text.lower()
    return MTGRPO_TURN_REWARD if any(g.lower() in seen for g in golds if g.strip()) else 0.0


def mtgrpo(trees: list[Tree], cfg: MTGRPOCredit) -> list[Trajectory]:
    """MT-GRPO (Zeng et al. 2025, §4, its turn-level advantage; equation numbers unchecked: no copy
    of the paper is kept; the oracle test checks the official code) on GRPO chains, chain i of T_i
    steps: turn rewards r_{i,k} = `turn_reward` of steps k < T_i, the outcome R_i after step T_i.
    With z_k the z-score over the chains that have turn k, z_O over the group's outcomes (std
    unbiased, + MTGRPO_EPS):
        biased:   A_{i,k} = z_O(R_i) + Σ_{j=k}^{T_i-1} z_j(r_{i,j})   (the paper's per turn index;
                  its two turns: turn 1 z_O + z_1, turn 2 z_O, as its official code)
        unbiased: A_{i,k} = z_k(G_{i,k}), G_{i,k} = Σ_{j=k}^{T_i-1} r_{i,j} + R_i over the chains
                  that reached turn k (mtgrpo-unbiased)
    The biased baseline subtracts one per-index mean per turn the chain itself goes on to take: a
    term set by its own stopping turn, a hidden -E[r_j] on every decision to search again (verl
    #7244). Ours depends on the turn index alone. K turns: mtgrpo-k-turns."""
    scored = _clear_then_scored_leaves(trees)
    _refuse_branching(trees, "mtgrpo")
    golds = {x: t.golden_answers for t in trees for x in scored_leaves(t.root)}
    r = {x: [turn_reward(s, golds[x]) for s in path(x)[:-1]] for x in scored}  # r_{i,k}, k < T_i
    if cfg.mtgrpo_baseline == "biased":
        z, z_O = _per_turn(r), group_normalize([x.reward for x in scored], MTGRPO_EPS)
        A = {
            x: [o + sum(z[x, j] for j in range(k, len(r[x]))) for k in range(x.depth)]
            for x, o in zip(scored, z_O)
        }
    else:
        G = {x: [sum(r[x][k:]) + x.reward for k in range(x.depth)] for x in scored}  # G_{i,k}
        z = _per_turn(G)
        A = {x: [z[x, k] for k in range(x.depth)] for x in scored}
    return _with_node_advantages_marked([Trajectory(x, A[x]) for x in scored])


def _per_turn(values: dict[Node, list[float]]) -> dict[tuple[Node, int], float]:
    """MT-GRPO's per-turn-index statistics: (chain, k) -> the z-score of values[chain][k] among the
    chains that have a k-th value (std unbiased, + MTGRPO_EPS)."""
    z = {}
    for k in range(max(map(len, values.values()), default=0)):
        at = [x for x in values if len(values[x]) > k]
        z |= dict(
            zip([(x, k) for x in at], group_normalize([values[x][k] for x in at], MTGRPO_EPS))
        )
    return z
