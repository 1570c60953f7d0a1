"""advantages.py: every paper's credit assignment on small hand-built trees, with the arithmetic
written out; its command line, with Tree-GRPO's budget and the worked demo (scripts/credit.py).

Group convention: (r - mean) / (std + 1e-6), unbiased std. The 1e-6 changes results below 1e-5, so
expected values are written from the exact formula and compared with approx(abs=1e-5).
"""

import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pytest import approx

import rollout
from advantages import (
    CreditConfig,
    branpo,
    carl,
    group_normalize,
    grpo,
    tree_grpo,
    treeps,
)
from scripts.credit import demo, load_trees, tree_grpo_budget
from tree import Node, Tree, step_credit, to_samples, walk

ROOT = Path(__file__).resolve().parents[1]
S3 = math.sqrt(3)
CREDITS = {name: algo.credit for name, algo in rollout.ALGOS.items()}  # the registry's


C = CreditConfig()  # the credit flags' defaults


def registry_credit(algo: str, trees, **flags):
    """The registry's credit for `algo` with these credit flags (CreditConfig's fields), as train.py
    calls it."""
    return rollout.ALGOS[algo].credit(trees, CreditConfig(**flags))


def n(id_, *children, **kw):
    return {"id": id_, "children": list(children), **kw}


def leaf(id_, r, **kw):
    return n(id_, reward=r, **kw)


def chain(id_, depth, r, **kw):
    """A root with one path of `depth` steps ending in reward r."""
    node = leaf(f"{id_}.{'.'.join('0' * depth)}", r, **kw)
    for d in range(depth - 1, 0, -1):
        node = n(f"{id_}.{'.'.join('0' * d)}", node)
    return n(id_, node)


def T(*roots):
    return [Tree.from_dict(r) for r in roots]


def by_leaf(trajectories):
    return {t.leaf.id: t.advantages for t in trajectories}


def close(got: dict, want: dict):
    assert got.keys() == want.keys()
    for k in want:
        assert [None if a is None else approx(a, abs=1e-5) for a in want[k]] == got[k], k


# ---- group normalization -------------------------------------------------------------------------


