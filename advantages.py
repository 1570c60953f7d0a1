"""Credit assignment: one function per paper, from the rollout trees of ONE prompt to per-step
advantages.

Each function (grpo, gigpo, tree_grpo, arpo, branpo, carl, treeps, at2po, vineppo; turns.py's igpo
and mtgrpo too) returns one `Trajectory` per trained leaf: the advantage multiplying each step's
tokens in that trajectory's loss, None where the step is not trained there. They are not pure: each
also writes, on the trees it is given, and nothing else,
- `value` on every node: its method's V(n) where it defines one (BranPO's r_base on a prefix end,
  CARL's, TreePS-RAG's and AT2PO's V on every node, VinePPO's on each step's context), else None;
- `advantage` on every node: the one advantage every trajectory that trains it uses, else None;
for tree.render, the command line and the pictures. Never `reward`. No model or optimizer code.
Each paper's options are a class above its function (TreeGRPOCredit, ...; CreditConfig, at the end,
gathers them for the flags); its rollout's knobs are tree.py's (TreeGRPORollout, ...).

Deviations from the papers, each cited by its name (argued in docs/paper_code.md):
- group-of-one: a group of one reward gets advantage 0, GiGPO's step groups too (verl: r itself)
- gigpo-no-invalid-penalty: an invalid step costs GiGPO nothing extra (official search runs: -0.01)
- rsm-excluded: redundant steps are left out of the loss, not multiplied by 0 (BranPO Eq. 14)
- branch-norm: BranPO's branch rewards are normalised per prompt (Eq. 12), not per trajectory
- empty-prefix-stats: an empty BranPO prefix counts in Eq. 11's statistics (official code: not)
- preference-mask: BranPO follows Eq. 14, not its official code's min(A_branch, 0) on the loser
- tree-all-leaves: Tree-GRPO trains every leaf; its official code subsamples `ts_k` per tree
- carl-defined-children: CARL's V(s) averages over the children with a defined value only
- carl-phase1: CARL's first-phase chains are trained (Eqs. 13/15), not left out (App. C.1)
- first-untruncated: a step trained once is trained in the first trajectory not `truncated`
- treeps-sampled: TreePS-RAG trains the drawn paths (every leaf of an unmarked tree)
- gigpo-exact-state: GiGPO's anchor states match exactly by key (official search code: similarity)
- gigpo-episode-stats: GiGPO's Eq. 3 statistics are per trajectory (official code: over step rows)
- at2po-unbiased-std: AT2PO z-scores leaves with the unbiased std (official code: population std)
- at2po-ppo-loss: AT2PO's credit trains under our token PPO loss, not its turn-level GSPO objective
- arpo-hard-once: ARPO's hard credit trains a shared step once, with its leaves' mean advantage
- treepo-unwhitened: TreePO's advantages are not whitened over the batch (official code: they are)
- vineppo-turns: VinePPO's steps are agent turns (official code: a math solution's reasoning steps)
- vineppo-no-estimate: a context whose continuations were all discarded: no V, steps untrained
- vineppo-unwhitened: VinePPO's advantages are not whitened over the batch (official code: they are)
"""

import math
import runpy
from dataclasses import dataclass
from statistics import fmean
from typing import Literal

import torch

from infra import flags
from tree import Node, Trajectory, Tree, action_nll, leaves, path, scored_leaves, truncated, walk


