"""advantages.py's credit beyond the five papers: GiGPO, AT2PO, ARPO and TreePO (tree_grpo's
tree_mode "treepo"), on hand-built trees with the arithmetic written out, their reductions, and
oracle checks against the official code's numbers (tests/fixtures/oracle_credit.json, written by
benchmarks/checks/oracle_credit.py).

Group convention: (r - mean) / (std + 1e-6), unbiased std; the 1e-6 changes results below 1e-5, so
expected values are written from the exact formula and compared with approx(abs=1e-5).
"""

import json
import math
import random
from pathlib import Path

import pytest
from pytest import approx

import advantages
from advantages import CreditConfig, arpo, at2po, gigpo, grpo, tree_grpo
from tree import Tree, scored_leaves, to_samples, walk

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "oracle_credit.json"
S3, H = math.sqrt(3), 1 / math.sqrt(2)
G = advantages.GIGPO_GAMMA  # 0.95


def n(id_, *children, **kw):
    return {"id": id_, "children": list(children), **kw}


def leaf(id_, r, **kw):
    return n(id_, reward=r, **kw)


def T(*roots):
    return [Tree.from_dict(r) for r in roots]


def by_leaf(trajectories):
    return {t.leaf.id: t.advantages for t in trajectories}


def close(got: dict, want: dict, tol=1e-5):
    assert got.keys() == want.keys()
    for k in want:
        assert [None if a is None else approx(a, abs=tol) for a in want[k]] == got[k], k


def z(values):
    """(v - mean) / std (unbiased), without the 1e-6: the hand formula of every group."""
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return [(v - m) / s for v in values]


# ---- GiGPO ---------------------------------------------------------------------------------------


def gigpo_chains():
    """a: a.0 (observes "x") -> a.0.0 r=1;  b: b.0 ("x") -> b.0.0 r=0;  c: c.0 ("y") -> c.0.0 r=1,
    then d: d.0 r=1 (answers at once). Every first step is taken from the question; a.0.0 and b.0.0
    from the state "x", c.0.0 from "y" (alone)."""
    return T(
        n("a", n("a.0", leaf("a.0.0", 1.0), obs_text="x")),
        n("b", n("b.0", leaf("b.0.0", 0.0), obs_text="x")),
        n("c", n("c.0", leaf("c.0.0", 1.0), obs_text="y")),
        n("d", leaf("d.0", 1.0)),
    )


def test_gigpo_episode_and_step_advantages_on_hand_chains():
    # Eq. 3 over R = [1, 0, 1, 1]: mean 3/4, dev 1/4, -3/4, 1/4, 1/4,
    # var = (3 * 1/16 + 9/16) / 3 = 1/4, std 1/2 -> A^E = +1/2, -3/2, +1/2, +1/2
    E = [0.5, -1.5, 0.5, 0.5]
    assert z([1, 0, 1, 1]) == approx(E)
    # Eq. 5, R_t = γ^(T - t) R: first steps a.0 0.95, b.0 0, c.0 0.95, d.0 1 (its only step)
    # Eq. 7 over the question's group [0.95, 0, 0.95, 1]: mean 2.9/4 = 0.725,
    # dev 0.225, -0.725, 0.225, 0.275, var = (2 * 0.050625 + 0.525625 + 0.075625) / 3 = 0.2341667,
    # std 0.4839077 -> A^S = +0.46497, -1.49822, +0.46497, +0.56829
    first = z([G, 0.0, G, 1.0])
    assert first == approx([0.46497, -1.49822, 0.46497, 0.56829], abs=1e-5)
    # state "x": a.0.0, b.0.0, R_t = [1, 0] -> +-0.70711; state "y": c.0.0 alone -> 0 (group-of-one)
    trees = gigpo_chains()
    close(
        by_leaf(gigpo(trees, CreditConfig())),
        {
            "a.0.0": [E[0] + first[0], E[0] + H],
            "b.0.0": [E[1] + first[1], E[1] - H],
            "c.0.0": [E[2] + first[2], E[2] + 0.0],
            "d.0": [E[3] + first[3]],
        },
    )
    assert trees[0].find("a.0").advantage == approx(E[0] + first[0], abs=1e-5)  # one chain each
    assert all(x.value is None for t in trees for x in walk(t.root))  # GiGPO defines no V(n)


