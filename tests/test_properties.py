"""Property tests of every credit function of the registry (rollout.ALGOS, and tree_grpo's
`tree_mode` variants, TreePO's among them) on random groups of trees drawn by hypothesis: random
depth and branching; rewards with ties, ±0.0, ±1e12, ±1e-12 and any float in [-2, 2]; truncated
and env_error leaves; steps a method leaves untrained (CARL's single children and first-phase
chains, TreePS-RAG's unsampled leaves, VinePPO's continuations, BranPO's redundant steps, a step
above discarded leaves only); bare roots (a tree with no leaf), groups of one, empty groups. Every
credit
- keeps its contract: one trajectory per trained leaf, a finite advantage on every trained token,
  rewards untouched, truncated trajectories out of the loss;
- raises only its own refusal of a group outside its shape (`Contract.refusal`);
- is invariant to the order of sibling subtrees and of the trees of a group;
- is unchanged when the discarded (env_error) trajectories are removed, and gives no signal on ties;
- is invariant to a shift of every reward, and to a positive scale (whitened) or scales with it
  (a mean baseline), or neither (mixed: IGPO and MT-GRPO sum R with turn rewards of their own,
  which also keep a signal where every outcome ties);
- obeys its paper's identities, each written beside its source.
A method newly registered fails `test_every_registered_credit_has_a_contract` until it is given a
`Contract`: the groups it takes, its refusal, how it treats rewards, its identities.

Tolerances: a whitened advantage is compared to 1e-9; one of rewards minus a mean (CARL,
TreePS-RAG, TreePO, VinePPO) to 1e-9 plus 1e-12 of the largest |reward|: a sum over ±1e12 rounds
to ~1e-4 (the ulp of 1e12), whatever the order of its terms. Examples are derandomized (CI is
reproducible), without deadline; a failing one prints its group as a trees file.
"""

import json
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from statistics import fmean, stdev

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytest import approx

import advantages
import rollout
from advantages import CreditConfig
from tree import (
    Node,
    Tree,
    action_nll,
    leaves,
    path,
    scored_leaves,
    step_credit,
    to_samples,
    truncated,
    walk,
)

PROPERTY = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
IDENTITIES = settings(PROPERTY, max_examples=60)  # each knob's identities meet more shapes
EPS = 1e-6  # the std epsilon of advantages.group_normalize
EDGES = [0.0, -0.0, 1.0, 0.5, -0.5, 1e12, -1e12, 1e-12, -1e-12]
REWARDS = st.one_of(st.sampled_from(EDGES), st.floats(-2, 2))
# rewards whose spread in any group is far above EPS, for the scale property (see its test)
SEPARATED = st.sampled_from([0.0, -0.0, 1.0, 0.5, -0.5, 2.0, 1e12, -1e12])


# ---- the groups a credit takes -------------------------------------------------------------------


class Group(list):
    """One prompt's trees; a failing example prints it as a trees file (`advantages.py --trees`)."""

    def _repr_pretty_(self, p, cycle):
        p.text(json.dumps([t.to_dict() for t in self]))


# one draw a step: the fields some credit reads (AT2PO's H from the log-probs, GiGPO's anchor state
# from the observation or the doc ids, CARL's first-phase mark, BranPO's prefix end, one in four)
STEPS = st.sampled_from(
    [
        dict(tokens=[1] * len(lp), logprobs=lp, obs_text=o, doc_ids=d, phase1=p1, prefix_end=pe)
        for pe in (False, False, False, True)
        for p1 in (False, True)
        for o in ("", "x", "y")
        for d in ([], ["d1"], ["d1", "d2"], ["d2", "d1"])
        for lp in ([], [0.0], [-0.1], [-1.0, -2.0], [-30.0])
    ]
)
# how a trajectory ends: scored, truncated (scored, not trained) or env_error (discarded); and
# the `sampled` mark of TreePS-RAG's and VinePPO's trained paths
ENDS = st.sampled_from(
    [(k, s) for s in (False, True) for k in ("scored", "scored", "truncated", "env_error")]
)
INTS = {(a, b): st.integers(a, b) for a in range(2) for b in range(13)}
BOOLS = st.booleans()


def _step(draw, **fixed) -> dict:
    return {k: list(v) if isinstance(v, list) else v for k, v in draw(STEPS).items()} | fixed


def _end(draw, node: Node, rewards) -> Node:
    kind, node.sampled = draw(ENDS)
    if kind == "env_error":
        node.flags.append("env_error")
    else:
        node.reward = draw(rewards)
        node.flags += ["truncated"] if kind == "truncated" else []
    return node


def _chain(draw, node: Node, length: int) -> Node:
    for _ in range(length):
        node = node.add_child(**_step(draw, prefix_end=False))
    return node


def _grow(draw, node: Node, rewards, budget: list[int]) -> None:
    """Children under `node` (the root may get none: a tree with no leaf), each grown or ended."""
    k = draw(INTS[0, min(3, max(budget[0], 0))]) if node.depth < 4 else 0
    if k == 0 and node.parent is not None:
        _end(draw, node, rewards)
    for _ in range(k):
        budget[0] -= 1
        _grow(draw, node.add_child(**_step(draw)), rewards, budget)


@st.composite
def trees(draw, rewards=REWARDS) -> Group:
    """Any group: 0-3 trees of depth <= 5, 0-3 children a node, <= 12 steps a tree."""
    group = Group(Tree(Node(f"t{i}", tokens=[0])) for i in range(draw(INTS[0, 3])))
    for t in group:
        _grow(draw, t.root, rewards, [draw(INTS[1, 12])])
    return group