def group_normalize(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """(r_i - mean) / (std + eps) with the unbiased std, as verl and Tree-GRPO's code; a group of
    one gets 0 (group-of-one)."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    r = torch.tensor(rewards, dtype=torch.float64)  # (G,)
    return ((r - r.mean()) / (r.std() + eps)).tolist()


def _clear_then_scored_leaves(trees: list[Tree]) -> list[Node]:
    """Clear every node's value and advantage (an earlier method's), then return the trees' scored
    leaves, in tree order."""
    for n in [n for t in trees for n in walk(t.root)]:
        n.value = n.advantage = None
    return [leaf for t in trees for leaf in scored_leaves(t.root)]


def _first_trained(ends: list[Node]) -> dict[Node, Node]:
    """Step -> the leaf of the trajectory that trains a step trained once (first-untruncated): the
    first not truncated."""
    owner = {}
    # stable: trained trajectories first, each in tree order
    for leaf in sorted(ends, key=truncated):
        for step in path(leaf):
            owner.setdefault(step, leaf)
    return owner


def _with_node_advantages_marked(trajectories: list[Trajectory]) -> list[Trajectory]:
    """`trajectories`, returned once node.advantage is written on each step they train: the one
    advantage every trajectory that trains it uses, else None (for display)."""
    seen: dict[Node, set[float]] = {}  # step -> the advantages it is trained with
    for traj in trajectories:
        for step, a in zip(path(traj.leaf), traj.advantages):
            seen.setdefault(step, set()).update([] if a is None else [a])
    for step, values in seen.items():
        step.advantage = values.pop() if len(values) == 1 else None
    return trajectories


def _refuse_branching(trees: list[Tree], method: str) -> None:
    """A method of GRPO chains (grpo, gigpo) refuses a tree that branches, naming where."""
    for t in trees:
        if branching := [n.id for n in walk(t.root) if len(n.children) > 1]:
            raise ValueError(
                f"{method} expects chains, but tree {t.root.id!r} branches at {branching}; "
                f"use tree_grpo (or treeps with process=False) for trees"
            )


# --------------------------------------------------------------------------------------------------


def grpo(trees: list[Tree], cfg: object) -> list[Trajectory]:
    """GRPO ("Cut the Bill" §5.3, Shao et al. 2024 Eq. 3): A_i = (r_i - mean(r)) / (std(r) + 1e-6)
    over the G trajectories of the prompt, broadcast to every step of trajectory i. Each tree must
    be a chain. GRPO has no option in `cfg`."""
    scored = _clear_then_scored_leaves(trees)
    _refuse_branching(trees, "grpo")
    A = group_normalize([leaf.reward for leaf in scored])  # one A_i per trajectory, G = len(scored)
    return _with_node_advantages_marked(
        [Trajectory(leaf, [a] * leaf.depth) for leaf, a in zip(scored, A)]
    )


GIGPO_GAMMA = 0.95  # GiGPO's discount γ (Eq. 5) in its search-agent setting
GIGPO_OMEGA = 1.0  # GiGPO's weight ω of the step advantage (Eq. 8), the paper's


@dataclass
class GiGPOCredit:
    """GiGPO's credit options (gigpo below)."""

    gigpo_state: Literal["obs", "docs"] = "obs"
    """GiGPO: a step's anchor state, its parent's observation text or retrieved doc-id set."""
    gigpo_step_rows: bool = False
    """GiGPO: Eq. 3's statistics over step rows (a chain of T steps T times), as its code."""


def _anchor_state(step: Node, cfg: GiGPOCredit):
    """GiGPO's anchor state of `step`, the state it was taken from, as a key that matches exactly
    (gigpo-exact-state): the question for a first step; else the parent's observation text, or with
    `cfg.gigpo_state="docs"` the set of doc ids the parent retrieved (its text if it retrieved
    none)."""
    parent = step.parent
    if parent.parent is None:
        return None  # the prompt: every chain's first step is taken from the question
    if cfg.gigpo_state == "docs" and parent.doc_ids:
        return frozenset(parent.doc_ids)
    return parent.obs_text