def test_gigpo_episode_statistics_over_step_rows_official_code():
    # gigpo-episode-stats: a chain of T steps counted T times, rows [1, 1, 0, 0, 1, 1, 1]:
    # mean 5/7, dev 2/7 (x5), -5/7 (x2), var = (5 * 4/49 + 2 * 25/49) / 6 = 70/294 = 5/21,
    # std 0.48795 -> A^E = +0.58554 (a, c, d), -1.46385 (b); the step advantages as above
    E = z([1, 1, 0, 0, 1, 1, 1])
    assert (E[0], E[2]) == approx((0.58554, -1.46385), abs=1e-5)
    first = z([G, 0.0, G, 1.0])
    close(
        by_leaf(gigpo(gigpo_chains(), CreditConfig(gigpo_step_rows=True))),
        {
            "a.0.0": [E[0] + first[0], E[0] + H],
            "b.0.0": [E[2] + first[1], E[2] - H],
            "c.0.0": [E[0] + first[2], E[0]],
            "d.0": [E[0] + first[3]],
        },
    )


def test_gigpo_groups_of_one_discarded_and_truncated_chains_and_the_doc_set_state():
    # a: a.0 (docs {d1, d2}, text "x") -> a.0.0 r=1;  b: b.0 (docs {d2, d1}, text "y") -> b.0.0 r=0,
    # truncated;  c: c.0 ("x") -> c.0.0 env_error (discarded: in no group, not trained)
    def trees():
        return T(
            n("a", n("a.0", leaf("a.0.0", 1.0), obs_text="x", doc_ids=["d1", "d2"])),
            n(
                "b",
                n(
                    "b.0",
                    leaf("b.0.0", 0.0, flags=["truncated"]),
                    obs_text="y",
                    doc_ids=["d2", "d1"],
                ),
            ),
            n("c", n("c.0", n("c.0.0", flags=["env_error"]), obs_text="x")),
        )

    # Eq. 3 over the scored [1, 0] -> +-H; the question's group R_t = [0.95, 0] -> +-H
    # by text: a.0.0 alone in "x" (c.0.0 is discarded), b.0.0 alone in "y": A^S = 0
    got = gigpo(trees(), CreditConfig())
    close(by_leaf(got), {"a.0.0": [2 * H, H], "b.0.0": [-2 * H, -H]})
    # by doc set: a.0 and b.0 retrieved the same set {d1, d2}: one group, R_t = [1, 0] -> +-H
    close(
        by_leaf(gigpo(trees(), CreditConfig(gigpo_state="docs"))),
        {"a.0.0": [2 * H, 2 * H], "b.0.0": [-2 * H, -2 * H]},
    )
    # the truncated chain counts in the statistics but is not trained
    assert [s.leaf_id for s in to_samples(got)] == ["a.0.0"]
    # ties: equal rewards give 0 everywhere (equal R_t in every group too)
    ties = T(
        n("a", n("a.0", leaf("a.0.0", 1.0), obs_text="x")),
        n("b", n("b.0", leaf("b.0.0", 1.0), obs_text="x")),
    )
    close(by_leaf(gigpo(ties, CreditConfig())), {"a.0.0": [0, 0], "b.0.0": [0, 0]})