@st.composite
def chains(draw, rewards=REWARDS) -> Group:
    """GRPO's and GiGPO's groups: 0-6 chains of 1-4 steps, or a bare root."""
    group = Group(Tree(Node(f"c{i}", tokens=[0])) for i in range(draw(INTS[0, 6])))
    for t in group:
        if length := draw(INTS[0, 4]):
            _end(draw, _chain(draw, t.root, length), rewards)
    return group


def _continuations(draw, end: Node, rewards) -> None:
    """BranPO's C under a prefix end: 1-3 chains, the first step of each redundant at random."""
    end.prefix_end = True
    for _ in range(draw(INTS[1, 3])):
        leaf = _end(draw, _chain(draw, end, draw(INTS[1, 3])), rewards)
        path(leaf)[end.depth].redundant = draw(BOOLS)


@st.composite
def originals(draw, rewards=REWARDS) -> Group:
    """BranPO's groups (advantages._prefix_ends): 0-3 trees, each one original with an empty
    prefix (the root marked) or 1-3 originals under the root, each an unmarked chain or a prefix
    marked at its last step with its continuations."""
    group = Group(Tree(Node(f"b{i}", tokens=[0])) for i in range(draw(INTS[0, 3])))
    for root in (t.root for t in group):
        if draw(BOOLS):
            _continuations(draw, root, rewards)
        for _ in range(0 if root.prefix_end else draw(INTS[1, 3])):
            prefix = _chain(draw, root, draw(INTS[1, 3]))
            if draw(BOOLS):
                _end(draw, prefix, rewards)
            else:
                _continuations(draw, prefix, rewards)
    return group


@st.composite
def vines(draw, rewards=REWARDS) -> Group:
    """VinePPO's groups (rollout.vineppo): one tree of 0-4 chains from the root, marked `sampled`
    (trained), then 0-2 continuations of 1-2 steps (not sampled) from the root and each step but
    the last of each scored, untruncated chain."""
    root = Node("v", tokens=[0])
    ends = [
        _end(draw, _chain(draw, root, draw(INTS[1, 3])), rewards) for _ in range(draw(INTS[0, 4]))
    ]
    for x in ends:
        x.sampled = True
    for s in dict.fromkeys(
        s for x in ends if x.scored and not truncated(x) for s in [root, *path(x)[:-1]]
    ):
        for _ in range(draw(INTS[0, 2])):
            _end(draw, _chain(draw, s, draw(INTS[1, 2])), rewards).sampled = False
    return Group([Tree(root)])


GOLD_LOGPS = st.sampled_from([math.log(0.1), math.log(0.5), math.log(0.9), 0.0, -30.0])


@st.composite
def turn_chains(draw, rewards=REWARDS) -> Group:
    """IGPO's and MT-GRPO's groups: `chains`, each tree's gold answer "x" (a step's observation "x"
    holds it: MT-GRPO's turn reward), IGPO's gold_logp on the root and every inner step."""
    group = draw(chains(rewards))
    for t in group:
        t.golden_answers = ["x"]
        for n in walk(t.root):
            n.gold_logp = draw(GOLD_LOGPS) if n.children or n.parent is None else None
    return group


def configs(tree_mode: str | None) -> st.SearchStrategy:
    """Every CreditConfig: each field drawn from its choices (a Literal's, or a bool)."""
    hints, kw = typing.get_type_hints(CreditConfig), {}
    for f in fields(CreditConfig):
        if hints[f.name] is bool:
            kw[f.name] = st.booleans()
        elif typing.get_origin(hints[f.name]) is typing.Literal:
            kw[f.name] = st.sampled_from(typing.get_args(hints[f.name]))
        else:
            raise TypeError(f"CreditConfig.{f.name}: {hints[f.name]}; give configs() its choices")
    return st.builds(CreditConfig, **kw | ({"tree_mode": st.just(tree_mode)} if tree_mode else {}))


# ---- helpers -------------------------------------------------------------------------------------


def whiten(values: list[float]) -> list[float]:
    """(v - mean) / (std + EPS), unbiased std, 0 for a group of one: group_normalize written apart,
    in the exact arithmetic of `statistics`."""
    if len(values) < 2:
        return [0.0] * len(values)
    m, s = fmean(values), stdev(values)
    return [(v - m) / (s + EPS) for v in values]


def rewards(nodes) -> list[float]:
    return [x.reward for x in nodes]


def near(got, want, tol: float, where="") -> None:
    """got == want, floats to `tol`, through dicts and lists; anything else exactly."""
    if isinstance(want, dict | list):
        assert len(got) == len(want) and type(got) is type(want), f"{where}: {got} != {want}"
        for k in want if isinstance(want, dict) else range(len(want)):
            near(got[k], want[k], tol, f"{where}/{k}")
    elif isinstance(want, float) and isinstance(got, float):
        assert abs(got - want) <= tol, f"{where}: {got} != {want} (tol {tol})"
    else:
        assert got == want, f"{where}: {got} != {want}"


def copy(group: list[Tree], a: float = 1.0, b: float = 0.0) -> list[Tree]:
    """A copy of `group`, every reward r made a r + b."""
    out = [Tree.from_dict(t.to_dict()) for t in group]
    for x in (x for t in out for x in walk(t.root) if x.reward is not None):
        x.reward = a * x.reward + b
    return out