def gigpo(trees: list[Tree], cfg: GiGPOCredit) -> list[Trajectory]:
    """GiGPO (Feng et al. 2025, §4) on GRPO chains (each tree a chain, as `grpo`), step t of chain i
    (T_i steps, reward R_i at its end) taken from anchor state s_t^i:
        A^E(τ_i)   = (R_i - mean_j R_j) / std_j R_j, j over the prompt's chains          (Eq. 3)
        R_t^i      = γ^(T_i - t) R_i, the discounted return of a reward at the end       (Eq. 5)
        G^S(s)     = {(a_t^j, R_t^j) : s_t^j = s}, the steps taken from the same state  (Eq. 6)
        A^S(a_t^i) = (R_t^i - mean over G^S(s_t^i)) / std over G^S(s_t^i)               (Eq. 7)
        A(a_t^i)   = A^E(τ_i) + ω A^S(a_t^i)                     (Eq. 8; γ, ω: GIGPO_*)
    F_norm is the std (its search setting), unbiased, + 1e-6; a group of one gets 0
    (group-of-one): a step from a state no other chain visited has A^S = 0. Anchor states:
    `_anchor_state` (`cfg.gigpo_state`). `cfg.gigpo_step_rows`: Eq. 3's statistics over step rows,
    a chain of T steps counted T times, as the official code (gigpo-episode-stats). Each step is
    trained in its one chain. No invalid-action penalty: an invalid step ends its chain with reward
    0, as in every method (gigpo-no-invalid-penalty). With ω = 0 and per-chain statistics, this is
    GRPO."""
    scored = _clear_then_scored_leaves(trees)
    _refuse_branching(trees, "gigpo")
    rows = [leaf for leaf in scored for _ in range(leaf.depth if cfg.gigpo_step_rows else 1)]
    A_E = dict(zip(rows, group_normalize([leaf.reward for leaf in rows])))  # Eq. 3: leaf -> A^E
    R_t = {
        s: GIGPO_GAMMA ** (leaf.depth - s.depth) * leaf.reward
        for leaf in scored
        for s in path(leaf)
    }
    groups: dict[object, list[Node]] = {}  # anchor state -> G^S, its steps (Eq. 6)
    for step in R_t:
        groups.setdefault(_anchor_state(step, cfg), []).append(step)
    A_S = {s: a for G in groups.values() for s, a in zip(G, group_normalize([R_t[s] for s in G]))}
    return _with_node_advantages_marked(
        [
            Trajectory(leaf, [A_E[leaf] + GIGPO_OMEGA * A_S[s] for s in path(leaf)])
            for leaf in scored
        ]
    )


@dataclass
class TreeGRPOCredit:
    """Tree-GRPO's credit option (tree_grpo below)."""

    tree_mode: Literal["both", "intra", "inter", "treepo"] = "both"
    """Tree-GRPO advantage: intra + inter (paper), one of them (Table 4), or TreePO's subgroups."""


def tree_grpo(trees: list[Tree], cfg: TreeGRPOCredit) -> list[Trajectory]:
    """Tree-GRPO (Ji et al. 2025) §4.2.4, Tree-based Group Relative Advantages: two displayed
    formulas, to which the paper's text that this project follows gives no equation number:
        Â_intra/inter(H_i) = (R(H_i) - mean_j R(H_j)) / std_j R(H_j), j over G_intra or G_inter
        Â_tree(H_i)        = Â_intra(H_i) + Â_inter(H_i)
    R(H_i) normalized over the leaves of H_i's own tree T_i (intra) and over the leaves of all M
    trees of the prompt (inter); std + 1e-6, a group of one 0 (group-of-one).
    Each root-to-leaf trajectory H_i is trained with its own A_tree(H_i): a prefix shared by k
    leaves is trained k times, as in the paper's objective. `cfg.tree_mode` = "intra" or "inter" is
    the Table 4 ablation (inter alone is GRPO over the tree leaves); "treepo" is TreePO's credit."""
    scored = _clear_then_scored_leaves(trees)
    inter = group_normalize([leaf.reward for leaf in scored])  # G_inter: the leaves of all M trees
    # G_intra(T_i)
    intra = [
        a for t in trees for a in group_normalize([leaf.reward for leaf in scored_leaves(t.root)])
    ]
    both = [a + b for a, b in zip(intra, inter)]
    if cfg.tree_mode == "treepo":
        A = _treepo(trees, scored)
    else:
        A = {"both": both, "intra": intra, "inter": inter}[cfg.tree_mode]
    return _with_node_advantages_marked(
        [Trajectory(leaf, [a] * leaf.depth) for leaf, a in zip(scored, A)]
    )