def random_chains(rng, unique_states=True):
    """One prompt's chains; every step observes a text of its own (or one of two, shared)."""
    forest = []
    for i in range(rng.randint(2, 6)):
        node = leaf(
            f"c{i}.{'.'.join('0' * (d := rng.randint(1, 4)))}", rng.choice([0.0, 1.0, 0.3, -0.5])
        )
        for k in range(d - 1, 0, -1):
            text = f"c{i}-{k}" if unique_states else rng.choice(["x", "y"])
            node = n(f"c{i}.{'.'.join('0' * k)}", node, obs_text=text)
        forest.append(n(f"c{i}", node))
    return forest


def test_gigpo_with_no_matching_state_and_omega_zero_is_grpo(monkeypatch):
    rng = random.Random(0)
    for _ in range(20):
        forest = random_chains(rng)
        want = by_leaf(grpo(T(*forest), CreditConfig()))
        got = by_leaf(gigpo(T(*forest), CreditConfig()))
        # no state after the question is matched: every later step has A^S = 0, so GRPO's A
        for k in want:
            assert got[k][1:] == approx(want[k][1:], abs=1e-12)
        # ω = 0 removes the question's group too: GRPO, whatever the states
        monkeypatch.setattr(advantages, "GIGPO_OMEGA", 0.0)
        for chains in (forest, random_chains(rng, unique_states=False)):
            assert by_leaf(gigpo(T(*chains), CreditConfig())) == by_leaf(
                grpo(T(*chains), CreditConfig())
            )
        monkeypatch.undo()


def test_gigpo_refuses_trees():
    with pytest.raises(ValueError, match=r"gigpo expects chains, but tree 'r' branches at \['r'\]"):
        gigpo(T(n("r", leaf("r.0", 1.0), leaf("r.1", 0.0))), CreditConfig())


# ---- AT2PO ---------------------------------------------------------------------------------------


def at2po_tree(**kw):
    """r -> u (H = 1) -> {u.0 r=1, u.1 r=1}, r -> v r=0 (H = 2); r -> x -> x.0 discarded. H: the
    step's mean token NLL, from its log-probs."""
    return T(
        n(
            "r",
            n(
                "u",
                leaf("u.0", 1.0, tokens=[7], logprobs=[-0.5]),
                leaf("u.1", 1.0, **kw),
                tokens=[7, 8],
                logprobs=[-1.0, -1.0],
            ),
            leaf("v", 0.0, tokens=[9], logprobs=[-2.0]),
            n("x", n("x.0", flags=["env_error"])),
        )
    )


def test_at2po_values_and_advantages_on_a_hand_tree():
    # leaves z-scored in the tree, x.0 discarded: [1, 1, 0]: mean 2/3, dev 1/3, 1/3, -2/3,
    # var = (1/9 + 1/9 + 4/9) / 2 = 1/3, std 1/sqrt3 -> V = s, s, -2s with s = 1/sqrt3 = 0.57735
    s = 1 / S3
    # V(u) = mean(s, s) = s, whatever the weights; x has no scored leaf: no value, not trained
    # "child": V(r) = (s - 2s) / 2 = -s/2; "leaf": V(r) = (s + s - 2s) / 3 = 0
    # "entropy": w = softmax(H(u) = 1, H(v) = 2) = (1, e) / (1 + e) = (0.26894, 0.73106),
    # V(r) = s (1 - 2e) / (1 + e) = 0.57735 * -1.19317 = -0.68888
    roots = {"child": -s / 2, "leaf": 0.0, "entropy": s * (1 - 2 * math.e) / (1 + math.e)}
    assert roots["entropy"] == approx(-0.68888, abs=1e-5)
    for value, vr in roots.items():
        for advantage in ("value", "parent", "root", "both"):
            trees = at2po_tree()
            got = by_leaf(at2po(trees, CreditConfig(at2po_value=value, at2po_advantage=advantage)))
            V = {i: trees[0].find(i).value for i in ("r", "u", "u.0", "u.1", "v")}
            assert V == approx({"r": vr, "u": s, "u.0": s, "u.1": s, "v": -2 * s}, abs=1e-5)
            assert trees[0].find("x").value is None and trees[0].find("x.0").value is None
            # A(n) = V(n) | V(n) - V(parent) | V(n) - V(root) | the two differences summed
            A = {
                "value": {"u": s, "u.0": s, "v": -2 * s},
                "parent": {"u": s - vr, "u.0": 0.0, "v": -2 * s - vr},
                "root": {"u": s - vr, "u.0": s - vr, "v": -2 * s - vr},
            }
            A["both"] = {k: A["parent"][k] + A["root"][k] for k in A["root"]}
            a = A[advantage]
            # every scored trajectory trains each of its steps with A(n): u in both of its
            close(got, {"u.0": [a["u"], a["u.0"]], "u.1": [a["u"], a["u.0"]], "v": [a["v"]]})
    # the defaults: the paper's run (entropy-weighted child mean, the value as the advantage)
    default = by_leaf(at2po(at2po_tree(), CreditConfig()))
    close(default, {"u.0": [s, s], "u.1": [s, s], "v": [-2 * s]})