def outcome(group: list[Tree], trajectories, times: float = 1.0) -> dict:
    """What a credit gives (its advantages times `times`), keyed by ids: the trained leaves, each
    step's advantages over the trajectories that train it (sorted), its credit in the loss, each
    node's value and advantage. Per step, not per trajectory: a step trained once
    (first-untruncated) is trained in the first trajectory through it, which reordering siblings
    changes; a leaf's own step is in one trajectory, so each trajectory's last advantage is
    compared as is."""
    per_step, nodes = {}, [n for t in group for n in walk(t.root)]
    for t in trajectories:
        for s, a in zip(t.steps, t.advantages):
            per_step.setdefault(s.id, []).extend([] if a is None else [a * times])
    return {
        "leaves": sorted(t.leaf.id for t in trajectories),
        "per_step": {k: sorted(v) for k, v in per_step.items()},
        "credit": {k: a * times for k, a in step_credit(trajectories).items()},
        "value": {n.id: n.value for n in nodes},
        "advantage": {n.id: None if n.advantage is None else n.advantage * times for n in nodes},
    }


def scale(group: list[Tree]) -> float:
    return max([abs(x.reward) for t in group for x in scored_leaves(t.root)], default=0.0)


# ---- each paper's identities ---------------------------------------------------------------------


def grpo_identities(group, cfg, trajectories, tol):
    """GRPO (Shao et al. 2024, Eq. 3; Cut the Bill §5.3): A_i = (r_i - mean) / (std + ε), on every
    step of trajectory i."""
    A = whiten(R := rewards(t.leaf for t in trajectories))
    for t, a in zip(trajectories, A):
        near(t.advantages, [a] * t.leaf.depth, tol, t.leaf.id)
    # Eq. 3: the group's advantages sum to 0, whatever ε (one denominator for all) ...
    assert abs(sum(A)) <= tol * max(1, len(A))
    # ... and their sample variance is (s / (s + ε))^2: 1 only where the spread s >> ε = 1e-6. ε
    # keeps a tie (s = 0) at 0 instead of 0/0 = NaN, and makes a spread far below 1e-6 (rewards
    # 1e-12 apart) count as none: why scaling rewards changes a whitened credit there
    if len(A) > 1:
        s = stdev(R)
        assert sum(a * a for a in A) / (len(A) - 1) == approx((s / (s + EPS)) ** 2, abs=tol)


def anchor(step: Node, cfg) -> object:
    """GiGPO's anchor state of a step (gigpo-exact-state): the question for a first step, else its
    parent's doc-id set (gigpo_state "docs", if it retrieved any) or observation text."""
    parent = step.parent
    if parent.parent is None:
        return ("question",)
    return (
        frozenset(parent.doc_ids)
        if cfg.gigpo_state == "docs" and parent.doc_ids
        else parent.obs_text
    )


def gigpo_identities(group, cfg, trajectories, tol):
    """GiGPO (Feng et al. 2025, §4): A(a_t^i) = A^E(τ_i) + ω A^S(a_t^i) (Eq. 8)."""
    rows = [t.leaf for t in trajectories for _ in range(t.leaf.depth if cfg.gigpo_step_rows else 1)]
    A_E = dict(zip(rows, whiten(rewards(rows))))  # Eq. 3 (rows: gigpo-episode-stats)
    groups: dict[object, list] = {}  # Eq. 6: the steps taken from one anchor state
    for t in trajectories:
        for s, a in zip(t.steps, t.advantages):
            R_t = advantages.GIGPO_GAMMA ** (t.leaf.depth - s.depth) * t.leaf.reward  # Eq. 5
            A_S = (a - A_E[t.leaf]) / advantages.GIGPO_OMEGA
            groups.setdefault(anchor(s, cfg), []).append((A_S, R_t))
    for G in groups.values():
        A_S, R_t = zip(*G)
        near(list(A_S), whiten(list(R_t)), tol)  # Eq. 7 over G^S(s)
        assert abs(sum(A_S)) <= tol * len(G)  # so a state's step advantages sum to 0


def treepo_advantage(group, leaf, prompt_mean) -> float:
    """TreePO (Li et al. 2025, Fig. 3): A_i = (1/|J_i|) Σ_j (R_i - mean G_j) = R_i - the mean of
    its subgroups' means: the prompt's, then each ancestor (a tree's root if the prompt has several
    trees) with more than one scored leaf."""
    above = ([path(leaf)[0].parent] if len(group) > 1 else []) + path(leaf)[:-1]
    means = [prompt_mean] + [fmean(rewards(G)) for n in above if len(G := scored_leaves(n)) > 1]
    return leaf.reward - fmean(means)


def tree_grpo_identities(group, cfg, trajectories, tol):
    """Tree-GRPO §4.2.4: A_tree(H_i) = A_intra(H_i) + A_inter(H_i); TreePO as its tree_mode."""
    L = [t.leaf for t in trajectories]
    inter = dict(zip(L, whiten(rewards(L))))  # GRPO over the prompt's leaves
    intra = {}  # GRPO over the leaves of H_i's own tree
    for t in group:
        intra |= (mine := dict(zip(T := scored_leaves(t.root), whiten(rewards(T)))))
        # Prop. 3.1 (intra-tree GRPO is step-level preference learning): the intra advantages
        # of a tree sum to 0, so a step that all of a tree's leaves share nets no intra credit
        assert abs(sum(mine.values())) <= tol * max(1, len(mine))
    want = {
        "both": lambda x: intra[x] + inter[x],
        "intra": intra.get,
        "inter": inter.get,  # Table 4: inter alone is GRPO over the tree's leaves
        "treepo": lambda x: treepo_advantage(group, x, fmean(rewards(L))),
    }[cfg.tree_mode]
    for t in trajectories:
        near(t.advantages, [want(t.leaf)] * t.leaf.depth, tol, t.leaf.id)