def _treepo(trees: list[Tree], scored: list[Node]) -> list[float]:
    """TreePO's tree-based advantage (Li et al. 2025, its advantage estimation, drawn in Fig. 3; the
    equation number is not checked: this project keeps no copy of the paper's text, and the oracle
    test checks the formula against the official code) of each scored leaf i:
        A_i = (1/|J_i|) Σ_{j ∈ J_i} (R_i - mean_{k ∈ G_j} R_k)
    over its ancestor subgroups G_j (an ancestor's scored leaves): the prompt's (all its trees'
    leaves) always, each ancestor below it (a tree's root when the prompt has several trees, then
    each step above the leaf) only with more than one leaf. No std (treepo-unwhitened). A prompt
    with no scored leaf (every trajectory lost to retrieval errors, or no step grown) has no
    subgroup and trains nothing, as GRPO."""
    if not scored:
        return []
    prompt = fmean(leaf.reward for leaf in scored)  # the root subgroup's mean
    A = []
    for leaf in scored:
        steps = path(leaf)
        above = ([steps[0].parent] if len(trees) > 1 else []) + steps[:-1]
        groups = [G for n in above if len(G := scored_leaves(n)) > 1]
        means = [prompt] + [fmean(x.reward for x in G) for G in groups]
        A.append(fmean(leaf.reward - m for m in means))  # 1/|J_i| Σ_j
    return A


@dataclass
class ARPOCredit:
    """ARPO's credit option (arpo below)."""

    arpo_credit: Literal["soft", "hard"] = "soft"
    """ARPO: soft (GRPO over the leaves) or hard (a shared step: its leaves' mean, once)."""


def arpo(trees: list[Tree], cfg: ARPOCredit) -> list[Trajectory]:
    """ARPO (Dong et al. 2025) §3, Advantage Attribution Estimation, on the prompt's trees, leaf j
    scored (the equation numbers are not checked: this project keeps no copy of the paper's text;
    soft is its official code's estimate, hard its text's):
        Â_j  = (R_j - mean R) / std R over every scored leaf of the prompt
        soft: trajectory j trains each of its steps with Â_j (GRPO over the leaves, exactly
              `tree_grpo` with tree_mode "inter"), so a step shared by d leaves is trained d times
        hard: step n gets Â(n) = (1/d) Σ_{j ∈ L(n)} Â_j over the d scored leaves L(n) below it
              (an unshared step: its leaf's Â_j), trained once (arpo-hard-once, first-untruncated)
    `cfg.arpo_credit`; soft is the paper's default, hard its text's alternative (no code)."""
    scored = _clear_then_scored_leaves(trees)
    A = dict(zip(scored, group_normalize([j.reward for j in scored])))  # Â_j
    if cfg.arpo_credit == "soft":
        return _with_node_advantages_marked([Trajectory(j, [A[j]] * j.depth) for j in scored])
    owner = _first_trained(scored)
    mean = {s: fmean(A[j] for j in scored_leaves(s)) for s in owner}  # (1/d) Σ_j Â_j
    return _with_node_advantages_marked(
        [Trajectory(j, [mean[s] if owner[s] is j else None for s in path(j)]) for j in scored]
    )


def _prefix_ends(trees: list[Tree]) -> list[Node]:
    """BranPO's truncation point k of each original trajectory: its node marked `prefix_end`. A tree
    whose root is marked is one original trajectory (k = 0: all resampled); otherwise each root
    child's subtree is one. rollout.branpo marks every original it truncated; one whose branching
    kept nothing stays split at the last point it tried (Algorithm 1: B = τ≤k_d, C = {(τ>k_d, R)}),
    a mark with a single child. An unmarked original (hand-built trees) must be a chain and was
    never truncated: k = T, all its steps are prefix (A_base), its reward still counts in Eq. 12's
    group. A forest of unmarked chains is GRPO (Theorem B.1); in a mixed group, mark every split."""
    ends = []
    for t in trees:
        if t.root.prefix_end:
            ends.append(t.root)
            continue
        for child in t.root.children:
            marked = [n for n in walk(child) if n.prefix_end]
            if len(marked) > 1:
                raise ValueError(
                    f"original trajectory {child.id!r} marks {len(marked)} prefix ends "
                    f"{[n.id for n in marked]}; BranPO truncates it once, so mark exactly one node"
                )
            tips = leaves(child)
            if not marked and len(tips) > 1:
                raise ValueError(
                    f"original trajectory {child.id!r} branches into {[n.id for n in tips]} but "
                    "marks no prefix_end; mark the node its continuations share"
                )
            if marked and (outside := [x.id for x in tips if x not in leaves(marked[0])]):
                raise ValueError(  # leaves in no C_n (Eq. 9): in no statistic, never trained
                    f"original trajectory {child.id!r} branches above its prefix_end "
                    f"{marked[0].id!r}: {outside} are not continuations of it; mark the node its "
                    "continuations share"
                )
            ends.append(marked[0] if marked else tips[0])
    return ends