def test_at2po_z_scores_each_tree_apart_truncated_leaves_count_ties_give_zero():
    s = 1 / S3
    # a second tree with one leaf: a group of one, z = 0 (group-of-one), all its credit 0; the
    # first tree's numbers are unchanged (not pooled with it)
    trees = at2po_tree(flags=["truncated"]) + T(n("b", n("b.0", leaf("b.0.0", 1.0))))
    got = at2po(trees, CreditConfig(at2po_value="child", at2po_advantage="both"))
    # "child", "both": u 2 (s + s/2) = 3s, u.0 (s - s) + (s + s/2) = 1.5 s, v 2 (-2s + s/2) = -3s
    close(
        by_leaf(got),
        {"u.0": [3 * s, 1.5 * s], "u.1": [3 * s, 1.5 * s], "v": [-3 * s], "b.0.0": [0, 0]},
    )
    # u.1 is truncated: in the statistics (same z), not trained
    assert [r.leaf_id for r in to_samples(got)] == ["u.0", "v", "b.0.0"]
    ties = T(n("r", leaf("r.0", 0.5), n("r.1", leaf("r.1.0", 0.5))))
    for value in ("entropy", "child", "leaf"):
        for advantage in ("value", "parent", "root", "both"):
            cfg = CreditConfig(at2po_value=value, at2po_advantage=advantage)
            close(by_leaf(at2po(ties, cfg)), {"r.0": [0], "r.1.0": [0, 0]})


# ---- ARPO ----------------------------------------------------------------------------------------


def arpo_tree(**kw):
    """q -> s -> {s.0 r=1, s.1 r=0, s.2 r=0, s.3 discarded}, q -> t r=1."""
    return T(
        n(
            "q",
            n(
                "s",
                leaf("s.0", 1.0, **kw),
                leaf("s.1", 0.0),
                leaf("s.2", 0.0),
                n("s.3", flags=["env_error"]),
            ),
            leaf("t", 1.0),
        )
    )


def test_arpo_soft_is_tree_grpo_inter_and_hard_averages_a_shared_step():
    # Â over the scored leaves [1, 0, 0, 1]: mean 1/2, dev +-1/2, var = 4 (1/4) / 3 = 1/3,
    # std 1/sqrt3 -> Â = +-sqrt3/2 = +-0.86603 (s.3 discarded: in no statistic, not trained)
    h = S3 / 2
    soft = {"s.0": [h, h], "s.1": [-h, -h], "s.2": [-h, -h], "t": [h]}
    close(by_leaf(arpo(arpo_tree(), CreditConfig())), soft)
    assert by_leaf(arpo(arpo_tree(), CreditConfig())) == by_leaf(
        tree_grpo(arpo_tree(), CreditConfig(tree_mode="inter"))
    )
    # hard: s is shared by d = 3 scored leaves, Â(s) = (h - h - h) / 3 = -h/3 = -0.28868, trained
    # once (arpo-hard-once), in the first trajectory through it; unshared steps: their leaf's Â
    trees = arpo_tree()
    close(
        by_leaf(arpo(trees, CreditConfig(arpo_credit="hard"))),
        {"s.0": [-h / 3, h], "s.1": [None, -h], "s.2": [None, -h], "t": [h]},
    )
    assert trees[0].find("s").advantage == approx(-h / 3, abs=1e-5)
    # s.0 truncated: still in the statistics, s is trained in s.1 (first-untruncated)
    got = arpo(arpo_tree(flags=["truncated"]), CreditConfig(arpo_credit="hard"))
    close(by_leaf(got), {"s.0": [None, h], "s.1": [-h / 3, -h], "s.2": [None, -h], "t": [h]})
    assert {r.leaf_id for r in to_samples(got)} == {"s.1", "s.2", "t"}