def test_group_normalize_uses_the_unbiased_std_and_gives_zero_without_spread():
    # [1,0,0,0]: mean 0.25; unbiased var = (0.75^2 + 3*0.25^2)/3 = 0.75/3 = 0.25, std 0.5
    assert group_normalize([1, 0, 0, 0]) == approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert group_normalize([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]  # equal rewards: no signal
    assert group_normalize([1.0]) == [0.0]  # a group of one (verl would return 1.0)
    assert group_normalize([]) == []


# ---- GRPO ----------------------------------------------------------------------------------------


def test_grpo_normalizes_rewards_including_a_format_penalty_over_the_group():
    # rewards 1, 0, -0.5 (BranPO's format penalty): mean 1/6
    # r - mean = 5/6, -1/6, -2/3; var = (25/36 + 1/36 + 16/36)/2 = 42/72 = 7/12; std = 0.763763
    trees = T(chain("a", 2, 1.0), chain("b", 3, 0.0), chain("c", 1, -0.5))
    s = math.sqrt(7 / 12)
    close(
        by_leaf(grpo(trees, C)),
        {"a.0.0": [5 / 6 / s] * 2, "b.0.0.0": [-1 / 6 / s] * 3, "c.0": [-2 / 3 / s]},
    )
    # each step of a chain is in one trajectory
    assert trees[1].find("b.0").advantage == approx(-1 / 6 / s, abs=1e-5)


def test_grpo_gives_zero_to_equal_rewards_and_leaves_out_discarded_trajectories():
    close(
        by_leaf(grpo(T(chain("a", 2, 1.0), chain("b", 1, 1.0)), C)), {"a.0.0": [0, 0], "b.0": [0]}
    )
    close(by_leaf(grpo(T(chain("a", 2, 1.0)), C)), {"a.0.0": [0, 0]})
    # a discarded trajectory (retrieval failure) is neither trained nor part of the group: [1, 0] ->
    # +-0.7071
    trees = T(chain("a", 1, 1.0), chain("b", 1, 0.0), chain("c", 1, 0.0, flags=["env_error"]))
    close(by_leaf(grpo(trees, C)), {"a.0": [1 / math.sqrt(2)], "b.0": [-1 / math.sqrt(2)]})


def test_grpo_rejects_trees():
    with pytest.raises(ValueError, match="grpo expects chains.*branches at \\['r'\\]"):
        grpo(T(n("r", leaf("r.0", 1.0), leaf("r.1", 0.0))), C)


# ---- Tree-GRPO -----------------------------------------------------------------------------------


def two_trees():
    """Tree A: a.0 -> {a.0.0 r=1, a.0.1 -> a.0.1.0 r=0}, a.1 r=1.
    Tree B: b.0 -> {b.0.0 r=0, b.0.1 r=0}."""
    A = n("a", n("a.0", leaf("a.0.0", 1.0), n("a.0.1", leaf("a.0.1.0", 0.0))), leaf("a.1", 1.0))
    B = n("b", n("b.0", leaf("b.0.0", 0.0), leaf("b.0.1", 0.0)))
    return T(A, B)


def test_tree_grpo_intra_and_inter_advantages_on_two_hand_trees():
    # intra A over [1,0,1]: mean 2/3, var = (1/9+4/9+1/9)/2 = 1/3, std 0.57735 -> +0.57735,
    # -1.15470, +0.57735
    # intra B over [0,0]: 0, 0
    # inter over [1,0,1,0,0]: mean 0.4, var = (3*0.16 + 2*0.36)/4 = 0.3, std 0.547723 -> +1.09545 /
    # -0.73030
    ia, ib = 1 / 3 / math.sqrt(1 / 3), 0.6 / math.sqrt(0.3)
    ja, jb = -2 / 3 / math.sqrt(1 / 3), -0.4 / math.sqrt(0.3)
    trees = two_trees()
    close(
        by_leaf(tree_grpo(trees, C)),
        {
            "a.0.0": [ia + ib] * 2,
            "a.0.1.0": [ja + jb] * 3,
            "a.1": [ia + ib],
            "b.0.0": [jb] * 2,
            "b.0.1": [jb] * 2,
        },
    )
    # a.0 is trained twice with different advantages, so it has no single node advantage; a leaf
    # step has one
    assert trees[0].find("a.0").advantage is None
    assert trees[0].find("a.1").advantage == approx(ia + ib, abs=1e-5)
    # Table 4 ablation
    close(
        by_leaf(tree_grpo(two_trees(), CreditConfig(tree_mode="intra"))),
        {"a.0.0": [ia] * 2, "a.0.1.0": [ja] * 3, "a.1": [ia], "b.0.0": [0] * 2, "b.0.1": [0] * 2},
    )
    close(
        by_leaf(tree_grpo(two_trees(), CreditConfig(tree_mode="inter"))),
        {"a.0.0": [ib] * 2, "a.0.1.0": [jb] * 3, "a.1": [ib], "b.0.0": [jb] * 2, "b.0.1": [jb] * 2},
    )


def test_tree_grpo_inter_on_chains_equals_grpo():
    rng = random.Random(0)
    for _ in range(20):
        specs = [
            (rng.randint(1, 4), rng.choice([0.0, 1.0, -0.5, 0.3])) for _ in range(rng.randint(1, 6))
        ]
        forest = [chain(f"c{i}", depth, r) for i, (depth, r) in enumerate(specs)]
        assert by_leaf(tree_grpo(T(*forest), CreditConfig(tree_mode="inter"))) == by_leaf(
            grpo(T(*forest), C)
        )


# ---- BranPO --------------------------------------------------------------------------------------


def branpo_trees():
    """Three original trajectories of one prompt, one tree each.

    n=1: x.0 (prefix_end) -> {x.0.0 r=1 (original suffix), x.0.1 r=0 (contrastive branch)}
    n=2: y.0 -> y.0.0 (prefix_end) -> {y.0.0.0 -> y.0.0.0.0 r=1 (original; y.0.0.0 redundant),
         y.0.0.1 r=1}
    n=3: z.0 -> z.0.0 r=-0.5 (format penalty; an unmarked chain: never truncated, all prefix)
    """
    x = n("x", n("x.0", leaf("x.0.0", 1.0), leaf("x.0.1", 0.0), prefix_end=True))
    y = n(
        "y",
        n(
            "y.0",
            n(
                "y.0.0",
                n("y.0.0.0", leaf("y.0.0.0.0", 1.0), redundant=True),
                leaf("y.0.0.1", 1.0),
                prefix_end=True,
            ),
        ),
    )
    z = chain("z", 2, -0.5)
    return T(x, y, z)


def test_branpo_base_and_branch_advantages():
    # Eq. 10: r_base = (1+0)/2 = 0.5, (1+1)/2 = 1, -0.5 (z is its own single continuation)
    # Eq. 11 over [0.5, 1, -0.5]: mean 1/3; dev 1/6, 2/3, -5/6; var = (1/36+16/36+25/36)/2 = 42/72 =
    # 7/12
    sb = math.sqrt(7 / 12)
    bx, by, bz = (1 / 6) / sb, (2 / 3) / sb, (-5 / 6) / sb
    # Eq. 12 over all continuations [1, 0, 1, 1, -0.5]: mean 2.5/5 = 0.5; dev .5,-.5,.5,.5,-1
    # var = (4*0.25 + 1)/4 = 0.5
    sc = math.sqrt(0.5)
    c1, c0 = 0.5 / sc, -0.5 / sc
    trees = branpo_trees()
    close(
        by_leaf(branpo(trees, C)),
        {
            "x.0.0": [bx, c1],  # prefix x.0 trained once (here) with A_base; suffix with A_branch
            "x.0.1": [None, c0],  # same prefix, not trained again
            "y.0.0.0.0": [by, by, None, c1],  # y.0.0.0 is redundant: masked (Eq. 14)
            "y.0.0.1": [None, None, c1],
            "z.0.0": [bz, bz],  # unmarked chain: its whole trajectory is the prefix
        },
    )
    # r_base on the prefix end
    assert trees[0].find("x.0").value == 0.5 and trees[1].find("y.0.0").value == 1.0
    # Algorithm 1's variant: branches normalized within each C_n: x: [1,0] -> +-0.7071; y: [1,1] ->
    # 0; z: [-0.5] -> 0
    h = 1 / math.sqrt(2)
    close(
        by_leaf(branpo(branpo_trees(), CreditConfig(branpo_norm="prefix"))),
        {
            "x.0.0": [bx, h],
            "x.0.1": [None, -h],
            "y.0.0.0.0": [by, by, None, 0],
            "y.0.0.1": [None, None, 0],
            "z.0.0": [bz, bz],
        },
    )


def test_branpo_one_tree_per_prompt_equals_separate_trees_and_an_empty_prefix_resamples_all():
    # one tree for the prompt: each root child starts an original trajectory; same numbers as three
    # trees
    x, y, z = (t.to_dict() for t in branpo_trees())
    one = T(n("q", *(x["children"] + y["children"] + z["children"])))
    assert by_leaf(branpo(one, C)) == by_leaf(branpo(branpo_trees(), C))
    # k = 0: a root marked prefix_end -> the whole trajectory was resampled; its prefix is empty.
    # w: C = {w.0.0 r=1, w.1 r=0}, r_base = 0.5;  v: unbranched chain, r_base = 1
    # base group [0.5, 1] -> -0.7071 (w, empty prefix: unused), +0.7071 (v's two steps)
    # branch group [1, 0, 1]: mean 2/3, std 0.57735 -> +0.57735, -1.1547, +0.57735 (v has no suffix
    # steps)
    w = n("w", n("w.0", leaf("w.0.0", 1.0)), leaf("w.1", 0.0), prefix_end=True)
    close(
        by_leaf(branpo(T(w, chain("v", 2, 1.0)), C)),
        {"w.0.0": [1 / S3, 1 / S3], "w.1": [-2 / S3], "v.0.0": [1 / math.sqrt(2)] * 2},
    )


def test_branpo_unbranched_original_keeps_its_split_algorithm_1():
    # a: a.0 (prefix_end) -> {a.0.0 r=1, a.0.1 r=0};  b: its branching kept nothing, so it stays
    # split at the last truncation point tried (Algorithm 1: B = τ≤k, C = {(τ>k, R)}):
    # b.0 (prefix_end) -> b.0.0 r=1, its only continuation
    # Eq. 10: r_base = (1+0)/2 = 0.5, 1.  Eq. 11 over [0.5, 1]: mean 0.75, dev -+0.25,
    # var = 2 * 0.0625 / 1 = 0.125, std 0.353553 -> -0.7071 (a.0), +0.7071 (b.0)
    # Eq. 12 over the three branches [1, 0, 1]: mean 2/3, dev 1/3, -2/3, 1/3,
    # var = (1/9 + 4/9 + 1/9)/2 = 1/3, std 0.57735 -> +0.5774, -1.1547, +0.5774
    # so b's last step gets A_branch = 0.5774
    h = 1 / math.sqrt(2)
    a = n("a", n("a.0", leaf("a.0.0", 1.0), leaf("a.0.1", 0.0), prefix_end=True))
    b = n("b", n("b.0", leaf("b.0.0", 1.0), prefix_end=True))
    branches = {"a.0.0": [-h, 1 / S3], "a.0.1": [None, -2 / S3]}
    close(by_leaf(branpo(T(a, b), C)), branches | {"b.0.0": [h, 1 / S3]})
    assert 1 / S3 == approx(0.5774, abs=1e-4)
    # b unmarked (hand-built): never truncated, k = T: both its steps are prefix, A_base = +0.7071
    # (what the rollout used to produce); its reward still counts in Eq. 12's group: a's unchanged
    del b["children"][0]["prefix_end"]
    close(by_leaf(branpo(T(a, b), C)), branches | {"b.0.0": [h, h]})


def test_branpo_empty_prefix_stats_official_code():
    # a: empty prefix (root marked, k = 0), C = {a.0 r=1, a.1 r=0}; b: b.0 -> {1, 0}; c: c.0 -> {1}
    # Eq. 10: r_base = 0.5, 0.5, 1
    # Eq. 11 over [0.5, 0.5, 1]: mean 2/3, dev -1/6, -1/6, 1/3, var = (1/36 + 1/36 + 4/36)/2 = 1/12,
    # std 0.288675 -> A_base(b) = -1/6 / 0.288675 = -0.5774, A_base(c) = +1.1547 (a: no steps)
    # official code (skip_empty_base): over [0.5, 1] (b, c) only: -0.7071, +0.7071
    # Eq. 12 either way over [1, 0, 1, 0, 1]: mean 0.6, dev 0.4 / -0.6,
    # var = (3 * 0.16 + 2 * 0.36)/4 = 0.3, std 0.547723 -> +0.7303 / -1.0954
    def trees():
        return T(
            n("a", leaf("a.0", 1.0), leaf("a.1", 0.0), prefix_end=True),
            n("b", n("b.0", leaf("b.0.0", 1.0), leaf("b.0.1", 0.0), prefix_end=True)),
            n("c", n("c.0", leaf("c.0.0", 1.0), prefix_end=True)),
        )

    h, p, m = 1 / math.sqrt(2), 0.4 / math.sqrt(0.3), -0.6 / math.sqrt(0.3)
    branch = {"a.0": [p], "a.1": [m], "b.0.1": [None, m]}
    close(by_leaf(branpo(trees(), C)), branch | {"b.0.0": [-1 / S3, p], "c.0.0": [2 / S3, p]})
    official = branch | {"b.0.0": [-h, p], "c.0.0": [h, p]}
    close(by_leaf(branpo(trees(), CreditConfig(branpo_skip_empty_base=True))), official)
    close(by_leaf(registry_credit("branpo", trees(), branpo_skip_empty_base=True)), official)


def test_branpo_preference_mask_official_code():
    # x: x.0 (prefix_end) -> {x.0.0 r=1 (the original), x.0.1 r=0.6 (its contrastive branch:
    # F1 < 0.8, the losing side)}; y, z, w: originals of reward 0, each split at its first step
    # Eq. 11 over r_base [0.8, 0, 0, 0]: mean 0.2, dev 0.6, -0.2 x3,
    # var = (0.36 + 3 * 0.04)/3 = 0.16, std 0.4 -> +1.5, -0.5
    # Eq. 12 over [1, 0.6, 0, 0, 0]: mean 0.32, dev 0.68, 0.28, -0.32 x3,
    # var = (0.4624 + 0.0784 + 3 * 0.1024)/4 = 0.212, std 0.460435 -> +1.47686, +0.60812, -0.69500
    # the losing branch: +0.608 by Eq. 14 (no redundant step here); official: min(0.608, 0) = 0
    def trees():
        return T(
            n("x", n("x.0", leaf("x.0.0", 1.0), leaf("x.0.1", 0.6), prefix_end=True)),
            *(n(i, n(f"{i}.0", leaf(f"{i}.0.0", 0.0), prefix_end=True)) for i in "yzw"),
        )

    s = math.sqrt(0.212)
    others = {f"{i}.0.0": [-0.5, -0.32 / s] for i in "yzw"}
    close(
        by_leaf(branpo(trees(), C)), others | {"x.0.0": [1.5, 0.68 / s], "x.0.1": [None, 0.28 / s]}
    )
    assert 0.28 / s == approx(0.608, abs=1e-3)
    official = others | {"x.0.0": [1.5, 0.68 / s], "x.0.1": [None, 0.0]}
    close(by_leaf(branpo(trees(), CreditConfig(branpo_clip_losers=True))), official)
    close(by_leaf(registry_credit("branpo", trees(), branpo_clip_losers=True)), official)
    # a redundancy pair (branpo_trees' y): the original, through the redundant step y.0.0.0, loses:
    # its suffix takes min(A_branch, 0) = min(0.7071, 0) = 0 on both steps, the redundant one
    # trained (0), not masked (Eq. 14). The contrastive pair x: x.0.1 (r=0 < 1) loses,
    # min(-0.7071, 0) = -0.7071 unchanged. Numbers as in test_branpo_base_and_branch_advantages.
    sb, sc = math.sqrt(7 / 12), math.sqrt(0.5)
    bx, by, bz = (1 / 6) / sb, (2 / 3) / sb, (-5 / 6) / sb
    got = by_leaf(branpo(branpo_trees(), CreditConfig(branpo_clip_losers=True)))
    close(
        got,
        {
            "x.0.0": [bx, 0.5 / sc],
            "x.0.1": [None, -0.5 / sc],
            "y.0.0.0.0": [by, by, 0, 0],
            "y.0.0.1": [None, None, 0.5 / sc],
            "z.0.0": [bz, bz],
        },
    )


def test_branpo_reduces_to_grpo_theorem_b1():
    # one continuation per prefix: r_base = R, A_base = A_branch = GRPO's A, wherever the prefix
    # ends
    rng = random.Random(1)
    for _ in range(20):
        rewards = [rng.choice([0.0, 1.0, -0.5]) for _ in range(rng.randint(2, 6))]
        depths = [rng.randint(1, 4) for _ in rewards]
        chains = [chain(f"c{i}", d, r) for i, (d, r) in enumerate(zip(depths, rewards))]
        marked = json.loads(json.dumps(chains))
        for c, d in zip(marked, depths):  # mark a random step as the prefix end
            node = c
            for _ in range(rng.randint(1, d)):
                node = node["children"][0]
            node["prefix_end"] = True
        want = by_leaf(grpo(T(*chains), C))
        for trees, official in ((T(*chains), False), (T(*marked), False), (T(*marked), True)):
            # no prefix is empty, no continuation loses: the official code's switches change nothing
            got = by_leaf(
                branpo(
                    trees,
                    CreditConfig(branpo_skip_empty_base=official, branpo_clip_losers=official),
                )
            )
            assert got.keys() == want.keys()
            for k in want:
                assert got[k] == approx(want[k], abs=1e-9)


def test_branpo_prefix_trained_in_the_first_continuation_that_is_trained():
    # BranPO branches a wrong original (F1 = 0), e.g. one cut by the token budget:
    # x.0 (prefix_end) -> {x.0.0 r=0 truncated (original), x.0.1 r=1 (branch)};  y: unbranched chain
    # y.0 r=0
    # Eq. 10: r_base = 0.5, 0.  Eq. 11 over [0.5, 0]: mean 0.25, dev +-0.25,
    # var = 2 * 0.0625 / 1 = 0.125, std 0.353553 -> +-0.7071
    # Eq. 12 over [0, 1, 0]: mean 1/3, dev -1/3, 2/3, -1/3, var = (1/9 + 4/9 + 1/9) / 2 = 1/3 ->
    # -1/S3, 2/S3, -1/S3
    h, step = 1 / math.sqrt(2), {"tokens": [1], "logprobs": [-1.0]}
    x = n(
        "x",
        n(
            "x.0",
            leaf("x.0.0", 0.0, flags=["truncated"], **step),
            leaf("x.0.1", 1.0, **step),
            prefix_end=True,
            **step,
        ),
        tokens=[9],
    )
    trees = T(x, chain("y", 1, 0.0))
    got = branpo(trees, C)
    # A_base on x.0 goes to x.0.1: x.0.0 is dropped from the loss (it used to take A_base with it)
    close(by_leaf(got), {"x.0.0": [None, -1 / S3], "x.0.1": [h, 2 / S3], "y.0": [-h]})
    (row,) = (r for r in to_samples(got) if r.leaf_id.startswith("x"))
    assert row.leaf_id == "x.0.1" and row.advantages == [
        0.0,
        approx(h, abs=1e-5),
        approx(2 / S3, abs=1e-5),
    ]


def test_branpo_refuses_two_prefix_ends_and_a_branch_without_one():
    with pytest.raises(ValueError, match="marks 2 prefix ends"):
        branpo(
            T(n("r", n("r.0", n("r.0.0", leaf("r.0.0.0", 1.0), prefix_end=True), prefix_end=True))),
            C,
        )
    with pytest.raises(ValueError, match="branches into .* but marks no prefix_end"):
        branpo(T(n("r", n("r.0", leaf("r.0.0", 1.0), leaf("r.0.1", 0.0)))), C)


def test_branpo_refuses_an_original_that_branches_above_its_prefix_end(tmp_path):
    # r.0 -> {r.0.0 r=1, r.0.1 (prefix_end) -> {r.0.1.0 r=0, r.0.1.1 r=1}}: C = the leaves under
    # r.0.1 (Eq. 9); r.0.0 is no continuation of it. Before: r.0.0 was silently dropped, in no
    # statistic and never trained: Eq. 12 over [0, 1] gave -+0.7071, not over [1, 0, 1]
    # (+0.5774, -1.1547, +0.5774), and its trajectory was missing from the credit
    tree = n(
        "r",
        n(
            "r.0",
            leaf("r.0.0", 1.0),
            n("r.0.1", leaf("r.0.1.0", 0.0), leaf("r.0.1.1", 1.0), prefix_end=True),
        ),
    )
    message = (
        "original trajectory 'r.0' branches above its prefix_end 'r.0.1': ['r.0.0'] are not "
        "continuations of it; mark the node its continuations share"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        branpo(T(tree), C)
    f = tmp_path / "trees.json"  # the command line says it, naming the file
    f.write_text(json.dumps([tree]))
    out = credit_cli("--algo", "branpo", "--trees", str(f))
    assert out.returncode != 0 and out.stdout == "" and "Traceback" not in out.stderr
    assert f"--trees {f} (--algo branpo): {message}" in out.stderr


# ---- CARL ----------------------------------------------------------------------------------------


def carl_tree():
    """s0 -> a (single child of the root) -> {b -> {b0 r=1, b1 r=0}, c -> c0 r=1}
    (unbalanced: V != leaf mean)"""
    return T(
        n(
            "s",
            n(
                "s.0",
                n("s.0.0", leaf("s.0.0.0", 1.0), leaf("s.0.0.1", 0.0)),
                n("s.0.1", leaf("s.0.1.0", 1.0)),
            ),
        )
    )


def test_carl_values_are_child_means_and_only_forked_actions_are_trained():
    trees = carl_tree()
    got = by_leaf(carl(trees, C))
    t = trees[0]
    # Eq. 10: V(s.0.0) = (1+0)/2 = 0.5; V(s.0.1) = 1; V(s.0) = (0.5+1)/2 = 0.75 (leaf mean would be
    # 2/3); V(s) = 0.75
    assert [t.find(i).value for i in ("s", "s.0", "s.0.0", "s.0.1")] == [0.75, 0.75, 0.5, 1.0]
    # Eq. 11: A(s.0->s.0.0) = 0.5-0.75 = -0.25; A(->s.0.1) = +0.25; A(s.0.0->b0) = +0.5, (->b1) =
    # -0.5
    # Eq. 13: s->s.0 and s.0.1->s.0.1.0 have no siblings: not trained; each trained action appears
    # once
    close(
        got,
        {
            "s.0.0.0": [None, -0.25, 0.5],
            "s.0.0.1": [None, None, -0.5],
            "s.0.1.0": [None, 0.25, None],
        },
    )
    assert t.find("s.0").advantage is None and t.find("s.0.0").advantage == -0.25


def test_carl_update_all_inherits_edge_above():
    # Eq. 16: s->s.0 has no edge above (root): 0;  s.0.1->s.0.1.0 inherits A(s.0->s.0.1) = +0.25
    close(
        by_leaf(carl(carl_tree(), CreditConfig(carl_update_all=True))),
        {
            "s.0.0.0": [0.0, -0.25, 0.5],
            "s.0.0.1": [None, None, -0.5],
            "s.0.1.0": [None, 0.25, 0.25],
        },
    )


def test_carl_forked_action_trained_in_a_trajectory_that_is_trained():
    # r -> a -> {a1 r=0 truncated, a2 r=1};  r -> b r=0
    # V(a) = (0+1)/2 = 0.5, V(b) = 0, V(r) = (0.5+0)/2 = 0.25
    # A(a) = 0.5 - 0.25 = +0.25, A(b) = -0.25, A(a1) = 0 - 0.5 = -0.5, A(a2) = +0.5
    # a1 is the first trajectory through a, but it is truncated (not trained): a is trained in a2's
    # row
    step = {"tokens": [1], "logprobs": [-1.0]}
    trees = T(
        n(
            "r",
            n(
                "r.0",
                leaf("r.0.0", 0.0, flags=["truncated"], **step),
                leaf("r.0.1", 1.0, **step),
                **step,
            ),
            leaf("r.1", 0.0, **step),
            tokens=[9],
        )
    )
    got = carl(trees, C)
    close(by_leaf(got), {"r.0.0": [None, -0.5], "r.0.1": [0.25, 0.5], "r.1": [-0.25]})
    rows = {r.leaf_id: r.advantages for r in to_samples(got)}
    # (prompt, step, step): A(a) = +0.25 trained once
    assert rows == {"r.0.1": [0.0, 0.25, 0.5], "r.1": [0.0, -0.25]}


def test_carl_first_phase_chains_not_trained_app_c1():
    # r -> {s.0 -> {s.0.0 r=1, s.0.1 r=0}, s.1 r=0}; N0 = 1: the first phase sampled the chain s.0
    # -> s.0.0, then forks added s.0.1 (from s.0) and s.1 (from r)
    # V(s.0) = 0.5, V(s.1) = 0, V(r) = 0.25;
    # A(s.0) = +0.25, A(s.1) = -0.25, A(s.0.0) = +0.5, A(s.0.1) = -0.5
    def tree():  # rollout.carl marks the first phase's steps `phase1`
        r0 = n("r.0", leaf("r.0.0", 1.0, phase1=True), leaf("r.0.1", 0.0), phase1=True)
        return T(n("r", r0, leaf("r.1", 0.0)))

    # Eqs. 13/15 (default): every action with a sibling, phase 1's included: 4 actions (N + 1 = 3 <=
    # 4 <= 2N = 4)
    close(by_leaf(carl(tree(), C)), {"r.0.0": [0.25, 0.5], "r.0.1": [None, -0.5], "r.1": [-0.25]})
    # App. C.1: r.0 and r.0.0 came from the first phase: not trained
    close(
        by_leaf(carl(tree(), CreditConfig(carl_train_phase1=False))),
        {"r.0.0": [None, None], "r.0.1": [None, -0.5], "r.1": [-0.25]},
    )


def test_carl_full_binary_tree_value_is_leaf_mean_and_negative_rewards():
    rewards = [1.0, 0.0, -0.5, 1.0, 0.0, 0.0, 1.0, -0.5]

    def build(prefix, depth, i):
        if depth == 3:
            return leaf(prefix, rewards[i]), i + 1
        left, i = build(prefix + ".0", depth + 1, i)
        right, i = build(prefix + ".1", depth + 1, i)
        return n(prefix, left, right), i

    root, _ = build("r", 0, 0)
    trees = T(root)
    carl(trees, C)
    assert trees[0].root.value == approx(sum(rewards) / 8)  # 2.0/8 = 0.25
    # A(r.0.0 -> r.0.0.1) = 0 - (1+0)/2 = -0.5 ; A(r.0.1 -> r.0.1.0) = -0.5 - (-0.5+1)/2 = -0.75
    assert (
        trees[0].find("r.0.0.1").advantage == -0.5 and trees[0].find("r.0.1.0").advantage == -0.75
    )


def test_carl_update_set_bounds_eq15():
    # Progressive forking: one initial chain (N0=1), then N forks, each a new full path from some
    # existing state.
    # Every trained action has a sibling; Eq. 15 says N+1 <= |update set| <= 2N.
    rng = random.Random(0)
    for N in (1, 2, 5, 16):
        for _ in range(10):
            root = Node("r")
            node = root
            for _ in range(4):
                node = node.add_child()
            node.reward = 1.0
            for _ in range(N):
                start = rng.choice([x for x in walk(root) if x.children])  # a non-leaf state
                node = start.add_child()
                for _ in range(rng.randint(0, 3)):
                    node = node.add_child()
                node.reward = float(rng.random() < 0.5)
            trajectories = carl([Tree(root)], C)
            trained = sum(a is not None for t in trajectories for a in t.advantages)
            # CARL Eq. 15: N + 1 <= |update set| <= 2N after N forks
            assert N + 1 <= trained <= 2 * N


# ---- TreePS-RAG ----------------------------------------------------------------------------------


def treeps_tree():
    """r -> {u -> {u0 r=1, u1 -> u1.0 r=0 (deep), u2 r=1}, v r=-0.5}"""
    return T(
        n(
            "r",
            n("r.0", leaf("r.0.0", 1.0), n("r.0.1", leaf("r.0.1.0", 0.0)), leaf("r.0.2", 1.0)),
            leaf("r.1", -0.5),
        )
    )


def test_treeps_process_advantage_on_a_hand_tree():
    trees = treeps_tree()
    got = by_leaf(treeps(trees, C))
    # V(r) = (1+0+1-0.5)/4 = 0.375; V(u) = 2/3; V(u1) = 0; V(v) = -0.5; leaves V = r
    vr, vu = 0.375, 2 / 3
    # A(u)   = (2*2/3 - 0.375 - 0.375) / sqrt(3) = (1.33333 - 0.75)/1.73205 = 0.33679
    # A(v)   = (2*-0.5 - 0.375 - 0.375) / sqrt(1) = -1.75
    # A(u0)  = (2*1 - 0.375 - 2/3) / 1 = 0.95833 ; A(u2) same
    # A(u1)  = (0 - 0.375 - 2/3) / sqrt(1) = -1.04167 ; A(u1.0) = (0 - 0.375 - 0) / 1 = -0.375
    a_u = (2 * vu - 2 * vr) / S3
    a_u0 = 2 - vr - vu
    close(
        got,
        {
            "r.0.0": [a_u, a_u0],
            "r.0.1.0": [a_u, -vr - vu, -vr],
            "r.0.2": [a_u, a_u0],
            "r.1": [-1.75],
        },
    )
    assert trees[0].root.value == vr and trees[0].find("r.0").advantage == approx(0.33679, abs=1e-5)


def test_treeps_without_process_advantage_is_grpo_over_leaves():
    # [1, 0, 1, -0.5]: mean 0.375; dev .625,-.375,.625,-.875; var = (.390625*2+.140625+.765625)/3 =
    # 1.6875/3 = .5625
    s = 0.75
    close(
        by_leaf(treeps(treeps_tree(), CreditConfig(treeps_process=False))),
        {
            "r.0.0": [0.625 / s] * 2,
            "r.0.1.0": [-0.375 / s] * 3,
            "r.0.2": [0.625 / s] * 2,
            "r.1": [-0.875 / s],
        },
    )


def test_treeps_trains_only_the_sampled_paths():
    # §2.3: N paths are drawn for training (rollout.treeps marks their leaves `sampled`); here u0
    # and v.
    # V still averages over every leaf: V(r) = 0.375, V(u) = 2/3 -> the same A as
    # test_treeps_process_advantage_on_a_hand_tree
    trees = treeps_tree()
    for i in ("r.0.0", "r.1"):
        trees[0].find(i).sampled = True
    close(
        by_leaf(treeps(trees, C)),
        {"r.0.0": [(2 * 2 / 3 - 0.75) / S3, 2 - 0.375 - 2 / 3], "r.1": [-1.75]},
    )
    # Table 2 ablation: GRPO over the two sampled rewards [1, -0.5]: mean 0.25, dev +-0.75,
    # var = 2 * 0.5625 / 1 = 1.125, std 1.06066 -> +-0.70711
    h = 0.75 / math.sqrt(1.125)
    close(
        by_leaf(treeps(trees, CreditConfig(treeps_process=False))), {"r.0.0": [h, h], "r.1": [-h]}
    )


def test_treeps_gives_zero_to_equal_rewards_and_to_a_single_chain():
    close(
        by_leaf(treeps(T(n("r", leaf("r.0", 1.0), n("r.1", leaf("r.1.0", 1.0)))), C)),
        {"r.0": [0], "r.1.0": [0, 0]},
    )
    close(by_leaf(treeps(T(chain("r", 3, 1.0)), C)), {"r.0.0.0": [0, 0, 0]})


def test_methods_leave_reward_untouched_and_reset_previous_values():
    trees = treeps_tree()
    treeps(trees, C)
    grpo_like = tree_grpo(trees, CreditConfig(tree_mode="inter"))
    assert all(x.value is None for x in walk(trees[0].root))  # TreePS values cleared
    assert [x.reward for x in walk(trees[0].root) if not x.children] == [1.0, 0.0, 1.0, -0.5]
    assert len(grpo_like) == 4


# ---- analytic budgets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mnl,rollouts,budget",
    [
        ((1, 2, 1), 3, 2.0),
        ((2, 2, 1), 6, 4.0),
        ((4, 2, 1), 12, 8.0),
        ((8, 2, 1), 24, 16.0),
        # Tree-GRPO Table 3: budgets ~2, 4, 8, 16, 16, 16
        ((6, 3, 1), 24, 15.0),
        ((4, 5, 1), 24, 14.0),
    ],
)
def test_tree_grpo_budget_matches_table3(mnl, rollouts, budget):
    # rollouts M(LN+1); budget M(1 + LN/2), e.g. (6,3,1): 6*(1+1.5) = 15; (4,5,1): 4*(1+2.5) = 14
    assert tree_grpo_budget(*mnl) == (rollouts, budget)


# ---- credit per step: the numbers behind the drawn colours ---------------------------------------


def test_demo_credit_per_step_hand_computed():
    # The worked tree: q.0 (prefix_end) -> {q.0.0 r=1, q.0.1 (redundant) -> q.0.1.0 r=1, q.0.2 r=0};
    # q.1 (prefix_end) -> q.1.0 r=0. Credit of a step = the sum of the advantages of the rows that
    # train it.
    # GRPO over the 4 paths as chains, r = [1, 1, 0, 0]: mean 1/2, unbiased std sqrt(4 (1/4) / 3) =
    # 1/sqrt3, a = (1/2) sqrt3 = 0.866 each way; q.0 is in three chains, +a +a -a = +a
    a = S3 / 2
    # Tree-GRPO, one tree: intra = inter = +-a, each leaf 2a on its path; q.0 2a + 2a - 2a = 2a
    # BranPO: r_base(q.0) = mean(1, 1, 0) = 2/3, r_base(q.1) = 0 (Eq. 10); Eq. 11 over [2/3, 0]:
    # mean 1/3, std sqrt(2 (1/9)) = sqrt2/3, A_base = +-1/sqrt2 = 0.707 on each prefix, once;
    # A_branch over the 4 continuations
    # [1, 1, 0, 0] = +-a (Eq. 12); q.0.1 redundant: masked (Eq. 14)
    b = 1 / math.sqrt(2)
    # CARL: V(q.0) = mean(1, 1, 0) = 2/3, V(q.1) = 0, V(q) = 1/3; trained: actions from the forking
    # states q and q.0, once: q.0 2/3 - 1/3, q.1 0 - 1/3, q.0.0 1 - 2/3, q.0.1 1 - 2/3, q.0.2 0 -
    # 2/3; q.0.1.0, q.1.0 not
    # TreePS-RAG, every leaf trained, V(root) = 1/2: A(q.0) = (4/3 - 1/2 - 1/2) / sqrt3 = 1/(3
    # sqrt3), in three paths: 3 * that = 1/sqrt3; q.0.0 and q.0.1: (2 - 1/2 - 2/3) / 1 = 5/6;
    # q.0.1.0 (2 - 1/2 - 1) = 1/2; q.0.2 (0 - 1/2 - 2/3) = -7/6; q.1 (0 - 1/2 - 1/2) / 1 = -1; q.1.0
    # (0 - 1/2 - 0) = -1/2
    # GiGPO (on the 4 chains, gamma 0.95, omega 1): A^E = +-a as GRPO; returns gamma^(T-t) R:
    # first steps (all from the question) [0.95, 0.95^2, 0, 0] (chains q.0.0, q.0.1.0, q.0.2,
    # q.1.0); the 3 steps after q.0's observation [1, 0.95, 0]; q.0.1.0 and q.1.0 alone: A^S = 0
    g1 = [0.95, 0.95**2, 0.0, 0.0]
    m1, s1 = sum(g1) / 4, math.sqrt(sum((x - sum(g1) / 4) ** 2 for x in g1) / 3)
    z1 = [(x - m1) / s1 for x in g1]  # 0.90984, 0.82108, -0.86546, -0.86546
    s2 = math.sqrt(((1 - 0.65) ** 2 + (0.95 - 0.65) ** 2 + 0.65**2) / 2)  # mean 0.65
    z2 = [(1 - 0.65) / s2, (0.95 - 0.65) / s2, -0.65 / s2]  # 0.62115, 0.53241, -1.15355
    # q.0 in three chains: (a + z1[0]) + (a + z1[1]) + (-a + z1[2]) = a + 0.86546
    # AT2PO (leaves z-scored in the one tree: +-a; V = the child mean, no log-probs so equal
    # weights; A = V): V(q.0) = (a + a - a) / 3 = a/3 in three trajectories = a; every other step
    # its leaf's +-a. ARPO soft: GRPO over the four leaves, +-a broadcast: GRPO's numbers
    # VinePPO (scripts.credit.vineppo_chain: q.0 -> q.0.0 the chain, the rest its continuations):
    # V(q) = q.1.0's reward = 0, V(q.0) = mean(q.0.1.0, q.0.2) = (1 + 0) / 2 = 1/2;
    # A(q.0) = 1/2 - 0, A(q.0.0) = 1 - 1/2; the continuations are not trained
    # IGPO (on the 4 chains; P(gold) 0.3 at q, 0.8 after q.0, 0.85 after q.0.1, 0.1 after q.1):
    # gains [q.0 0.5 (x3 chains), q.0.1 0.05, q.1 -0.2], mean 0.27, population var 0.428 / 5 =
    # 0.0856: z = (g - 0.27) / (sqrt(0.0856 + 1e-8) + 1e-6); outcomes [1, 1, 0, 0]: +-0.5 / 0.5
    zg = lambda g: (g - 0.27) / (math.sqrt(0.0856 + 1e-8) + 1e-6)
    zo = 0.5 / (math.sqrt(0.25 + 1e-8) + 1e-6)
    # sums to go; q.0 in three chains: (zg(.5) + zo) + (zg(.5) + zg(.05) + zo) + (zg(.5) - zo)
    igpo_q0 = 3 * zg(0.5) + zg(0.05) + zo
    # MT-GRPO (biased): turn rewards 0.5 where the information holds "Ivo" (q.0), else 0; turn 1
    # over the 4 chains [0.5, 0.5, 0.5, 0]: mean 0.375, std 0.25; turn 2 (q.0.1, alone): 0;
    # outcomes: mean 0.5, std 1/sqrt3; each + 1e-4
    m1, mO = 0.125 / 0.2501, 0.5 / (1 / S3 + 1e-4)
    want = {
        "igpo": [igpo_q0, zo, zg(0.05) + zo, zo, -zo, zg(-0.2) - zo, -zo],
        "mtgrpo": [3 * m1 + mO, mO, mO, mO, -mO, -0.375 / 0.2501 - mO, -mO],
        "grpo": [a, a, a, a, -a, -a, -a],
        "gigpo": [a + sum(z1[:3]), a + z2[0], a + z2[1], a, -a + z2[2], -a + z1[3], -a],
        "at2po": [a, a, a, a, -a, -a, -a],
        "arpo": [a, a, a, a, -a, -a, -a],
        "tree_grpo": [2 * a, 2 * a, 2 * a, 2 * a, -2 * a, -2 * a, -2 * a],
        "branpo": [b, a, None, a, -a, -b, -a],
        "carl": [1 / 3, 1 / 3, 1 / 3, None, -2 / 3, -1 / 3, None],
        "treeps": [1 / S3, 5 / 6, 5 / 6, 1 / 2, -7 / 6, -1, -1 / 2],
        "vineppo": [1 / 2, 1 / 2, None, None, None, None, None],
    }
    tree, runs = demo(CREDITS, C)
    steps = ["q.0", "q.0.0", "q.0.1", "q.0.1.0", "q.0.2", "q.1", "q.1.0"]
    assert [n.id for n in walk(tree.root)][1:] == steps and list(runs) == list(CREDITS)
    for name, trajectories in runs.items():
        credit = step_credit(trajectories)
        assert [None if x is None else approx(x, abs=1e-5) for x in want[name]] == [
            credit.get(s) for s in steps
        ], name


# ---- CLI -----------------------------------------------------------------------------------------


def cli(*args):
    out = subprocess.run(
        [sys.executable, "advantages.py", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cli_prints_advantages_of_a_trees_file_the_budget_and_the_demo(tmp_path):
    f = tmp_path / "trees.json"
    f.write_text(json.dumps([t.to_dict() for t in carl_tree()]))
    out = json.loads(cli("--algo", "carl", "--trees", str(f)))
    assert out["algo"] == "carl"
    assert out["nodes"]["s.0"] == {"value": 0.75, "advantage": None}
    assert out["nodes"]["s.0.0"] == {"value": 0.5, "advantage": -0.25}
    assert out["trajectories"][0] == {
        "leaf": "s.0.0.0",
        "steps": ["s.0", "s.0.0", "s.0.0.0"],
        "advantages": [None, -0.25, 0.5],
    }
    assert json.loads(cli("--algo", "tree_grpo", "--budget", "2,2,1")) == {
        "rollouts": 6,
        "budget": 4.0,
    }
    demo = cli("--demo", "--plot", str(tmp_path / "demo.png"))
    assert all(name in demo for name in CREDITS) and "[prefix_end]" in demo
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_demo_shows_the_credit_flags_it_is_given():
    # before, --demo ran every method at its defaults whatever the credit flags said
    both, intra = cli("--demo"), cli("--demo", "--tree_mode", "intra")
    assert both != intra
    assert cli("--demo", "--treeps_process") == both  # the default, given: the same table


def test_cli_names_an_unknown_key_in_the_trees_file(tmp_path):
    f = tmp_path / "trees.json"
    f.write_text(json.dumps([{"id": "r", "children": [{"id": "r.0", "rewrd": 1}]}]))
    out = subprocess.run(
        [sys.executable, "advantages.py", "--algo", "grpo", "--trees", str(f)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "unknown keys ['rewrd']" in out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        # before: a bare "not enough values to unpack" traceback; M = 0 printed {"rollouts": 0,
        # "budget": 0.0}
        (
            ["--algo", "tree_grpo", "--budget", "2,2"],
            "--budget '2,2': must be three integers M,N,L",
        ),
        (
            ["--algo", "tree_grpo", "--budget", "0,2,1"],
            "--budget '0,2,1': M must be >= 1 and N, L >= 0",
        ),
        # --algo's choices are the registry's names (rollout.ALGOS), as train.py's
        (["--algo", "crl", "--trees", "x.json"], "invalid choice 'crl' for argument '--algo'"),
        # a flag that would change nothing is refused
        (["--demo", "--render"], "--render goes with --trees"),
        (["--demo", "--trees", "x.json"], "give one of --trees, --budget, --demo, not 2"),
        (
            ["--algo", "tree_grpo", "--trees", "x.json", "--tree_mode", "intr"],
            "invalid choice 'intr' for argument '--tree_mode'",
        ),
        (
            ["--algo", "branpo", "--trees", "x.json", "--branpo_norm", "tree"],
            "invalid choice 'tree' for argument '--branpo_norm'",
        ),
    ],
)
def test_cli_refuses_bad_flags_saying_what_is_allowed(args, message):
    out = subprocess.run(
        [sys.executable, "advantages.py", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode != 0 and message in out.stderr, out.stderr


def chain_json(depth: int) -> str:
    """A trees file holding one chain of `depth` steps, the last rewarded (written as text: a deep
    chain is deeper than json.dumps may recurse); each inner node with IGPO's gold log-prob."""
    node = f'{{"id": "r.{depth}", "reward": 1.0}}'
    for i in range(depth - 1, 0, -1):
        node = f'{{"id": "r.{i}", "gold_logp": -1.0, "children": [{node}]}}'
    return f'[{{"id": "r", "gold_logp": -1.0, "children": [{node}]}}]'


@pytest.mark.parametrize(
    "trees, message",
    [
        # before: the second tree's a.0 replaced the first's in "nodes"
        (
            [
                {"id": "a", "children": [{"id": "a.0", "reward": 1.0}, {"id": "a.1", "reward": 0}]},
                {"id": "b", "children": [{"id": "a.0", "reward": 0.5}, {"id": "b.1", "reward": 0}]},
            ],
            "node id 'a.0' is used twice (child 0 of node 'a', and child 0 of node 'b')",
        ),
        # before: dropped from the group, every other advantage shifted (2.25 -> 1.573)
        (
            [{"id": "a", "children": [{"id": "a.0", "reward": 1}, {"id": "a.1"}]}],
            "node 'a.1' is a leaf without 'reward'",
        ),
        # before: every advantage NaN, printed as invalid JSON
        (
            '[{"id": "a", "children": [{"id": "a.0", "reward": NaN}, {"id": "a.1", "reward": 0}]}]',
            "node 'a.0': 'reward' must be a finite number, got nan",
        ),
        # before: raw tracebacks
        (
            [{"id": "a", "children": [{"id": "a.0", "reward": "1"}]}],
            "node 'a.0': 'reward' must be a finite number, got '1'",
        ),
        (
            [{"id": "a", "children": {"id": "a.0", "reward": 1}}],
            "node 'a': 'children' must be a list of nodes, got a dict",
        ),
        (chain_json(150), "node 'r.101' is 101 steps deep; at most 100 are read"),
        (chain_json(600), "is nested too deeply for Python's JSON reader"),
        # before: nothing printed, exit 0
        ([], "0 tree(s) and no step (a root is the prompt): nothing to credit"),
        ([{"id": "a"}], "1 tree(s) and no step"),
        ("[{", "cannot be read as JSON (JSONDecodeError"),
        # before: a bare TypeError (unhashable type: 'list') in tree.py
        (
            [{"id": "a", "children": [{"id": "a.0", "reward": 1, "flags": [[1]]}]}],
            "node 'a.0': 'flags' must be a list of strings, got [[1]]",
        ),
        # before: tree_grpo and branpo gave every step 0 (the mean overflowed to inf), treeps
        # crashed; 1e150 squared still fits a float
        (
            [{"id": "a", "children": [{"id": "a.0", "reward": 1e308}, {"id": "a.1", "reward": 0}]}],
            "node 'a.0': 'reward' 1e+308 is beyond ±1e+150, where the group's mean and std",
        ),
        (
            [
                {
                    "id": "a",
                    "children": [{"id": "a.0", "reward": 1}, {"id": "a.1", "reward": -1e308}],
                }
            ],
            "node 'a.1': 'reward' -1e+308 is beyond ±1e+150",
        ),
        (
            [{"id": "a", "children": [{"id": "a.0", "reward": 10**200}]}],
            "node 'a.0': 'reward' an integer of 201 digits is beyond ±1e+150",
        ),
    ],
)
def test_trees_files_that_cannot_be_credited_are_refused_naming_node_and_field(
    tmp_path, trees, message
):
    f = tmp_path / "trees.json"
    f.write_text(trees if isinstance(trees, str) else json.dumps(trees))
    with pytest.raises(ValueError, match=re.escape(message)):
        load_trees(str(f), None, for_credit=True)


def test_the_cli_says_why_it_cannot_credit_a_file_without_a_traceback(tmp_path):
    f = tmp_path / "trees.json"
    f.write_text('[{"id": "a", "children": [{"id": "a.0", "reward": NaN}]}]')
    out = subprocess.run(
        [sys.executable, "advantages.py", "--algo", "grpo", "--trees", str(f)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and out.stdout == "" and "Traceback" not in out.stderr
    assert f"--trees: {f}: node 'a.0': 'reward' must be a finite number, got nan" in out.stderr


@pytest.mark.parametrize("algo", list(CREDITS))
def test_a_chain_of_the_longest_depth_read_is_credited(tmp_path, algo):
    # before: a chain of 500 steps raised RecursionError; 100 (the limit) is credited
    f = tmp_path / "trees.json"
    f.write_text(chain_json(100))
    trees = load_trees(str(f), None, for_credit=True)
    (trajectory,) = CREDITS[algo](trees, CreditConfig())
    assert len(trajectory.steps) == 100


def test_credit_config_refuses_an_unknown_choice_in_python_calls_too():
    # before: branpo_norm="x" silently meant Algorithm 1's per-prefix norm, tree_mode="all" a bare
    # KeyError at the first credit
    with pytest.raises(ValueError, match=r"branpo_norm='x' \(one of 'prompt', 'prefix'\)"):
        CreditConfig(branpo_norm="x")
    with pytest.raises(
        ValueError, match=r"tree_mode='all' \(one of 'both', 'intra', 'inter', 'treepo'\)"
    ):
        CreditConfig(tree_mode="all")
    assert CreditConfig(tree_mode="intra").tree_mode == "intra"


def test_rewards_at_the_largest_magnitude_read_give_finite_advantages(tmp_path):
    # the bound MAX_REWARD is one the group statistics bear: every method's advantages are finite
    rewards = {"a.0": 1e150, "a.1": -1e150, "a.2": 0}
    f, chains = tmp_path / "tree.json", tmp_path / "chains.json"  # one tree; as chains, for grpo
    f.write_text(
        json.dumps([{"id": "a", "children": [{"id": k, "reward": r} for k, r in rewards.items()]}])
    )
    chains.write_text(  # IGPO reads each root's gold log-prob
        json.dumps(
            [
                {"id": f"r{k}", "gold_logp": -1.0, "children": [{"id": k, "reward": r}]}
                for k, r in rewards.items()
            ]
        )
    )
    for algo, credit in CREDITS.items():
        on_chains = algo in ("grpo", "gigpo", "igpo", "mtgrpo")
        trees = load_trees(str(chains if on_chains else f), None, True)
        trees[0].find("a.0").sampled = algo == "vineppo"  # its chain; a.1, a.2: continuations
        trajectories = credit(trees, C)
        advantages = [a for tr in trajectories for a in tr.advantages if a is not None]
        assert advantages and all(map(math.isfinite, advantages)), algo
        assert any(a != 0 for a in advantages), algo


def credit_cli(*args):
    return subprocess.run(
        [sys.executable, "advantages.py", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_the_cli_names_the_file_and_tree_a_method_cannot_credit(tmp_path):
    # before: grpo on a branching tree raised a raw ValueError traceback
    f = tmp_path / "trees.json"
    f.write_text(json.dumps([t.to_dict() for t in carl_tree()]))
    out = credit_cli("--algo", "grpo", "--trees", str(f))
    assert out.returncode != 0 and out.stdout == "" and "Traceback" not in out.stderr
    assert f"--trees {f} (--algo grpo): grpo expects chains, but tree 's' branches" in out.stderr


def test_no_carl_train_phase1_on_trees_without_phase1_marks_is_refused(tmp_path):
    # before: a file without "phase1" marks (a dump older than them) gave the same numbers with
    # --no_carl_train_phase1 as without it, and said nothing
    f = tmp_path / "trees.json"
    f.write_text(json.dumps([t.to_dict() for t in carl_tree()]))
    out = credit_cli("--algo", "carl", "--trees", str(f), "--no_carl_train_phase1")
    assert out.returncode != 0 and out.stdout == "" and "Traceback" not in out.stderr
    assert f'--no_carl_train_phase1: no step of {f} is marked "phase1"' in out.stderr
    marked = carl_tree()  # the first chain marked, as rollout.carl marks its N0 chains
    for step in ("s.0", "s.0.0", "s.0.0.0"):
        marked[0].find(step).phase1 = True
    f.write_text(json.dumps([t.to_dict() for t in marked]))
    out = credit_cli("--algo", "carl", "--trees", str(f), "--no_carl_train_phase1")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["trajectories"][0]["advantages"] == [None, None, None]


def test_the_demo_refuses_a_plot_into_a_missing_directory_before_the_demo(tmp_path):
    # before: the demo ran and printed, then savefig raised FileNotFoundError
    png = tmp_path / "missing" / "demo.png"
    out = credit_cli("--demo", "--plot", str(png))
    assert out.returncode != 0 and out.stdout == "" and "Traceback" not in out.stderr
    assert f"--plot {str(png)!r}: the directory {png.parent} does not exist" in out.stderr