def _losers(end: Node, C: list[Node]) -> list[Node]:
    """The official code's preference -1 among the continuations C of `end` (preference-mask): those
    through a `redundant` step, else those below the best reward of C (none if all are equal)."""
    redundant = [leaf for leaf in C if any(step.redundant for step in path(leaf)[end.depth :])]
    best = max(leaf.reward for leaf in C)
    return redundant or [leaf for leaf in C if leaf.reward < best]


@dataclass
class BranPOCredit:
    """BranPO's credit options (branpo below)."""

    branpo_norm: Literal["prompt", "prefix"] = "prompt"
    """BranPO: branch advantage normalized per prompt (Eq. 12) or per prefix (Algorithm 1)."""
    branpo_skip_empty_base: bool = False
    """BranPO: leave empty prefixes (k = 0) out of Eq. 11's statistics, as its official code."""
    branpo_clip_losers: bool = False
    """BranPO: its official code's preference mask (a pair's loser: min(A_branch, 0)), no Eq. 14."""


def branpo(trees: list[Tree], cfg: BranPOCredit) -> list[Trajectory]:
    """BranPO §4.3 (Eqs. 8-12) with Redundant Step Masking §4.4 (Eq. 14). Each original trajectory n
    was grown into a prefix B_n (root .. the `prefix_end` node, Eq. 8) and continuations C_n, the
    leaves under it (Eq. 9):
        r_base(n)     = mean_{i in C_n} r_branch(n, i)                                  (Eq. 10)
        A_base(n)     = (r_base(n) - mean_j r_base(j)) / std_j r_base(j)                (Eq. 11)
                        j over the N prefixes
        A_branch(n,i) = (r_branch(n,i) - mean) / std over all continuations of the prompt (Eq. 12)
    A_base multiplies the prefix steps, trained once (first-untruncated); A_branch each
    continuation's own steps but the `redundant` ones (Eq. 14, rsm-excluded).
    `cfg.branpo_norm="prefix"`: Algorithm 1 (branch-norm). With one continuation for every prefix,
    every step gets the GRPO advantage (Theorem B.1). The official code's two differences:
    `branpo_skip_empty_base` (empty-prefix-stats), `branpo_clip_losers` (preference-mask)."""
    _clear_then_scored_leaves(trees)  # its leaves: below, each prefix end's
    # (B_n's last node, C_n); an original trajectory whose continuations were all discarded
    # (env_error) is dropped
    groups = [(end, C) for end in _prefix_ends(trees) if (C := scored_leaves(end))]
    for end, C in groups:
        end.value = sum(leaf.reward for leaf in C) / len(C)  # r_base, Eq. 10
    based = [
        end for end, _ in groups if end.depth or not cfg.branpo_skip_empty_base
    ]  # empty-prefix-stats
    A_base = dict(zip(based, group_normalize([end.value for end in based])))  # Eq. 11, N prefixes
    continuations = [leaf for _, C in groups for leaf in C]
    # Eq. 12 or Algorithm 1
    branch_groups = [continuations] if cfg.branpo_norm == "prompt" else [C for _, C in groups]
    A_branch = {
        leaf: a for G in branch_groups for leaf, a in zip(G, group_normalize([x.reward for x in G]))
    }
    losers = (
        {leaf for end, C in groups for leaf in _losers(end, C)} if cfg.branpo_clip_losers else set()
    )
    owner, trajectories = _first_trained(continuations), []
    for end, C in groups:
        for leaf in C:
            steps = path(leaf)
            prefix = [A_base[end] if owner[step] is leaf else None for step in steps[: end.depth]]
            if leaf in losers:  # preference-mask: every suffix step in the loss, A_branch <= 0
                suffix = [min(A_branch[leaf], 0.0)] * (len(steps) - end.depth)
            else:  # Eq. 14
                suffix = [None if step.redundant else A_branch[leaf] for step in steps[end.depth :]]
            trajectories.append(Trajectory(leaf, prefix + suffix))
    return _with_node_advantages_marked(trajectories)