def arpo_identities(group, cfg, trajectories, tol):
    """ARPO (Dong et al. 2025, §3, advantage attribution): Â_j GRPO over the scored leaves; soft:
    each trajectory's steps get its Â_j; hard: a step gets the mean Â_j of the d leaves below it,
    trained once (arpo-hard-once)."""
    A = dict(zip(L := [t.leaf for t in trajectories], whiten(rewards(L))))
    times: dict[Node, int] = {}
    for t in trajectories:
        for s, a in zip(t.steps, t.advantages):
            times[s] = times.get(s, 0) + (a is not None)
            want = A[t.leaf] if cfg.arpo_credit == "soft" else fmean(A[j] for j in scored_leaves(s))
            assert a is None or abs(a - want) <= tol, (t.leaf.id, s.id)
    assert cfg.arpo_credit == "soft" or set(times.values()) <= {1}, times


def branpo_identities(group, cfg, trajectories, tol):
    """BranPO §4.3 (Eqs. 10-12), §4.4 (Eq. 14) on each original's prefix B_n and continuations
    C_n; its official code's switches (branpo_skip_empty_base, branpo_clip_losers) as written."""
    # B_n's last node: the root if marked (k = 0), else each root child's marked step or its leaf
    ends = [
        next((n for n in walk(c) if n.prefix_end), leaves(c)[0])
        for t in group
        for c in ([t.root] if t.root.prefix_end else t.root.children)
    ]
    groups = [(end, C) for end in ends if (C := scored_leaves(end))]
    for end, C in groups:
        assert end.value == approx(fmean(rewards(C)), abs=tol)  # Eq. 10: r_base, the mean of C_n
    based = [end for end, _ in groups if end.depth or not cfg.branpo_skip_empty_base]
    A_base = dict(zip(based, whiten([end.value for end in based])))  # Eq. 11
    Cs = [C for _, C in groups]
    Cs = [[x for C in Cs for x in C]] if cfg.branpo_norm == "prompt" else Cs
    A_branch = {x: a for C in Cs for x, a in zip(C, whiten(rewards(C)))}  # Eq. 12 / Algorithm 1
    by_leaf = {t.leaf: t.advantages for t in trajectories}
    assert by_leaf.keys() == A_branch.keys()
    for end, C in groups:
        # preference-mask's losers: those through a redundant step, else those below C's best
        redundant = [x for x in C if any(s.redundant for s in path(x)[end.depth :])]
        losers = redundant or [x for x in C if x.reward < max(rewards(C))]
        losers = losers if cfg.branpo_clip_losers else []
        trained = [0] * end.depth
        for x in C:
            for i, a in enumerate(by_leaf[x][: end.depth]):  # the prefix: A_base, trained once
                trained[i] += a is not None
                assert a is None or abs(a - A_base[end]) <= tol
            for s, a in zip(path(x)[end.depth :], by_leaf[x][end.depth :]):
                if x in losers:  # preference-mask: the loser's whole suffix, min(A_branch, 0)
                    assert abs(a - min(A_branch[x], 0.0)) <= tol
                else:  # Eq. 14 (rsm-excluded): a redundant step is left out
                    assert a is None if s.redundant else abs(a - A_branch[x]) <= tol
        assert trained == [1] * end.depth  # every prefix step once (first-untruncated)


def carl_identities(group, cfg, trajectories, tol):
    """CARL §5: V(leaf) = R (Eq. 9), V(s) = mean of its children's V (Eq. 10; carl-defined-
    children), A(s -> s') = V(s') - V(s) (Eq. 11), trained once where s has several children
    (Eq. 13); with carl_update_all a single child inherits the edge above (Eq. 16)."""
    V: dict[Node, float | None] = {}
    for n in reversed([n for t in group for n in walk(t.root)]):
        vs = [V[c] for c in n.children if V[c] is not None]
        V[n] = (n.reward if n.scored else None) if not n.children else fmean(vs) if vs else None
        near(n.value, V[n], tol, n.id)
        if len(vs) > 1:  # Eqs. 10-11: the advantages of a state's actions sum to 0
            assert abs(sum(v - V[n] for v in vs)) <= tol * len(vs)
    forks = lambda s: sum(V[c] is not None for c in s.parent.children) > 1
    edge = lambda s: V[s] - V[s.parent] if forks(s) else 0.0 if s.depth == 1 else edge(s.parent)
    trained: dict[Node, list[float]] = {}
    for t in trajectories:
        for s, a in zip(t.steps, t.advantages):
            trained.setdefault(s, []).extend([] if a is None else [a])
    for s, A in trained.items():
        wanted = (forks(s) or cfg.carl_update_all) and (cfg.carl_train_phase1 or not s.phase1)
        assert len(A) == wanted, (s.id, A)  # Eq. 13 (App. C.1: phase1 steps left out)
        assert all(abs(a - edge(s)) <= tol for a in A), s.id  # Eq. 11, or Eq. 16


def treeps_identities(group, cfg, trajectories, tol):
    """TreePS-RAG §2.3, Algorithm 1 l. 28-30: V(n) the mean reward of its leaves L(n),
    A(n) = (A_global + A_local) / sqrt|L(n)| = (2 V(n) - V(root) - V(parent)) / sqrt|L(n)|; the
    Table 2 ablation (treeps_process=False): GRPO over the trajectories trained."""
    V = lambda n: fmean(rewards(scored_leaves(n)))
    for t, a in zip(trajectories, whiten(rewards(t.leaf for t in trajectories))):
        root = t.steps[0].parent
        A = [
            ((V(n) - V(root)) + (V(n) - V(n.parent))) / len(scored_leaves(n)) ** 0.5
            for n in t.steps
        ]
        near(t.advantages, A if cfg.treeps_process else [a] * t.leaf.depth, tol, t.leaf.id)


