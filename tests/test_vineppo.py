"""VinePPO (--algo vineppo): its credit on hand-built trees with the arithmetic written out, against
the official code's numbers (tests/fixtures/oracle_credit.json, written by
benchmarks/checks/oracle_credit.py), its rollout's shape with a scripted engine, and its flag.

The trained chains' leaves are marked `sampled`; every other child of a context is a Monte Carlo
continuation. V(s) is the mean reward of s's continuations whose reward counts; A = V(s_{t+1}) -
V(s_t), R - V(s_T) for the last step. No group normalisation, so the numbers are exact fractions.
"""

import json
import random
from pathlib import Path

import pytest
from pytest import approx
from test_rollout import EX, agent_with, queue_policy

from advantages import CreditConfig, vineppo
from rollout import ALGOS, AgentConfig, RolloutConfig
from tree import Tree, leaves, to_samples, walk

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "oracle_credit.json"
C = CreditConfig()


def n(id_, *children, **kw):
    return {"id": id_, "children": list(children), **kw}


def leaf(id_, r, **kw):
    return n(id_, reward=r, **kw)


def chain_end(id_, r, **kw):
    """The last step of a trained chain: its leaf, marked `sampled`."""
    return leaf(id_, r, sampled=True, **kw)


def lost(id_):
    """A continuation whose retrieval failed: discarded (env_error, no reward)."""
    return n(id_, flags=["env_error"])


def by_leaf(trajectories):
    return {t.leaf.id: t.advantages for t in trajectories}


def hand_tree():
    """q, the prompt, has five trained chains and four continuations:
      a -> a.0 r=1       a's continuations a.1 r=1, a.2 r=0 (truncated), a.3 -> lost, a.4 r=1
      b r=0              a chain of one step
      g -> g.0 r=0       cut by the token budget (truncated), no continuation grown
      h -> h.0 r=1       h's only continuations were lost: h.1, h.2 -> lost
      i lost             a chain lost to retrieval: discarded, and no continuation of q
    q's continuations: c -> c.0 r=1, d r=0, e r=0.5, f lost."""
    return Tree.from_dict(
        n(
            "q",
            n(
                "a",
                chain_end("a.0", 1.0),
                leaf("a.1", 1.0),
                leaf("a.2", 0.0, flags=["truncated"]),
                n("a.3", lost("a.3.0")),
                leaf("a.4", 1.0),
            ),
            chain_end("b", 0.0),
            n("g", chain_end("g.0", 0.0, flags=["truncated"])),
            n("h", chain_end("h.0", 1.0), lost("h.1"), n("h.2", lost("h.2.0"))),
            n("i", flags=["env_error"], sampled=True),
            n("c", leaf("c.0", 1.0)),
            leaf("d", 0.0),
            leaf("e", 0.5),
            lost("f"),
        )
    )


def test_vineppo_on_a_hand_tree_with_truncated_and_discarded_leaves():
    t = hand_tree()
    got = vineppo([t], C)
    # V(q) = mean(c.0, d, e) = (1 + 0 + 0.5) / 3 = 1/2: f is discarded, and the trained chains'
    # own rewards (a.0, b, g.0, h.0; i discarded) never enter it
    # V(a) = mean(a.1, a.2, a.4) = (1 + 0 + 1) / 3 = 2/3: a.2, truncated, counts with its 0; a.3.0
    # is discarded
    # V(h): every continuation discarded, no estimate (vineppo-no-estimate); V(g): none grown
    V = {x.id: x.value for x in walk(t.root) if x.value is not None}
    assert V == approx({"q": 1 / 2, "a": 2 / 3}, abs=1e-12)
    # a:   V(a) - V(q) = 2/3 - 1/2 = 1/6;   a.0: R - V(a) = 1 - 2/3 = 1/3
    # b:   one step, R - V(q) = 0 - 1/2 = -1/2
    # g:   V(g) undefined: g and g.0 untrained (the chain is truncated: never trained anyway)
    # h:   V(h) undefined: h (V(h) - V(q)) and h.0 (R - V(h)) untrained
    want = {
        "a.0": [1 / 6, 1 / 3],
        "b": [-1 / 2],
        "g.0": [None, None],
        "h.0": [None, None],
    }
    assert by_leaf(got) == {
        k: [None if a is None else approx(a, abs=1e-12) for a in v] for k, v in want.items()
    }
    # the continuations are in no trajectory; of the trajectories, a.0 and b are trained (g.0 is
    # truncated, h.0 has no step with an advantage)
    assert [s.leaf_id for s in to_samples(got)] == ["a.0", "b"]
    assert {x.id: x.advantage for x in walk(t.root) if x.advantage is not None} == approx(
        {"a": 1 / 6, "a.0": 1 / 3, "b": -1 / 2}, abs=1e-12
    )