@dataclass
class CARLCredit:
    """CARL's credit options (carl below)."""

    carl_update_all: bool = False
    """CARL: also train single-child actions (Eq. 16 ablation)."""
    carl_train_phase1: bool = True
    """CARL: train the forked actions of the N0 first chains (Eqs. 13, 15); False: App. C.1."""


def carl(trees: list[Tree], cfg: CARLCredit) -> list[Trajectory]:
    """CARL §5: V(leaf) = R (Eq. 9), V(s) = mean of its children's V (Eq. 10, not of its descendant
    leaves), A(s -> s') = V(s') - V(s) (Eq. 11), not group-normalized. Only actions whose parent
    state has more than one child are trained, each once (Eq. 13; first-untruncated).
    `cfg.carl_update_all` is the §6.3 ablation (Eq. 16): a single-child action inherits the
    advantage of the edge into its parent (0 below the root). `cfg.carl_train_phase1=False` leaves
    the steps of the N0 first-phase chains (marked `phase1` by rollout.carl) untrained (App. C.1,
    carl-phase1)."""
    scored = _clear_then_scored_leaves(trees)
    nodes = [n for t in trees for n in walk(t.root)]
    for n in reversed(nodes):  # bottom-up (App. C.2): every child before its parent
        if not n.children:
            n.value = n.reward if n.scored else None  # Eq. 9
        elif vs := [c.value for c in n.children if c.value is not None]:
            n.value = sum(vs) / len(vs)  # Eq. 10 (carl-defined-children)
    edge: dict[Node, float] = {}  # action (the node it leads to) -> its advantage
    trained: dict[Node, float] = {}  # the actions the update trains
    for s in nodes:  # top-down: every parent before its children
        valued = [c for c in s.children if c.value is not None]
        for c in valued:
            edge[c] = c.value - s.value  # Eq. 11
            if len(valued) > 1:
                trained[c] = edge[c]  # Eq. 13
            elif cfg.carl_update_all:
                trained[c] = edge[c] = edge.get(s, 0.0)  # Eq. 16: the edge above; 0 below the root
    untrained = {n for n in nodes if n.phase1 and not cfg.carl_train_phase1}  # App. C.1
    owner = _first_trained(scored)
    return _with_node_advantages_marked(
        [
            Trajectory(
                leaf,
                [
                    trained.get(s) if owner[s] is leaf and s not in untrained else None
                    for s in path(leaf)
                ],
            )
            for leaf in scored
        ]
    )


@dataclass
class TreePSCredit:
    """TreePS-RAG's credit option (treeps below)."""

    treeps_process: bool = True
    """TreePS-RAG: process advantage (False = GRPO over its trajectories, Table 2 ablation)."""