def test_arpo_ties_a_single_leaf_and_chains():
    # ties: every Â is 0; one scored leaf: a group of one, 0 (group-of-one)
    ties = T(n("q", n("s", leaf("s.0", 1.0), leaf("s.1", 1.0))))
    for credit in ("soft", "hard"):
        close(
            by_leaf(arpo(ties, CreditConfig(arpo_credit=credit))),
            {"s.0": [0, 0], "s.1": [None, 0] if credit == "hard" else [0, 0]},
        )
        close(
            by_leaf(arpo(T(n("q", n("s", leaf("s.0", 1.0)))), CreditConfig(arpo_credit=credit))),
            {"s.0": [0, 0]},
        )
    # chains: nothing is shared, hard = soft = GRPO
    rng = random.Random(1)
    for _ in range(10):
        forest = random_chains(rng)
        want = by_leaf(grpo(T(*forest), CreditConfig()))
        for credit in ("soft", "hard"):
            assert by_leaf(arpo(T(*forest), CreditConfig(arpo_credit=credit))) == want


# ---- TreePO --------------------------------------------------------------------------------------


TREEPO = CreditConfig(tree_mode="treepo")


def test_treepo_averages_over_ancestor_subgroups_on_a_hand_tree():
    # q -> a -> {a.0 r=1, a.1 -> {a.1.0 r=0, a.1.1 r=1}}, q -> b r=0, q -> c -> c.0 r=0,
    # q -> d discarded. The prompt's subgroup: [1, 0, 1, 0, 0], mean 2/5
    trees = T(
        n(
            "q",
            n("a", leaf("a.0", 1.0), n("a.1", leaf("a.1.0", 0.0), leaf("a.1.1", 1.0))),
            leaf("b", 0.0),
            n("c", leaf("c.0", 0.0)),
            n("d", flags=["env_error"]),
        )
    )
    # a.0:   subgroups q, a (3 leaves, mean 2/3): ((1 - 2/5) + (1 - 2/3)) / 2 = 0.46667
    # a.1.0: q, a, a.1 (mean 1/2): ((0 - 2/5) + (0 - 2/3) + (0 - 1/2)) / 3 = -0.52222
    # a.1.1: ((1 - 2/5) + (1 - 2/3) + (1 - 1/2)) / 3 = 0.47778
    # b:     q only: -2/5;  c.0: c has one leaf, not a subgroup: -2/5
    a0, a10, a11 = (0.6 + 1 / 3) / 2, (-0.4 - 2 / 3 - 0.5) / 3, (0.6 + 1 / 3 + 0.5) / 3
    assert (a0, a10, a11) == approx((0.46667, -0.52222, 0.47778), abs=1e-5)
    close(
        by_leaf(tree_grpo(trees, TREEPO)),
        {"a.0": [a0] * 2, "a.1.0": [a10] * 3, "a.1.1": [a11] * 3, "b": [-0.4], "c.0": [-0.4] * 2},
    )