def at2po_identities(group, cfg, trajectories, tol):
    """AT2PO (Zong et al. 2026, turn-wise credit; advantages.at2po): leaves z-scored within their
    tree; V(n) a softmax(H)-weighted, plain or leaf mean; A(n) from V by `at2po_advantage`."""
    for t in group:
        L = scored_leaves(t.root)
        near([x.value for x in L], whiten(rewards(L)), tol)  # the z-scores, summing to 0
        for n in (n for n in walk(t.root) if any(c.value is not None for c in n.children)):
            kids = [c for c in n.children if c.value is not None]
            if cfg.at2po_value == "leaf":
                near(n.value, fmean(x.value for x in scored_leaves(n)), tol, n.id)
                continue
            H = [action_nll(c) if cfg.at2po_value == "entropy" else 0.0 for c in kids]
            w = [math.exp(h - max(H)) for h in H]  # softmax over H(c), or equal weights
            near(n.value, sum(wi * c.value for wi, c in zip(w, kids)) / sum(w), tol, n.id)
            # a weighted mean of its children lies between them
            assert min(c.value for c in kids) - tol <= n.value <= max(c.value for c in kids) + tol
    for t in trajectories:  # every step of every scored trajectory is trained with its A(n)
        V, root = [s.value for s in t.steps], t.steps[0].parent.value
        local = [v - s.parent.value for v, s in zip(V, t.steps)]
        want = {"value": V, "parent": local, "root": [v - root for v in V]}
        want["both"] = [a + v - root for a, v in zip(local, V)]
        near(t.advantages, want[cfg.at2po_advantage], tol, t.leaf.id)


def treeps_drawn(group) -> list[Node]:
    """TreePS-RAG's trained leaves (treeps-sampled): those drawn, marked `sampled` (none: all)."""
    L = [x for t in group for x in scored_leaves(t.root)]
    return [x for x in L if x.sampled] or L


def vineppo_ends(group) -> list[Node]:
    """VinePPO's trained leaves: the scored leaves marked `sampled` (none marked: every one)."""
    every = [x for t in group for x in leaves(t.root)]
    ends = [x for x in every if x.sampled] or every
    return [x for t in group for x in scored_leaves(t.root) if x in ends]


def vineppo_identities(group, cfg, trajectories, tol):
    """VinePPO (Kazemnejad et al. 2025, §4): V̂(s) the mean reward of the Monte Carlo continuations
    from context s (its children on no trained path); A(s_t, a_t) = V̂(s_{t+1}) - V̂(s_t), and
    R - V̂(s_T) for the last step: r + γ V̂(s') - V̂(s) with γ = 1 and V(terminal) = 0."""
    every = [x for t in group for x in leaves(t.root)]
    on_path = {s for x in [x for x in every if x.sampled] or every for s in path(x)}

    def V(s: Node) -> float | None:
        L = [x for c in s.children if c not in on_path for x in scored_leaves(c)]
        return fmean(rewards(L)) if L else None

    after = lambda s: V(s) if s.children else s.reward  # V̂(s_{t+1}), or R after the last step
    times: dict[Node, int] = {}
    for t in trajectories:
        for s, a in zip(t.steps, t.advantages):
            times[s] = times.get(s, 0) + (a is not None)
            assert a is None or abs(a - (after(s) - V(s.parent))) <= tol, s.id
        # the TD advantages of a path telescope: Σ_t A_t = R - V̂(s_0), its return minus the root's
        if all(s.advantage is not None for s in t.steps):
            total = sum(s.advantage for s in t.steps)
            assert abs(total - (t.leaf.reward - V(t.steps[0].parent))) <= tol * t.leaf.depth
    for s, n in times.items():  # trained once (first-untruncated), where both V̂ are estimated
        assert n == (after(s) is not None and V(s.parent) is not None), s.id  # vineppo-no-estimate


def zscore(values: list[float], eps: float, population: bool = False) -> list[float]:
    """(v - mean) / (std + eps), written apart; the unbiased std (0 for a group of one), or IGPO's
    population one, sqrt(var + 1e-8), 1 for a group of one."""
    if not values:
        return []
    m = fmean(values)
    if population:
        s = math.sqrt(fmean((v - m) ** 2 for v in values) + 1e-8) if len(values) > 1 else 1.0
    elif len(values) < 2:
        return [0.0] * len(values)
    else:
        s = stdev(values)
    return [(v - m) / (s + eps) for v in values]


def igpo_identities(group, cfg, trajectories, tol):
    """IGPO §3: r_t = P_t - P_{t-1} (P = exp(gold_logp), or its log with igpo_gain "logprob"), the
    outcome R last; normalise (gains apart from outcomes, Eq. 6), then A_t = Σ_{j>=t} r̂_j (Eq. 7,
    γ = 1); or (igpo_order "discount") the raw sums to go z-scored by the group's first ones."""
    P = (lambda n: math.exp(n.gold_logp)) if cfg.igpo_gain == "prob" else lambda n: n.gold_logp
    L = [t.leaf for t in trajectories]
    r = {x: [P(s) - P(s.parent) for s in path(x)[:-1]] + [x.reward] for x in L}
    to_go = lambda v: [sum(v[i:]) for i in range(len(v))]
    if cfg.igpo_order == "discount":
        G = {x: to_go(r[x]) for x in L}
        firsts = [G[x][0] for x in L]
        m, sd = fmean(firsts) if L else 0.0, stdev(firsts) if len(L) > 1 else math.inf
        want = {x: [(g - m) / (sd + 1e-6) for g in G[x]] for x in L}
    else:
        gains = iter(zscore([g for x in L for g in r[x][:-1]], 1e-6, population=True))
        ends = dict(zip(L, zscore(rewards(L), 1e-6, population=True)))
        want = {x: to_go([next(gains) for _ in r[x][:-1]] + [ends[x]]) for x in L}
    for t in trajectories:
        near(t.advantages, want[t.leaf], tol * max(1, t.leaf.depth), t.leaf.id)