def treeps(trees: list[Tree], cfg: TreePSCredit) -> list[Trajectory]:
    """TreePS-RAG §2.3, Value Estimation and Advantage Calculation, and Algorithm 1 lines 28-30 (the
    paper numbers no equation for these; its Eqs. 1-3 are the step, the branching factor and the
    objective): V(n) = mean reward over the descendant leaves L(n), and
        A(n) = (2 V(n) - V(root) - V(parent(n))) / sqrt(|L(n)|)
    i.e. global advantage V(n) - V(root) plus local advantage V(n) - V(parent), damped by
    sqrt(|L(n)|) because a node with many leaves appears in that many trajectories. Only the N
    trajectories drawn for training (§2.3, treeps-sampled) are trained, each with A(n) on every step
    n. `cfg.treeps_process=False`: the Table 2 ablation, GRPO over them."""
    scored = _clear_then_scored_leaves(trees)
    chosen = [leaf for leaf in scored if leaf.sampled] or scored  # Y = {y_1 .. y_N}
    if not cfg.treeps_process:
        A = group_normalize([leaf.reward for leaf in chosen])
        return _with_node_advantages_marked(
            [Trajectory(leaf, [a] * leaf.depth) for leaf, a in zip(chosen, A)]
        )
    A: dict[Node, float] = {}
    for t in trees:
        for n in walk(t.root):  # depth first: V(root) and V(parent(n)) are set before n is reached
            if L := scored_leaves(n):  # L(n)
                n.value = sum(leaf.reward for leaf in L) / len(L)
                if n.parent is not None:
                    A[n] = (2 * n.value - t.root.value - n.parent.value) / math.sqrt(len(L))
    return _with_node_advantages_marked(
        [Trajectory(leaf, [A[step] for step in path(leaf)]) for leaf in chosen]
    )


def _at2po_value(n: Node, children: list[Node], mode: str) -> float:
    """AT2PO's V(n) of an inner node from its `children` with a value (`cfg.at2po_value`)."""
    if mode == "leaf":
        L = scored_leaves(n)
        return sum(leaf.value for leaf in L) / len(L)
    if mode == "child":
        return sum(c.value for c in children) / len(children)
    H = [action_nll(c) for c in children]  # H(c): as AT2PO's rollout measures it
    w = torch.softmax(torch.tensor(H, dtype=torch.float64), 0)  # (children,)
    return float((w * torch.tensor([c.value for c in children], dtype=torch.float64)).sum())


@dataclass
class AT2POCredit:
    """AT2PO's credit options (at2po below)."""

    at2po_value: Literal["entropy", "child", "leaf"] = "entropy"
    """AT2PO: V(n), the entropy-softmax-weighted or plain child mean, or the mean leaf."""
    at2po_advantage: Literal["value", "parent", "root", "both"] = "value"
    """AT2PO: A(n) = V(n), V(n) - V(parent), V(n) - V(root), or the sum of the last two."""


def at2po(trees: list[Tree], cfg: AT2POCredit) -> list[Trajectory]:
    """AT2PO (Zong et al. 2026) §3, Turn-wise Credit Assignment (the equation numbers are not
    checked: this project keeps no copy of the paper's text; the formulas are checked against the
    official code by the oracle test) on each tree T of the prompt:
        V(leaf) = (R - mean_T R) / (std_T R + 1e-6), leaves z-scored within T (at2po-unbiased-std)
        V(n)    = Σ_c softmax_c(H(c)) V(c)   "entropy": H(c) the mean token NLL of child step c
                  mean_c V(c)                "child"
                  mean_{leaf ∈ L(n)} V(leaf) "leaf"              (cfg.at2po_value)
        A(n)    = V(n) | V(n) - V(parent) | V(n) - V(root) | both differences summed
                  "value" | "parent" | "root" | "both"         (cfg.at2po_advantage)
    c over n's children that have a value (not those whose every leaf was discarded). Every step of
    every scored trajectory is trained with its A(n), a shared step once per trajectory, as the
    official code; its turn-level GSPO objective is not our loss (at2po-ppo-loss). The defaults are
    the paper's run: child softmax over entropies, the value as the advantage."""
    scored = _clear_then_scored_leaves(trees)
    A: dict[Node, float] = {}
    for t in trees:
        L = scored_leaves(t.root)
        for leaf, z in zip(L, group_normalize([leaf.reward for leaf in L])):
            leaf.value = z
        nodes = list(walk(t.root))
        for n in reversed(nodes):  # every child before its parent
            if n.children and (valued := [c for c in n.children if c.value is not None]):
                n.value = _at2po_value(n, valued, cfg.at2po_value)
        for n in nodes[1:]:  # the steps; the root is the prompt
            if n.value is not None:
                local, glob = n.value - n.parent.value, n.value - t.root.value
                modes = {"value": n.value, "parent": local, "root": glob, "both": local + glob}
                A[n] = modes[cfg.at2po_advantage]
    return _with_node_advantages_marked(
        [Trajectory(leaf, [A[s] for s in path(leaf)]) for leaf in scored]
    )