def test_treepo_forest_roots_count_with_two_leaves_and_a_group_of_one_is_zero():
    # two trees: X -> {x.0 r=1, x.1 r=0, x.2 discarded}, Y -> y.0 r=1. The prompt: [1, 0, 1], 2/3
    # x.0: subgroups the prompt and X's root (2 scored leaves, mean 1/2):
    # ((1 - 2/3) + (1 - 1/2)) / 2 = 5/12 = 0.41667; x.1: ((0 - 2/3) + (0 - 1/2)) / 2 = -7/12;
    # y.0: Y has one leaf, no subgroup: 1 - 2/3 = 1/3
    trees = T(
        n("X", leaf("x.0", 1.0), leaf("x.1", 0.0), leaf("x.2", 0.0, flags=["env_error"])),
        n("Y", leaf("y.0", 1.0)),
    )
    close(by_leaf(tree_grpo(trees, TREEPO)), {"x.0": [5 / 12], "x.1": [-7 / 12], "y.0": [1 / 3]})
    # one scored leaf: R - R = 0 (group-of-one; the official code: R); ties: 0
    close(by_leaf(tree_grpo(T(n("q", n("a", leaf("a.0", 1.0)))), TREEPO)), {"a.0": [0, 0]})
    close(
        by_leaf(tree_grpo(T(n("q", leaf("a", 0.5), leaf("b", 0.5))), TREEPO)), {"a": [0], "b": [0]}
    )


def test_treepo_without_a_scored_leaf_trains_nothing_as_the_other_credits():
    # before: a raw StatisticsError (fmean of an empty list). A prompt whose every leaf was lost to
    # retrieval errors, or whose trees hold no step: no subgroup, no trajectory, as GRPO's inter
    lost = n("q", n("a", flags=["env_error"]), n("b", n("b.0", flags=["env_error"])))
    for trees in (T(lost), T(n("X"), n("Y")), T(lost, n("Y"))):
        assert tree_grpo(trees, TREEPO) == [] == tree_grpo(trees, CreditConfig(tree_mode="inter"))
        assert all(x.advantage is None for t in trees for x in walk(t.root))
    # a tree with no leaf beside one with two: the prompt's subgroup is [1, 0], mean 1/2, and X's
    # root is a subgroup of the same two: x.0: ((1 - 1/2) + (1 - 1/2)) / 2 = 1/2; x.1: -1/2
    trees = T(n("X", leaf("x.0", 1.0), leaf("x.1", 0.0)), n("Y"))
    close(by_leaf(tree_grpo(trees, TREEPO)), {"x.0": [0.5], "x.1": [-0.5]})


def test_treepo_on_a_forest_of_chains_is_the_reward_minus_the_prompt_mean():
    # every chain's root and steps hold one leaf: only the prompt's subgroup counts, R_i - mean R
    rng = random.Random(2)
    for _ in range(20):
        trees = T(*random_chains(rng))
        rewards = [x.reward for t in trees for x in scored_leaves(t.root)]
        mean = sum(rewards) / len(rewards)
        for traj in tree_grpo(trees, TREEPO):
            assert traj.advantages == approx([traj.leaf.reward - mean] * traj.leaf.depth, abs=1e-12)


def test_the_new_choices_are_refused_when_misspelt():
    with pytest.raises(
        ValueError, match=r"at2po_value='mean' \(one of 'entropy', 'child', 'leaf'\)"
    ):
        CreditConfig(at2po_value="mean")
    with pytest.raises(ValueError, match=r"arpo_credit='firm' \(one of 'soft', 'hard'\)"):
        CreditConfig(arpo_credit="firm")


# ---- oracles: the official code's numbers --------------------------------------------------------


@pytest.fixture(scope="module")
def oracle():
    return json.loads(FIXTURE.read_text())