def mtgrpo_identities(group, cfg, trajectories, tol):
    """MT-GRPO (its per-turn-index form, and ours): turn rewards 0.5 where a step's information
    holds the gold; biased: the last step z_O(R) and each earlier one adds its own turn's z_k(r) (so
    A_k - A_{k+1} = z_k); unbiased: A_k = z_k(sum to go) over the chains that reached turn k, so
    each turn's advantages sum to 0."""
    L = [t.leaf for t in trajectories]
    r = {x: [0.5 if "x" in s.obs_text.lower() else 0.0 for s in path(x)[:-1]] for x in L}
    A = {t.leaf: t.advantages for t in trajectories}
    z_O = dict(zip(L, zscore(rewards(L), 1e-4)))
    for k in range(max((x.depth for x in L), default=0)):
        if cfg.mtgrpo_baseline == "biased":
            at = [x for x in L if len(r[x]) > k]
            for x, z in zip(at, zscore([r[x][k] for x in at], 1e-4)):
                assert abs(A[x][k] - A[x][k + 1] - z) <= 2 * tol * max(1, x.depth), (x.id, k)
        else:
            at = [x for x in L if x.depth > k]
            G = [sum(r[x][k:]) + x.reward for x in at]
            near([A[x][k] for x in at], zscore(G, 1e-4), tol, f"turn {k}")
            assert abs(sum(A[x][k] for x in at)) <= tol * max(1, len(at))
    if cfg.mtgrpo_baseline == "biased":
        for x in L:
            assert abs(A[x][-1] - z_O[x]) <= tol, x.id


# ---- the registry's contracts --------------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    """What these tests know of one registered credit."""

    groups: Callable  # rewards strategy -> the strategy of the groups it takes
    refusal: str  # a regex of its own error on a group outside that shape ("": refuses none)
    rewards: Callable[[CreditConfig], str]  # "whitened", "baseline" (R minus means) or "discounted"
    identities: Callable  # (group, cfg, trajectories, tol): its paper's identities, asserted
    trains: Callable = lambda group: [x for t in group for x in scored_leaves(t.root)]


CHAINS_ONLY = r"expects chains, but tree '[^']+' branches at \[.*\]; use tree_grpo"
ORIGINALS = (
    r"marks \d+ prefix ends .*, so mark exactly one node|branches into .* but marks no prefix_end"
    r"|branches above its prefix_end .* are not continuations of it"
)
CONTRACTS = {
    "grpo": Contract(chains, CHAINS_ONLY, lambda c: "whitened", grpo_identities),
    "tree_grpo": Contract(
        trees,
        "",
        lambda c: "baseline" if c.tree_mode == "treepo" else "whitened",
        tree_grpo_identities,
    ),
    "branpo": Contract(originals, ORIGINALS, lambda c: "whitened", branpo_identities),
    "carl": Contract(trees, "", lambda c: "baseline", carl_identities),
    "treeps": Contract(
        trees,
        "",
        lambda c: "baseline" if c.treeps_process else "whitened",
        treeps_identities,
        treeps_drawn,
    ),
    # Eq. 5's γ^(T - t) R: a shift of R shifts the steps of one state's group unequally
    "gigpo": Contract(chains, CHAINS_ONLY, lambda c: "discounted", gigpo_identities),
    "at2po": Contract(trees, "", lambda c: "whitened", at2po_identities),
    "arpo": Contract(trees, "", lambda c: "whitened", arpo_identities),
    "vineppo": Contract(vines, "", lambda c: "baseline", vineppo_identities, vineppo_ends),
    # a reward at every turn: the turn rewards (IGPO's gains, MT-GRPO's) do not move with R, so a
    # sum of them and R ("mixed") is shift-invariant and not scale-invariant
    "igpo": Contract(
        turn_chains,
        CHAINS_ONLY.replace("; use tree_grpo", "") + "|has no gold_logp",
        lambda c: "mixed" if c.igpo_order == "discount" else "whitened",
        igpo_identities,
    ),
    "mtgrpo": Contract(
        turn_chains,
        CHAINS_ONLY,
        lambda c: "mixed" if c.mtgrpo_baseline == "unbiased" else "whitened",
        mtgrpo_identities,
    ),
}
TURN_REWARDS = ("igpo", "mtgrpo")  # a signal where every outcome ties: their turn rewards
TREE_MODES = typing.get_args(typing.get_type_hints(CreditConfig)["tree_mode"])
VARIANTS = [
    pytest.param(algo, mode, id=f"{algo}-{mode}" if mode else algo)
    for algo in rollout.ALGOS
    for mode in (TREE_MODES if algo == "tree_grpo" else [None])
]


def credit(algo: str, group: list[Tree], cfg: CreditConfig):
    """The registry's credit, as train.py calls it."""
    return rollout.ALGOS[algo].credit(group, cfg)


def tolerance(algo: str, cfg: CreditConfig, group: list[Tree]) -> float:
    baseline = CONTRACTS[algo].rewards(cfg) == "baseline"
    return 1e-9 + (1e-12 * scale(group) if baseline else 0.0)