def vineppo(trees: list[Tree], cfg: object) -> list[Trajectory]:
    """VinePPO (Kazemnejad et al. 2025, §4, its Monte Carlo values in PPO's advantage; the equation
    numbers are not checked: this project keeps no copy of the paper's text, and the oracle test
    checks the formula against the official code) on the prompt's trees. The leaves marked `sampled`
    end the trained paths (rollout.vineppo's chains; none marked: every leaf); every other child of
    a step's context starts a Monte Carlo continuation η_k ~ π(·|s), never trained. Step t of a path
    is taken in context s_t (the root, then the step before it) and leads to s_{t+1}:
        V̂(s)          = (1/K) Σ_k R(η_k), over s's continuations whose reward counts
        A(s_t, a_t)    = V̂(s_{t+1}) - V̂(s_t);   A(s_T, a_T) = R - V̂(s_T) for the last step
    i.e. r + γ V̂(s_{t+1}) - V̂(s_t) with γ = 1, the reward at the end only and V(terminal) = 0.
    A trained path's own reward never enters V̂, as in the official code. A context whose every
    continuation was discarded has no V̂, and the steps on either side of it are not trained
    (vineppo-no-estimate); no whitening (vineppo-unwhitened). A step on several trained paths (a
    tree, not VinePPO's chains) is trained once (first-untruncated). No option in `cfg`."""
    scored = _clear_then_scored_leaves(trees)
    every = [x for t in trees for x in leaves(t.root)]
    ends = [x for x in every if x.sampled] or every  # the trained paths' leaves
    trained_path = {s for x in ends for s in path(x)}  # discarded ones too: not continuations
    main = [x for x in scored if x in trained_path]
    owner = _first_trained(main)
    for s in dict.fromkeys(step.parent for step in owner):  # the contexts s_t
        L = [x for c in s.children if c not in trained_path for x in scored_leaves(c)]
        s.value = fmean(x.reward for x in L) if L else None  # V̂(s), K = len(L)
    A: dict[Node, float] = {}
    for step in owner:
        after = step.value if step.children else step.reward  # V̂(s_{t+1}), or R after the last
        if after is not None and step.parent.value is not None:
            A[step] = after - step.parent.value
    return _with_node_advantages_marked(
        [Trajectory(x, [A.get(s) if owner[s] is x else None for s in path(x)]) for x in main]
    )


# The options of turns.py's credits (a reward at every turn: IGPO, MT-GRPO), kept here with every
# other paper's for CreditConfig (turns.py builds on this module, so not the other way round)


@dataclass
class IGPOCredit:
    """IGPO's credit options (turns.igpo)."""

    igpo_gain: Literal["prob", "logprob"] = "prob"
    """IGPO: a turn's gain in P(gold) (the paper) or in its mean log-prob (the official run)."""
    igpo_order: Literal["normalize", "discount"] = "normalize"
    """IGPO: z-score the turn rewards, then discount (paper, code since IGPO #5) or the reverse."""


@dataclass
class MTGRPOCredit:
    """MT-GRPO's credit option (turns.mtgrpo)."""

    mtgrpo_baseline: Literal["biased", "unbiased"] = "biased"
    """MT-GRPO: z-score each turn's reward per turn index (paper) or each return to go (ours)."""


@dataclass
class CreditConfig(
    MTGRPOCredit,
    IGPOCredit,
    ARPOCredit,
    AT2POCredit,
    GiGPOCredit,
    TreePSCredit,
    CARLCredit,
    BranPOCredit,
    TreeGRPOCredit,
):
    """Every paper's credit options, each paper's class beside its credit function above or in
    turns.py (the last
    base's flags come first; --algo and the rollout knobs: rollout.RolloutConfig)."""

    __post_init__ = flags.check_choices  # a choice no field has: refused, in Python calls too


# python advantages.py --demo | --algo ALGO --trees FILE | --budget M,N,L: scripts/credit.py
if __name__ == "__main__":
    runpy.run_module("scripts.credit", run_name="__main__", alter_sys=True)
