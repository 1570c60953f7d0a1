"""rollout.py's AT2PO and ARPO strategies: tree shapes worked out by hand with a scripted engine
(each step's text and log-prob per token, in the order the engine is asked) and scripted uniform
draws, and the two selection rules against the official code's, on the random inputs of
tests/fixtures/oracle_rollout.json (written by benchmarks/checks/oracle_rollout.py)."""

import json
import pathlib
import random

from test_rollout import EX, agent_with, queue_policy, turns

from rollout import (
    ARPO_BEAM,
    ARPO_BETA,
    ARPO_TAU,
    RolloutConfig,
    arpo,
    arpo_branch,
    at2po,
    at2po_fit,
    at2po_pick,
)
from tree import Node, Tree, walk

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "oracle_rollout.json"


def S(query: str, nll: float):
    """A search step whose every token has log-prob -nll (dyadic values: their means are exact)."""
    return f"<search>{query}</search>", -nll


A = ("<answer>Ivo</answer>", -0.25)


def shape(tree: Tree) -> dict[str, int]:
    """Node id -> number of children, for the nodes that have any."""
    return {n.id: len(n.children) for n in walk(tree.root) if n.children}


class Draws:
    """A scripted `rng`: random() returns the given values in order; one more draw fails."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


# ---- AT2PO ---------------------------------------------------------------------------------------


def test_at2po_resamples_the_best_scored_steps_every_prompt_in_one_batch():
    # two prompts alike, M = 2 chains each: c0 = s0 (H 0.75) -> t0 (H 0.6875) -> answer,
    # c1 = s1 (H 0.25) -> t1 (H 1.0) -> answer; a resampled step answers at once
    wave = lambda *steps: list(steps) * 2  # the engine sees prompt 0's entries, then prompt 1's
    script = wave(S("q1", 0.75), S("q1", 0.25)) + wave(S("q2", 0.6875), S("q2", 1.0)) + [A] * 12
    agent, eng = agent_with(queue_policy(script))
    cfg = RolloutConfig(tree_M=2, tree_N=2, tree_L=2)
    prompts = at2po(agent, [EX, EX], random.Random(0), cfg)
    # round 1, score H - 0.05 (siblings - 1): root 0 - 0.05 = -0.05, s0 0.75 - 0.05 = 0.70,
    # s1 0.25 - 0.05 = 0.20, t0 0.6875, t1 1.0: N = 2 picks t1 and s0, sampled again from s1 and
    # from the root. Round 2: the root has 3 children, s1 2: root -0.1, s0 0.75 - 0.1 = 0.65,
    # s1 0.15, t0 0.6875, t1 1.0 - 0.05 = 0.95: t1 and t0 (no longer s0), from s1 and s0
    for p, [t] in zip(("p0", "p1"), prompts):
        want = {p: 3, f"{p}.0": 2, f"{p}.1": 3, f"{p}.0.0": 1, f"{p}.1.0": 1}
        assert shape(t) == want  # root: s0, s1, + 1; s0: t0, + 1; s1: t1, + 2
        assert len(t.leaves()) == 2 + 2 * 2  # M + L N, nothing pruned or padded
    # init: 3 waves of 2 chains per prompt; each round: one wave of 2 per prompt
    assert eng.calls == [4, 4, 4, 4, 4]
    # a third round: t1 1.0 - 0.1 = 0.9, s0 0.65, t0 0.6875 - 0.05 = 0.6375: t1 and s0
    assert [x.id for x in at2po_pick(prompts[0][0], 2)] == ["p0.1.0", "p0.0"]


def test_at2po_ties_go_breadth_first_and_too_few_candidates_cycle():
    # c0 = s0 (0.25) -> t0 (0.25) -> u0 (0.75) -> answer; c1 = s1 (0.25) -> t1 (0.75) -> answer
    script = [S("q1", 0.25)] * 2 + [S("q2", 0.25), S("q2", 0.75), S("q3", 0.75), A, A]
    agent, _ = agent_with(queue_policy(script))
    [[t]] = at2po(agent, [EX], random.Random(0), RolloutConfig(tree_M=2, tree_N=1, tree_L=0))
    # scores: root -0.05; s0, s1 0.25 - 0.05 = 0.20; t0 0.25; t1, u0 0.75 (no siblings). t1 and
    # u0 tie: breadth first t1 (depth 2) comes before u0 (depth 3), though u0 comes first depth
    # first (root, s0, t0, u0, s1, t1); s0 before s1 likewise. 7 > 6 candidates: the 7th cycles
    ids = {"p0.1.0": "t1", "p0.0.0.0": "u0", "p0.0.0": "t0", "p0.0": "s0", "p0.1": "s1"}
    picked = [ids.get(x.id, x.id) for x in at2po_pick(t, 7)]
    assert picked == ["t1", "u0", "t0", "s0", "s1", "p0", "t1"]
    agent, _ = agent_with(queue_policy(script + [A]))
    [[t]] = at2po(agent, [EX], random.Random(0), RolloutConfig(tree_M=2, tree_N=1, tree_L=1))
    assert len(t.find("p0.1").children) == 2  # t1 sampled again from s1 (u0: from t0)
    assert len(t.find("p0.0.0").children) == 1


def test_at2po_with_no_step_to_resample_picks_the_root_every_time():
    # both chains answer at once: the root is the only non-leaf node, so N = 3 picks it thrice
    agent, eng = agent_with(lambda c: A)
    [[t]] = at2po(agent, [EX], random.Random(0), RolloutConfig(tree_M=2, tree_N=3, tree_L=1))
    assert shape(t) == {"p0": 5} and eng.calls == [2, 3]


def test_at2po_pads_with_copies_of_the_last_leaf_breadth_first():
    # one chain s0 (H 0.5) -> a0; s0 (0.5 - 0) beats the root (0 - 0): resampled from the root,
    # it answers at once (x). Leaves breadth first: x (depth 1), a0 (depth 2); K = 4: two copies of
    # a0, the last, as its siblings (depth first the last would be x)
    agent, eng = agent_with(queue_policy([S("q1", 0.5), A, A]))
    cfg = RolloutConfig(tree_M=1, tree_N=1, tree_L=1, at2po_leaves=4)
    [[t]] = at2po(agent, [EX], random.Random(0), cfg)
    assert shape(t) == {"p0": 2, "p0.0": 3} and eng.calls == [1, 1, 1]
    s0, x = t.root.children
    a0, *copies = s0.children
    assert [c.id for c in copies] == ["p0.0.1", "p0.0.2"]
    for c in copies:
        same = ("tokens", "logprobs", "reward", "answer", "f1", "flags")
        assert all(getattr(c, f) == getattr(a0, f) for f in same)
        assert c.tokens is not a0.tokens and c.flags is not a0.flags  # copies, not shared lists
    # the copies cost no generation
    assert t.stats["generated_tokens"] == len(s0.tokens) + len(a0.tokens) + len(x.tokens)


def test_at2po_prunes_to_k_leaves_with_the_steps_they_leave_empty():
    # c0 = s0 (0.5) -> a0; c1 answers at once; c2 = s2 (0.25) -> a2. Scores: root -0.1, s0 0.4,
    # s2 0.15: s0 is resampled from the root, answering at once (x). Leaves breadth first:
    # [c1, x, a0, a2]; K = 2 keeps random.Random(0).sample(range(4), 2) = [3, 1]: a2 and x
    assert random.Random(0).sample(range(4), 2) == [3, 1]
    agent, _ = agent_with(queue_policy([S("q1", 0.5), A, S("q1", 0.25), A, A, A]))
    cfg = RolloutConfig(tree_M=3, tree_N=1, tree_L=1, at2po_leaves=2)
    [[t]] = at2po(agent, [EX], random.Random(0), cfg)
    # c1 pruned; a0 pruned and s0 with it (no leaf left below it)
    assert [c.id for c in t.root.children] == ["p0.2", "p0.3"]
    assert [x.id for x in t.leaves()] == ["p0.2.0", "p0.3"]


def test_at2po_never_resamples_an_abnormal_end():
    # env_error: c0's search fails (a leaf, discarded); c1 = s1 (0.5) -> answer. Candidates: the
    # root (-0.05) and s1 (0.45), never the failed step: s1 is resampled from the root
    agent, _ = agent_with(queue_policy([S("boom", 4.0), S("q1", 0.5), A, A]))
    [[t]] = at2po(agent, [EX], random.Random(0), RolloutConfig(tree_M=2, tree_N=1, tree_L=1))
    assert shape(t) == {"p0": 3, "p0.1": 1} and t.find("p0.0").flags == ["env_error"]
    assert len(t.leaves()) == 3  # K = M + L N counts the discarded leaf, as the official code
    # truncated (at2po-truncated-leaf): the search whose observation overflows the budget is the
    # leaf, so however uncertain (H 4), the root is all there is to resample
    agent, eng = agent_with(lambda c: S(f"q{turns(c)}", 4.0), max_traj_tokens=40)
    [[t]] = at2po(agent, [EX], random.Random(0), RolloutConfig(tree_M=1, tree_N=1, tree_L=1))
    assert shape(t) == {"p0": 2} and eng.calls == [1, 1]
    assert all(x.flags == ["truncated"] for x in t.leaves())


# ---- ARPO ----------------------------------------------------------------------------------------


def three_steps(c):
    """search (H 0.5), search (H 1.5), answer (H 0.25), by the number of observations so far."""
    return [S("q1", 0.5), S("q2", 1.5), A][turns(c)]


def test_arpo_measures_the_entropy_change_from_the_first_step_of_each_chain_or_branch():
    agent, eng = agent_with(three_steps)
    rng = Draws(0.6, 0.65, 0.4, 0.65, 0.65)
    [[t]] = arpo(agent, [EX], rng, RolloutConfig(grpo_G=1, arpo_M=6))
    # wave 1: s1 (the chain's first step: dH 0): 0.6 - 0 > 0.5, no branch
    # wave 2: s2, dH = 1.5 - 0.5 = 1: 0.65 - 0.2 * 1 = 0.45 <= 0.5, a branch (2 of M = 6)
    # wave 3: both answer; no step open: a new chain (3)
    # wave 4: its s1 (dH 0): 0.4 <= 0.5, a branch (4)
    # wave 5: the chain's s2 (dH 1): 0.65 - 0.2 = 0.45, a branch (5); the branch's s2 is its own
    #   first step (dH 0): 0.65 > 0.5, none, though it is the same step with the same draw
    # wave 6: three answers; a new chain (6 = M): no more draws, it runs to its end (waves 7-9)
    assert rng.values == [] and eng.calls == [1, 1, 2, 1, 2, 3, 1, 1, 1]
    assert shape(t) == {
        "p0": 3,
        "p0.0": 1,
        "p0.0.0": 2,  # the first chain's branch after its second search
        "p0.1": 2,  # the second chain's branch after its first search
        "p0.1.0": 2,  # the chain's second search branched
        "p0.1.1": 1,  # the branch's did not
        "p0.2": 1,
        "p0.2.0": 1,
    }
    assert len(t.leaves()) == 6  # M


def test_arpo_batches_every_prompt_and_stops_branching_at_m():
    # two prompts, N = 2 chains each (search, answer; the same H), M = 3: one branch per prompt
    agent, eng = agent_with(lambda c: [S("q1", 0.5), A][turns(c)])
    rng = Draws(0.4, 0.9, 0.2)
    prompts = arpo(agent, [EX, EX], rng, RolloutConfig(grpo_G=2, arpo_M=3))
    # draws prompt by prompt: p0's first search branches (0.4): 3 = M, so p0's second draws
    # nothing; p1's first does not (0.9), its second does (0.2)
    assert rng.values == [] and eng.calls == [4, 6]
    assert [shape(t) for [t] in prompts] == [
        {"p0": 2, "p0.0": 2, "p0.1": 1},
        {"p1": 2, "p1.0": 1, "p1.1": 2},
    ]


def test_arpo_without_tool_steps_starts_one_chain_a_wave_up_to_m():
    # every chain answers at once: no step ever open, no draw; as the official code, a prompt with
    # no open step gets one new chain per wave until it has M
    agent, eng = agent_with(lambda c: A)
    [[t]] = arpo(agent, [EX], Draws(), RolloutConfig(grpo_G=2, arpo_M=4))
    assert eng.calls == [2, 1, 1] and shape(t) == {"p0": 4}
    agent, eng = agent_with(lambda c: A)
    [[t]] = arpo(agent, [EX], Draws(), RolloutConfig(grpo_G=8, arpo_M=4))  # N = min(8, M)
    assert eng.calls == [4] and shape(t) == {"p0": 4}


def test_arpo_abnormal_ends_close_their_chain_and_count_in_m():
    # c0's search fails (env_error), c1's observation overflows the budget (truncated): neither is
    # open, nothing is drawn; 2 < M = 3, so one new chain, which answers
    script = [S("boom", 0.5), S("q1", 0.5), A]
    agent, eng = agent_with(queue_policy(script), max_traj_tokens=40)
    [[t]] = arpo(agent, [EX], Draws(), RolloutConfig(grpo_G=2, arpo_M=3))
    assert eng.calls == [2, 1]
    assert [(x.flags, x.reward) for x in t.leaves()] == [
        (["env_error"], None),
        (["truncated"], 0.0),
        ([], 1.0),
    ]


def test_arpo_draws_once_per_step_whatever_the_beam(monkeypatch):
    # a step's branching is one decision, U - beta dH <= tau, then ARPO_BEAM - 1 branches while the
    # prompt has fewer than M; a beam of 3 must not draw a second U for the second branch
    import rollout

    monkeypatch.setattr(rollout, "ARPO_BEAM", 3)
    first = Node("f", logprobs=[-0.5])
    steps = [Node("s0", logprobs=[-0.5]), Node("s1", logprobs=[-0.5])]  # dH = 0 each
    heads = [(0, steps[0], first), (0, steps[1], first)]
    made, rng = [2], Draws(0.4, 0.9)  # s0: 0.4 <= 0.5, branches; s1: 0.9 > 0.5, does not
    new = arpo_branch(heads, made, [Node("root0")], 6, rng)
    assert rng.values == [] and [n.id for _, n, _ in new] == ["s0", "s0"] and made == [4]
    # M = 3 leaves room for one branch: the draw is made, one branch of the two is started
    made, rng = [2], Draws(0.4)
    new = arpo_branch(heads[:1], made, [Node("root0")], 3, rng)
    assert rng.values == [] and [n.id for _, n, _ in new] == ["s0"] and made == [3]


# ---- the official code's decisions (benchmarks/checks/oracle_rollout.py) ------------------------


def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def build(parents: list, entropies: list) -> Tree:
    """A tree from the fixture: node k has id str(k) and one token of log-prob -H (its exact H)."""
    nodes = [Node("0")]
    for k, (p, h) in enumerate(zip(parents[1:], entropies[1:]), start=1):
        nodes.append(Node(str(k), parent=nodes[p], logprobs=[-h], tokens=[k]))
        nodes[p].children.append(nodes[-1])
    return Tree(nodes[0])


def test_fixture_names_the_official_sources_and_settings():
    f = fixture()
    assert f["at2po_source"]["repo"] == "zzfoutofspace/ATPO"
    assert f["arpo_source"]["repo"] == "dongguanting/ARPO"
    assert all(len(f[k]["commit"]) == 40 for k in ("at2po_source", "arpo_source"))
    settings = f["arpo_settings"]
    assert (ARPO_BEAM, ARPO_BETA, ARPO_TAU) == (
        settings["beam_size"],
        settings["entropy_weight"],
        settings["branch_probability"],
    )


def test_at2po_pick_is_the_official_selection():
    cases = fixture()["at2po_pick"]
    for case in cases:
        picked = at2po_pick(build(case["parents"], case["entropies"]), case["n"])
        assert [int(x.id) for x in picked] == case["picked"], case
    # the cases hold ties and more picks than candidates
    assert sum(len(set(c["picked"])) < len(c["picked"]) for c in cases) > 20


def test_at2po_fit_is_the_official_leaf_count():
    for case in fixture()["at2po_fit"]:
        tree = build(case["parents"], case["entropies"])
        at2po_fit(tree, case["k"], random.Random(case["seed"]))
        got = [
            [x.id, x.parent and x.parent.id]
            for x in sorted(walk(tree.root), key=lambda x: x.depth)  # breadth first
        ]
        # a copy of leaf u is "<u>_dup<j>" there, "<parent>.<k>" here: same place, same tokens
        want = case["nodes"]
        assert [p for _, p in got] == [p for _, p in want], case
        for (mine, _), (theirs, _) in zip(got, want):
            original = theirs.split("_dup")[0]
            assert mine == theirs or tree.find(mine).tokens == tree.find(original).tokens


def test_arpo_branch_is_the_official_beaming():
    cases = fixture()["arpo_branch"]
    for case in cases:
        owner, made = case["owner"], list(case["made"])
        heads = [
            (owner[i], Node(str(i), logprobs=[-h]), Node(f"first{i}", logprobs=[-h0]))
            for i, h, h0 in zip(case["active"], case["h_now"], case["h_first"])
        ]
        roots = [Node(f"root{p}") for p in range(len(made))]
        new = arpo_branch(heads, made, roots, case["M"], random.Random(case["seed"]))
        assert [[i, node.id] for i, node, _ in new] == case["new"], case
        assert made == case["made_after"] and all(first is None for _, _, first in new)
    assert sum(len(c["new"]) for c in cases) > 100  # they branch, and start chains
    assert any(node.startswith("root") for c in cases for _, node in c["new"])