def test_every_registered_credit_has_a_contract():
    assert set(CONTRACTS) == set(rollout.ALGOS), "give each registered credit a Contract"
    for name, c in CONTRACTS.items():
        assert c.rewards(CreditConfig()) in ("whitened", "baseline", "discounted", "mixed"), name
    configs(None)  # every CreditConfig field has its choices here (else: a TypeError)


# ---- every credit --------------------------------------------------------------------------------


@pytest.mark.parametrize("algo, mode", VARIANTS)
@PROPERTY
@given(data=st.data())
def test_every_credit_keeps_its_contract_and_raises_only_its_own_refusal(algo, mode, data):
    c = CONTRACTS[algo]
    group = data.draw(st.one_of(c.groups(), trees(), chains(), originals(), vines()), label="group")
    cfg = data.draw(configs(mode), label="cfg")
    before = [(n.id, n.reward) for t in group for n in walk(t.root)]
    try:
        trajectories = credit(algo, group, cfg)
    except ValueError as e:  # only its own refusal, naming what is wrong; anything else fails
        assert c.refusal and re.search(c.refusal, str(e)), f"{algo}: {e!r}"
        return
    assert [t.leaf for t in trajectories] == c.trains(group)
    assert [(n.id, n.reward) for t in group for n in walk(t.root)] == before  # three-fields
    for t in trajectories:
        assert len(t.advantages) == t.leaf.depth
        assert all(math.isfinite(a) for a in t.advantages if a is not None), t.advantages
    assert all(n.value is None or math.isfinite(n.value) for t in group for n in walk(t.root))
    samples = to_samples(trajectories)  # every trained token: finite; truncated ones: none
    assert all(math.isfinite(a) for s in samples for a in s.advantages)
    assert not {s.leaf_id for s in samples} & {t.leaf.id for t in trajectories if truncated(t.leaf)}


@pytest.mark.parametrize("algo, mode", VARIANTS)
@PROPERTY
@given(data=st.data())
def test_every_credit_is_invariant_to_the_order_of_siblings_and_of_trees(algo, mode, data):
    group = data.draw(CONTRACTS[algo].groups(), label="group")
    cfg = data.draw(configs(mode), label="cfg")
    rng = data.draw(st.randoms(use_true_random=False), label="rng")
    shuffled = copy(group)
    for n in [n for t in shuffled for n in walk(t.root)]:
        rng.shuffle(n.children)
    rng.shuffle(shuffled)
    want = outcome(group, credit(algo, group, cfg))
    near(outcome(shuffled, credit(algo, shuffled, cfg)), want, tolerance(algo, cfg, group))


@pytest.mark.parametrize("algo, mode", VARIANTS)
@PROPERTY
@given(data=st.data())
def test_every_credit_is_unchanged_without_its_discarded_trajectories(algo, mode, data):
    # Cut the Bill §5.4.2 "discard": an env_error trajectory is in no group statistic, never
    # trained; removing every step with no scored leaf below it changes no other number
    group = data.draw(CONTRACTS[algo].groups(), label="group")
    cfg = data.draw(configs(mode), label="cfg")
    kept = copy(group)
    for n in [n for t in kept for n in walk(t.root)]:
        n.children = [c for c in n.children if scored_leaves(c)]
    want = {t.leaf.id: t.advantages for t in credit(algo, group, cfg)}
    near(
        {t.leaf.id: t.advantages for t in credit(algo, kept, cfg)},
        want,
        tolerance(algo, cfg, group),
    )


@pytest.mark.parametrize("algo, mode", VARIANTS)
@PROPERTY
@given(data=st.data())
def test_every_credit_gives_no_signal_when_every_reward_ties(algo, mode, data):
    # GRPO's Eq. 3 (and each method's mean baseline): equal rewards, nothing to prefer. GiGPO ties
    # at 0 only: its step groups compare γ^(T - t) R (Eq. 5), unequal along a chain for R != 0
    # IGPO and MT-GRPO: their turn rewards are the signal that survives tied outcomes (IGPO's
    # "advantage collapse"); what ties is their outcome term, asserted with the turn rewards zeroed
    tie = data.draw(st.sampled_from([0.0, -0.0] if algo == "gigpo" else EDGES), label="tie")
    group = data.draw(CONTRACTS[algo].groups(rewards=st.just(tie)), label="group")
    cfg = data.draw(configs(mode), label="cfg")
    for n in (n for t in group for n in walk(t.root) if algo in TURN_REWARDS):
        n.gold_logp, n.obs_text = (None if n.gold_logp is None else 0.0), ""  # no gain, no gold
    for t in credit(algo, group, cfg):
        near(t.advantages, [None if a is None else 0.0 for a in t.advantages], 1e-9)


@pytest.mark.parametrize("algo, mode", VARIANTS)
@PROPERTY
@given(data=st.data())
def test_a_shift_of_every_reward_leaves_every_credit_but_gigpo_unchanged(algo, mode, data):
    # a whitened credit centres each group on its mean (GRPO Eq. 3, Tree-GRPO §4.2.4, BranPO Eqs.
    # 11-12, AT2PO's z-scores, ARPO's Â); CARL's V(s') - V(s) (Eq. 11), TreePS-RAG's V differences
    # (Alg. 1 l. 30), TreePO's R - means (Fig. 3), VinePPO's V̂(s') - V̂(s) subtract means: a shift
    # cancels. b is exact on ±1e12 (a multiple of its ulp); on another reward it rounds to the ulp
    # of b (~4e-16), which a whitened credit divides by at least ε: below 1e-8
    cfg = data.draw(configs(mode), label="cfg")
    if CONTRACTS[algo].rewards(cfg) == "discounted":
        pytest.skip("GiGPO: Eq. 5's γ^(T - t) (R + b) shifts a state's steps by unequal amounts")
    group = data.draw(CONTRACTS[algo].groups(), label="group")
    shifted = copy(group, b=data.draw(st.sampled_from([-1.0, 0.5, 3.0]), label="shift"))
    want = outcome(group, credit(algo, group, cfg))
    got = outcome(shifted, credit(algo, shifted, cfg))
    near(got["credit"], want["credit"], 1e-8 + 1e-12 * scale(shifted))
    near(got["per_step"], want["per_step"], 1e-8 + 1e-12 * scale(shifted))