def test_vineppo_ties_give_zero_and_the_advantages_add_up_to_r_minus_v_root():
    # q -> s -> s.0 -> s.0.0 r=1 (the chain); q's continuations [1, 0], s's [1, 0, 1, 0],
    # s.0's [1, 1]: V(q) = 1/2, V(s) = 2/4 = 1/2, V(s.0) = 1
    t = Tree.from_dict(
        n(
            "q",
            n(
                "s",
                n("s.0", chain_end("s.0.0", 1.0), leaf("s.0.1", 1.0), leaf("s.0.2", 1.0)),
                *(leaf(f"s.{k}", r) for k, r in ((1, 1.0), (2, 0.0), (3, 1.0), (4, 0.0))),
            ),
            leaf("x", 1.0),
            leaf("y", 0.0),
        )
    )
    # s: V(s) - V(q) = 1/2 - 1/2 = 0 exactly (a tie); s.0: 1 - 1/2 = 1/2; s.0.0: 1 - 1 = 0
    # sum: 0 + 1/2 + 0 = 1/2 = R - V(q) (γ = 1: the differences telescope)
    ((traj),) = vineppo([t], C)
    assert traj.advantages == [0.0, 0.5, 0.0]
    assert sum(traj.advantages) == traj.leaf.reward - t.root.value


def test_vineppo_on_a_tree_of_trained_paths_trains_a_shared_step_once():
    # q -> s -> {s.0 r=1, s.1 r=0} both trained (a credit-truth tree, not VinePPO's chains), s.2
    # r=1 and s.3 r=1 s's continuations, q's: x r=0: V(q) = 0, V(s) = (1 + 1) / 2 = 1 (s.0 and s.1
    # are trained paths, not continuations). s: 1 - 0 = 1, once, in s.0's trajectory
    # (first-untruncated); s.0: 1 - 1 = 0; s.1: 0 - 1 = -1
    t = Tree.from_dict(
        n(
            "q",
            n(
                "s",
                chain_end("s.0", 1.0),
                chain_end("s.1", 0.0),
                leaf("s.2", 1.0),
                leaf("s.3", 1.0),
            ),
            leaf("x", 0.0),
        )
    )
    assert by_leaf(vineppo([t], C)) == {"s.0": [1.0, 0.0], "s.1": [None, -1.0]}


def test_vineppo_on_an_unmarked_tree_has_no_continuation_and_trains_nothing():
    # no leaf marked: every leaf ends a trained path (tree.py's convention for `sampled`), so no
    # context has a continuation and no V is estimated
    t = Tree.from_dict(n("q", leaf("a", 1.0), n("b", leaf("b.0", 0.0))))
    assert by_leaf(vineppo([t], C)) == {"a": [None], "b.0": [None, None]}
    assert all(x.value is None for x in walk(t.root))