def test_the_oracle_fixture_names_its_sources(oracle):
    methods = {"gigpo", "at2po", "treepo", "vineppo", "igpo", "igpo_first", "mtgrpo"}
    assert set(oracle["sources"]) == methods
    for src in oracle["sources"].values():
        assert set(src) == {"repo", "path", "commit"} and len(src["commit"]) == 40
    assert all(len(oracle[k]) >= 8 for k in methods - {"igpo_first"})  # both IGPOs: "igpo"


def test_gigpo_matches_the_official_code(oracle):
    """verl-agent's compute_gigpo_outcome_advantage ("mean_std_norm", exact state matching) on
    batches of 1-3 prompts of 2-5 chains: as written (episode statistics over step rows,
    `gigpo_step_rows=True`) and with per-trajectory statistics (Eq. 3, the default), the anchor
    observation as text and as a doc-id set (`gigpo_state`). Not mapped: its similarity matching
    (gigpo-exact-state); a discarded chain, which its batch has no notion of (left out of the batch,
    as out of our statistics); a prompt with one scored chain, whose A^E the official code makes R
    (group-of-one). Its returns are float32 (differences ~4e-8)."""
    for case in oracle["gigpo"]:
        for prompt in case["prompts"]:  # Eq. 5: R_t = γ^(T - t) R, R itself at the last step
            for t in T(*prompt):
                for x in scored_leaves(t.root):
                    R = [G ** (x.depth - d) * x.reward for d in range(1, x.depth + 1)]
                    assert case["returns"][x.id] == approx(R, abs=1e-6)
        for key, theirs in case["advantages"].items():
            state, stats = key.split(",")
            cfg = CreditConfig(gigpo_state=state, gigpo_step_rows=stats == "rows")
            ours = {}
            for prompt in case["prompts"]:
                ours |= by_leaf(gigpo(T(*prompt), cfg))
            close(ours, theirs, tol=1e-6)


def test_at2po_matches_the_official_code(oracle):
    """AT2PO's ToolTreeNode.compute_value_from_children and generate_sequences' leaf_value_norm /
    node_value_mode / node_adv_mode statements on random trees (1-3 children a node, 2+ leaves),
    every pair of modes. Its z-score divides by the population std (at2po-unbiased-std): every value
    and advantage of a tree is linear in its leaves' z-scores, so ours is its times
    (σ_pop + 1e-6) / (σ + 1e-6). Not mapped: a discarded leaf (every leaf there has a value)."""
    for case in oracle["at2po"]:
        for key, theirs in case["credit"].items():
            value, advantage = key.split(",")
            (t,) = T(case["tree"])
            rewards = [x.reward for x in scored_leaves(t.root)]
            m = sum(rewards) / len(rewards)
            var = sum((r - m) ** 2 for r in rewards)
            k = (math.sqrt(var / len(rewards)) + 1e-6) / (
                math.sqrt(var / (len(rewards) - 1)) + 1e-6
            )
            got = at2po([t], CreditConfig(at2po_value=value, at2po_advantage=advantage))
            assert {x.id: x.value for x in walk(t.root) if x.parent} == approx(
                {i: V * k for i, (V, _) in theirs.items()}, abs=1e-9
            ), key
            for traj in got:
                assert traj.advantages == approx(
                    [theirs[s.id][1] * k for s in traj.steps], abs=1e-9
                )


def test_treepo_matches_the_official_code(oracle):
    """TreePO's compute_tree_reinforce_plus_plus_baseline_outcome_advantage (its script's "average")
    on batches of 1-3 prompts of 1-2 random trees, its batch whitening left out
    (treepo-unwhitened). A discarded leaf is left out of its batch; every prompt has 2+ scored
    leaves (the official code's root group of one gives R: group-of-one)."""
    for case in oracle["treepo"]:
        ours = {}
        for prompt in case["prompts"]:
            ours |= {t.leaf.id: t.advantages for t in tree_grpo(T(*prompt), TREEPO)}
        assert ours.keys() == case["advantages"].keys()
        for k, a in case["advantages"].items():
            assert ours[k] == approx([a] * len(ours[k]), abs=1e-9)