@pytest.mark.parametrize("algo, mode", VARIANTS)
@PROPERTY
@given(data=st.data())
def test_a_positive_scale_leaves_a_whitened_credit_unchanged_and_scales_a_baseline(
    algo, mode, data
):
    # whitened: c (r - m) / (c s + ε) = (r - m) / (s + ε) up to ε: the change is |A| ε (c - 1) /
    # (c s + ε) <= |A| ε / s. SEPARATED rewards keep every group's spread s above ~0.03 (values 0.5
    # apart, groups of <= 24 leaves, BranPO's means of <= 3), so the change stays below 1e-3; far
    # below ε it does not hold at all (test_the_std_epsilon_...). A baseline (R minus means)
    # scales with c
    cfg = data.draw(configs(mode), label="cfg")
    if CONTRACTS[algo].rewards(cfg) == "mixed":
        pytest.skip("IGPO discounted first, MT-GRPO unbiased: R summed with turn rewards unscaled")
    group = data.draw(CONTRACTS[algo].groups(rewards=SEPARATED), label="group")
    c = data.draw(st.sampled_from([2.0, 10.0, 1e3]), label="scale")
    scaled = copy(group, a=c)
    baseline = CONTRACTS[algo].rewards(cfg) == "baseline"
    want = outcome(group, credit(algo, group, cfg), times=c if baseline else 1.0)
    got = outcome(scaled, credit(algo, scaled, cfg))
    tol = 1e-8 + 1e-12 * scale(scaled) if baseline else 1e-3
    near(got["credit"], want["credit"], tol)
    near(got["per_step"], want["per_step"], tol)


def test_the_std_epsilon_makes_a_spread_far_below_it_count_as_none():
    # [1e-12, 0]: mean 5e-13, s = sqrt(2 (5e-13)^2 / 1) = 7.0711e-13, A = ±5e-13 / (s + 1e-6) =
    # ±4.99999e-7, about 0; scaled by 1e12 to [1, 0]: mean 0.5, s = 0.70711, A = ±0.5 / 0.707108 =
    # ±0.70710: not scale-invariant far below ε (the scale property's SEPARATED rewards)
    assert advantages.group_normalize([1e-12, 0.0]) == approx([5e-7, -5e-7], rel=1e-5)
    assert advantages.group_normalize([1.0, 0.0]) == approx([0.70710, -0.70710], abs=1e-5)


@pytest.mark.parametrize("algo, mode", VARIANTS)
@IDENTITIES
@given(data=st.data())
def test_every_credit_obeys_its_papers_identities(algo, mode, data):
    group = data.draw(CONTRACTS[algo].groups(), label="group")
    cfg = data.draw(configs(mode), label="cfg")
    trajectories = credit(algo, group, cfg)
    CONTRACTS[algo].identities(group, cfg, trajectories, tolerance(algo, cfg, group))


# ---- reductions on chains ------------------------------------------------------------------------


@st.composite
def marked_chains(draw) -> Group:
    """Chains, some with a step but the last marked `prefix_end` (BranPO: one continuation)."""
    group = draw(chains())
    for t in group:
        if (steps := [n for n in walk(t.root) if n.parent and n.children]) and draw(BOOLS):
            draw(st.sampled_from(steps)).prefix_end = True
    return group


@pytest.mark.parametrize(
    "algo, flags",
    [
        ("tree_grpo", dict(tree_mode="both")),  # every tree one leaf: A_intra = 0 (group-of-one)
        ("tree_grpo", dict(tree_mode="inter")),  # Table 4: GRPO over the leaves
        ("arpo", dict(arpo_credit="soft")),  # §3: GRPO over the leaves
        ("arpo", dict(arpo_credit="hard")),  # no step is shared: each its leaf's Â
        ("branpo", dict()),  # Theorem B.1: one continuation per prefix is GRPO
        ("treeps", dict(treeps_process=False)),  # Table 2 ablation, every leaf drawn or none
    ],
)
@PROPERTY
@given(group=marked_chains())
def test_on_chains_each_tree_method_is_grpo(algo, flags, group):
    for x in (x for t in group for x in walk(t.root)):
        x.sampled = False
    want = {t.leaf.id: t.advantages for t in credit("grpo", group, CreditConfig())}
    near({t.leaf.id: t.advantages for t in credit(algo, group, CreditConfig(**flags))}, want, 1e-9)


@PROPERTY
@given(group=chains())
def test_treepo_on_chains_is_the_reward_minus_the_prompt_mean(group):
    # TreePO Fig. 3: a chain's steps hold one leaf each, no subgroup but the prompt's: R_i - mean R
    L = [x for t in group for x in scored_leaves(t.root)]
    for t in credit("tree_grpo", group, CreditConfig(tree_mode="treepo")):
        want = [t.leaf.reward - fmean(rewards(L))] * t.leaf.depth
        near(t.advantages, want, 1e-9 + 1e-12 * scale(group))