def test_the_cli_refuses_an_unmarked_tree_for_vineppo(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    f = tmp_path / "trees.json"
    f.write_text(json.dumps([n("q", leaf("a", 1.0), leaf("b", 0.0))]))
    run = lambda: subprocess.run(
        [sys.executable, "advantages.py", "--algo", "vineppo", "--trees", str(f)],
        cwd=root,
        capture_output=True,
        text=True,
    )
    out = run()
    assert out.returncode != 0 and out.stdout == "" and "Traceback" not in out.stderr
    assert f'--algo vineppo: no leaf of {f} is marked "sampled"' in out.stderr
    f.write_text(json.dumps([n("q", chain_end("a", 1.0), leaf("b", 0.0))]))
    out = run()  # a marked: b is q's one continuation, V(q) = 0, A(a) = 1 - 0
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["trajectories"] == [
        {"leaf": "a", "steps": ["a"], "advantages": [1.0]}
    ]


# ---- the official code's numbers -----------------------------------------------------------------


def test_vineppo_matches_the_official_code():
    """VinePPO's MathEpisodeGeneratorWithMCAdvantages: `_compute_mc_value` on each context's
    continuations and `_compute_step_advantages` on each scored chain, on 8 random prompts of 1-4
    chains with 1-4 continuations per context (benchmarks/checks/oracle_credit.py). Mapped: a
    truncated continuation scores 0 there (the unfinished-response penalty of its math runs) as
    here; a discarded one is left out of its rollouts. Not mapped: a context with no continuation
    left (the official code: V = 0; here: none, vineppo-no-estimate), which the cases avoid; a chain
    lost to retrieval (no trajectory in either). A truncated chain's advantages are compared too:
    the official code trains it, `to_samples` drops it."""
    cases = json.loads(FIXTURE.read_text())["vineppo"]
    assert len(cases) >= 8
    discarded = truncated = 0
    for case in cases:
        t = Tree.from_dict(case["tree"])
        ours = by_leaf(vineppo([t], C))
        assert {x.id: x.value for x in walk(t.root) if x.value is not None} == approx(
            case["values"], abs=1e-12
        )
        assert ours.keys() == case["advantages"].keys()
        for k, theirs in case["advantages"].items():
            assert ours[k] == approx(theirs, abs=1e-12), k
        discarded += sum("env_error" in x.flags for x in leaves(t.root))
        truncated += sum("truncated" in x.flags for x in leaves(t.root))
    assert discarded and truncated  # the cases hold both kinds of abnormal leaf


# ---- the rollout ---------------------------------------------------------------------------------


def test_vineppo_grows_k_continuations_from_each_context_of_a_trained_chain():
    # wave 1, the G = 3 chains: c0 searches "boom" (retrieval fails: discarded), c1 searches, c2
    # answers at length (cut by the token budget); wave 2: c1 answers Ivo (r = 1). Then K = 2
    # continuations from each context of c1, the one chain trained: the prompt and c1's search,
    # four in one wave: Ivo, Oda from the prompt; Oda, Ivo after the search
    script = ["<search>boom</search>", "<search>q</search>", "<answer>" + "z" * 150 + "</answer>"]
    script += ["<answer>Ivo</answer>"]
    script += ["<answer>Ivo</answer>", "<answer>Oda</answer>", "<answer>Oda</answer>"]
    script += ["<answer>Ivo</answer>"]
    agent, eng = agent_with(queue_policy(script), max_traj_tokens=140)
    [[t]] = ALGOS["vineppo"].grow(
        agent, [EX], random.Random(0), RolloutConfig(algo="vineppo", grpo_G=3, vineppo_K=2)
    )
    assert eng.calls == [3, 1, 4]
    assert {x.id: x.flags for x in t.leaves() if x.sampled} == {
        "p0.0": ["env_error"],
        "p0.1.0": [],
        "p0.2": ["truncated"],
    }
    assert {x.id: x.reward for x in t.leaves() if not x.sampled} == {
        "p0.3": 1.0,
        "p0.4": 0.0,
        "p0.1.1": 0.0,
        "p0.1.2": 1.0,
    }
    # V(p0) = (1 + 0) / 2, V(p0.1) = (0 + 1) / 2: A(p0.1) = 0, A(p0.1.0) = 1 - 1/2; the truncated
    # chain p0.2 is credited (0 - 1/2) but never trained
    got = ALGOS["vineppo"].credit([t], C)
    assert by_leaf(got) == {"p0.1.0": [0.0, 0.5], "p0.2": [-0.5]}
    assert [s.leaf_id for s in to_samples(got)] == ["p0.1.0"]


def test_vineppo_k_is_a_flag_of_at_least_one():
    from infra.warmstart import WarmConfig
    from retriever import RetrieverConfig
    from train import Args, validate

    configs = (Args, RolloutConfig, CreditConfig, AgentConfig, RetrieverConfig, WarmConfig)
    with pytest.raises(SystemExit, match="--vineppo_K 0: must be an integer >= 1"):
        validate(*[c(vineppo_K=0) if c is RolloutConfig else c() for c in configs])
    assert RolloutConfig().vineppo_K == 4  # ours; the paper's runs: 9
