"""turns.py, the turn-level credits: IGPO (information gain) and MT-GRPO (a verifiable turn reward,
its biased baseline per turn index and our unbiased one), on hand-built chains with the arithmetic
written out; the bias of the per-turn-index baseline on a hand tree where the policy stops or
searches again; IGPO's rollout (one teacher-forced pass, no gold token in any prompt it samples
from). The oracles against the official code: tests/test_beyond_credit.py."""

import json
import math
from pathlib import Path

import pytest
from pytest import approx
from test_rollout import EX, TOK, MemoryRetriever, ScriptedEngine, agent_with

from advantages import CreditConfig
from infra import protocol
from rollout import ALGOS, Agent, AgentConfig, RolloutConfig, chain, igpo
from tree import Tree, path, to_samples, walk
from turns import MTGRPO_EPS, mtgrpo, turn_reward
from turns import igpo as igpo_credit

C = CreditConfig()


def chain_of(tid: str, steps: list[dict], reward: float, golds=("Ivo",), root_p=None, **end):
    """One GRPO chain: a root (IGPO's P there: `root_p`), `steps` (each a dict of Node fields; a
    "p" key is IGPO's P after it), then the answer step ending with `reward` (`end`: its fields)."""
    d = {"id": tid, "children": []}
    if root_p is not None:
        d["gold_logp"] = math.log(root_p)
    node = d
    for s in [*steps, {"action": "answer", "reward": reward, **end}]:
        s = dict(s)
        p = s.pop("p", None)
        child = {"id": f"{node['id']}.0", "children": [], **s}
        if p is not None:
            child["gold_logp"] = math.log(p)
        node["children"].append(child)
        node = child
    return Tree.from_dict(d | {"golden_answers": list(golds)})


def by_leaf(trajectories):
    return {t.leaf.id: t.advantages for t in trajectories}


# ---- IGPO ----------------------------------------------------------------------------------------
# a: prompt P 0.2 -> search, P 0.6 -> answer r = 1       gains: a +0.4
# b: prompt P 0.2 -> search, P 0.1 -> search, P 0.3 -> answer r = 0      b -0.1, +0.2


def igpo_chains():
    return [
        chain_of("a", [{"action": "search", "p": 0.6}], 1.0, root_p=0.2),
        chain_of(
            "b", [{"action": "search", "p": 0.1}, {"action": "search", "p": 0.3}], 0.0, root_p=0.2
        ),
    ]


def igpo_z(x: float, xs: list[float]) -> float:
    """IGPO's z-score written out: the population std, sqrt(var + 1e-8), then + 1e-6."""
    mean = sum(xs) / len(xs)
    var = sum((v - mean) ** 2 for v in xs) / len(xs)
    return (x - mean) / (math.sqrt(var + 1e-8) + 1e-6)


def test_igpo_normalizes_gains_and_outcomes_apart_then_discounts():
    got = by_leaf(igpo_credit(igpo_chains(), C))
    # gains [0.4, -0.1, 0.2]: mean 1/6, population var (0.2333^2 + 0.2667^2 + 0.0333^2) / 3
    # = 0.0422, std 0.2055: z = +1.1355, -1.2978, +0.1622
    gains = [0.6 - 0.2, 0.1 - 0.2, 0.3 - 0.1]
    z = [igpo_z(g, gains) for g in gains]
    assert z == approx([1.1355, -1.2978, 0.1622], abs=1e-4)
    # outcomes [1, 0]: mean 0.5, std 0.5: +-0.999998
    zo = [igpo_z(r, [1.0, 0.0]) for r in (1.0, 0.0)]
    # gamma 1: A_t = sum of the z to go
    assert got["a.0.0"] == approx([z[0] + zo[0], zo[0]], abs=1e-12)
    assert got["b.0.0.0"] == approx([z[1] + z[2] + zo[1], z[2] + zo[1], zo[1]], abs=1e-12)
    assert got["a.0.0"] == approx([2.1355, 1.0], abs=1e-4)


def test_igpo_discount_first_as_its_first_released_code():
    got = by_leaf(igpo_credit(igpo_chains(), CreditConfig(igpo_order="discount")))
    # raw r: a [0.4, 1], b [-0.1, 0.2, 0]; returns to go: a [1.4, 1], b [0.1, 0.2, 0]
    # the group's A_1 = [1.4, 0.1]: mean 0.75, unbiased std 1.3 / sqrt 2 = 0.9192
    s = 1.3 / math.sqrt(2) + 1e-6
    assert got["a.0.0"] == approx([(1.4 - 0.75) / s, (1.0 - 0.75) / s], abs=1e-12)
    assert got["b.0.0.0"] == approx([(x - 0.75) / s for x in (0.1, 0.2, 0.0)], abs=1e-12)


def test_igpo_logprob_gain_is_the_difference_of_mean_log_probs():
    got = by_leaf(igpo_credit(igpo_chains(), CreditConfig(igpo_gain="logprob")))
    gains = [math.log(0.6 / 0.2), math.log(0.1 / 0.2), math.log(0.3 / 0.1)]  # ln 3, -ln 2, ln 3
    z = [igpo_z(g, gains) for g in gains]
    zo = igpo_z(1.0, [1.0, 0.0])
    assert got["a.0.0"] == approx([z[0] + zo, zo], abs=1e-12)
    assert got["b.0.0.0"][1] == approx(z[2] - zo, abs=1e-12)


def test_igpo_leaves_a_discarded_chain_out_and_keeps_a_truncated_one_in_its_statistics():
    lost = chain_of("c", [{"action": "search", "p": 0.9}], None, root_p=0.2, flags=["env_error"])
    cut = chain_of("d", [{"action": "search", "p": 0.2}], 0.0, root_p=0.2, flags=["truncated"])
    got = igpo_credit([*igpo_chains(), lost, cut], C)
    assert "c.0.0" not in by_leaf(got)  # discarded: in no statistic, never trained
    gains = [0.4, -0.1, 0.2, 0.0]  # d's gain 0.2 - 0.2 counts
    zo = igpo_z(1.0, [1.0, 0.0, 0.0])  # and its reward
    assert by_leaf(got)["a.0.0"] == approx([igpo_z(0.4, gains) + zo, zo], abs=1e-12)
    assert [s.leaf_id for s in to_samples(got)] == ["a.0.0", "b.0.0.0"]  # d: not in the loss


def test_igpo_refuses_a_tree_without_gold_log_probs_or_with_branches():
    bare = chain_of("a", [{"action": "search"}], 1.0)
    with pytest.raises(ValueError, match="node 'a' has no gold_logp.*--algo igpo"):
        igpo_credit([bare], C)
    forked = igpo_chains()[0]
    forked.root.add_child(action="answer", reward=0.0)
    with pytest.raises(ValueError, match="igpo expects chains"):
        igpo_credit([forked], C)


class ScoringEngine(ScriptedEngine):
    """The scripted engine, recording every prompt it samples from and scoring a teacher-forced
    continuation with a log-prob per token that grows with the context (one per 1000 tokens)."""

    def __init__(self, policy):
        super().__init__(policy)
        self.prompts, self.scored = [], []

    def generate(self, prompts, sampling):
        self.prompts += [list(p) for p in prompts]
        return super().generate(prompts, sampling)

    def score(self, prompts, continuations):
        self.scored.append((prompts, continuations))
        return [[-1.0 + len(p) / 1000] * len(c) for p, c in zip(prompts, continuations)]


def search_then_answer(ctx: str) -> str:
    return "<search>Ivo</search>" if "Doc 1(" not in ctx else "<answer>Ivo</answer>"


def test_igpo_rollout_scores_each_inner_node_once_and_samples_as_grpo():
    cfg = RolloutConfig(algo="igpo", grpo_G=2)
    engines = [ScoringEngine(search_then_answer) for _ in range(2)]
    agents = [Agent(e, MemoryRetriever(), TOK, AgentConfig(), seed=0) for e in engines]
    grown = igpo(agents[0], [EX], None, cfg)
    plain = chain(agents[1], [EX], None, cfg)
    # the same samples as GRPO's chains: the teacher-forced pass samples nothing
    assert engines[0].prompts == engines[1].prompts
    assert [[n.id for n in walk(t.root)] for t in grown[0]] == [
        [n.id for n in walk(t.root)] for t in plain[0]
    ]
    # one score call: the prompt and the search step of each chain, each followed by the forced
    # answer's head, the gold "Ivo" scored
    ((contexts, golds),) = engines[0].scored
    head, gold = protocol.forced_answer_ids(TOK, "think", "Ivo")
    assert len(contexts) == 4 and golds == [gold] * 4 and TOK.decode(gold) == "Ivo"
    inner = [n for t in grown[0] for n in walk(t.root) if n.children]
    for n, ctx in zip(inner, contexts):
        assert ctx[len(ctx) - len(head) :] == head
        assert n.gold_logp == approx(-1.0 + len(ctx) / 1000)
    assert all(n.gold_logp is None for t in grown[0] for n in walk(t.root) if not n.children)
    # no prompt sampled from holds the forced answer (and so none its gold after it)
    said = TOK.decode(head)
    assert not any(said in TOK.decode(p) for p in engines[0].prompts)
    # the registry trains the chains with IGPO's credit
    assert ALGOS["igpo"].credit is igpo_credit
    assert len(to_samples(igpo_credit(grown[0], C))) == 2


# ---- MT-GRPO -------------------------------------------------------------------------------------


def search(found: bool) -> dict:
    """A search step whose information holds the gold ("Ivo") or not."""
    return {"action": "search", "obs_text": "<information>Doc 1 ivo" if found else "nothing"}


def test_mtgrpo_turn_reward_is_its_search_rubric():
    t = chain_of("a", [search(True)], 1.0, golds=("Mount IVO", "Ivo"))
    step = path(t.leaves()[0])[0]
    assert turn_reward(step, ["Mount IVO", "Ivo"]) == 0.5  # "ivo", lower-cased, is in it
    assert turn_reward(step, ["Oda"]) == 0.0
    assert turn_reward(step, ["", " "]) == 0.0  # an empty gold finds nothing


def test_mtgrpo_two_turns_biased_is_the_official_form():
    # its official setting: every chain searches once, then answers. Turn rewards [0.5, 0, 0.5],
    # outcomes [1, 0, 0]; z with the unbiased std + 1e-4 (MTGRPO_EPS):
    # z_1: mean 1/3, std sqrt((1/36 + 1/9 + 1/36) / 2) = 0.2887; z_O: mean 1/3, std 0.5774
    chains = [
        chain_of("a", [search(True)], 1.0),
        chain_of("b", [search(False)], 0.0),
        chain_of("c", [search(True)], 0.0),
    ]
    got = by_leaf(mtgrpo(chains, C))
    s1, sO = math.sqrt(1 / 12) + MTGRPO_EPS, math.sqrt(1 / 3) + MTGRPO_EPS
    z1 = [(r - 1 / 3) / s1 for r in (0.5, 0.0, 0.5)]
    zO = [(r - 1 / 3) / sO for r in (1.0, 0.0, 0.0)]
    for leaf, a, o in zip(("a.0.0", "b.0.0", "c.0.0"), z1, zO):
        assert got[leaf] == approx([a + o, o], abs=1e-12)  # turn 1: z_O + z_1; turn 2: z_O


def stop_or_search_again():
    """The policy searches (nothing found), then stops (answers) or searches again, each with
    probability 1/2; the group holds each choice in that proportion, with its outcomes, so that its
    means are the expectations:
      a: search -> answer R = 1            (stop at turn 2)
      b: search -> answer R = 1            (stop)
      c: search -> search (gold found, r_2 = 0.5) -> answer R = 1      (search again)
      d: search -> search (nothing, r_2 = 0)      -> answer R = 0      (search again)
    True values at turn 2: Q(stop) = E[R | stop] = 1; Q(search again) = E[r_2 + R | search] =
    0.25 + 0.5 = 0.75; the true advantage of searching again over stopping: -0.25."""
    return [
        chain_of("a", [search(False)], 1.0),
        chain_of("b", [search(False)], 1.0),
        chain_of("c", [search(False), search(True)], 1.0),
        chain_of("d", [search(False), search(False)], 0.0),
    ]


def turn2_gap(trajectories) -> float:
    """Mean turn-2 credit of the chains that searched again minus that of those that stopped."""
    A = by_leaf(trajectories)
    again = [A[x][1] for x in ("c.0.0.0", "d.0.0.0")]
    stop = [A[x][1] for x in ("a.0.0", "b.0.0")]
    return sum(again) / 2 - sum(stop) / 2


def test_the_per_turn_index_baseline_hides_minus_e_r_intermediate_and_ours_does_not():
    truth, e_r2 = 0.75 - 1.0, 0.25  # Q(search again) - Q(stop); E[r_2 | search again]
    # biased: turn 2's credit is z_O(R) + (for c, d) z_2(r_2). z_2 is centred on the chains that
    # searched again, so its mean there is 0: the search branch keeps only its R's z-scores.
    # R = [1, 1, 1, 0]: mean 0.75, unbiased std sqrt((3 x 0.0625 + 0.5625) / 3) = 0.5, so
    # gap = (mean R | again - mean R | stop) / (0.5 + eps) = (0.5 - 1) / 0.5001 = -0.9998
    sO = 0.5 + MTGRPO_EPS
    biased = turn2_gap(mtgrpo(stop_or_search_again(), C))
    assert biased == approx((0.5 - 1.0) / sO, abs=1e-12)
    # the closed form: the estimate is the truth plus -E[r_intermediate], in the outcome's units
    assert biased * sO == approx(truth - e_r2, abs=1e-12)
    # unbiased: G_2 = r_2 + R = [1, 1, 1.5, 0] over the 4 chains that reached turn 2: mean 0.875,
    # unbiased std sqrt((2 x 0.125^2 + 0.625^2 + 0.875^2) / 3) = sqrt(0.3958) = 0.6292
    sG = math.sqrt((2 * 0.125**2 + 0.625**2 + 0.875**2) / 3) + MTGRPO_EPS
    unbiased = turn2_gap(mtgrpo(stop_or_search_again(), CreditConfig(mtgrpo_baseline="unbiased")))
    assert unbiased == approx(((1.5 + 0.0) / 2 - 1.0) / sG, abs=1e-12)
    assert unbiased * sG == approx(truth, abs=1e-12)  # no bias: the truth, scaled
    # turn 1 (every chain): a, b have no turn-2 term; c, d z_1 = 0 (r_1 = 0 for all)
    A = by_leaf(mtgrpo(stop_or_search_again(), C))
    assert A["a.0.0"][0] == approx((1 - 0.75) / sO, abs=1e-12)


def test_mtgrpo_one_step_chain_gets_the_outcome_alone_and_refuses_branches():
    got = by_leaf(mtgrpo([chain_of("a", [], 1.0), chain_of("b", [search(True)], 0.0)], C))
    sO = math.sqrt(0.5) + MTGRPO_EPS
    assert got["a.0"] == approx([0.5 / sO], abs=1e-12)
    assert got["b.0.0"] == approx([-0.5 / sO + 0.0, -0.5 / sO], abs=1e-12)  # z_1: a group of one
    forked = chain_of("c", [search(True)], 1.0)
    forked.root.add_child(action="answer", reward=0.0)
    with pytest.raises(ValueError, match="mtgrpo expects chains"):
        mtgrpo([forked], C)


def test_the_flags_name_the_turn_credits_and_refuse_a_wrong_choice():
    with pytest.raises(ValueError, match="mtgrpo_baseline"):
        CreditConfig(mtgrpo_baseline="fair")
    with pytest.raises(ValueError, match="igpo_order"):
        CreditConfig(igpo_order="both")
    agent, _ = agent_with(search_then_answer)
    assert ALGOS["mtgrpo"].grow is chain and isinstance(agent, Agent)


# ---- the official code ---------------------------------------------------------------------------

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "oracle_credit.json"


def test_igpo_matches_the_official_code_in_both_orders():
    """IGPO's maintained compute_grpo_outcome_advantage ("separate", gamma 1) and its first
    release's compute_grpo_discounted_advantage (IGPO #5) on 8 batches of 1-3 prompts of 2-5
    chains, truncated chains among them (in the statistics), discarded ones left out of the batch
    (as out of ours). Theirs runs in float32: relative differences ~5e-7."""
    oracle = json.loads(FIXTURE.read_text())
    for case in oracle["igpo"]:
        assert set(case["advantages"]) == {"normalize", "discount"}
        for order, theirs in case["advantages"].items():
            for prompt in case["prompts"]:
                trees = [Tree.from_dict(t) for t in prompt]
                for leaf, ours in by_leaf(
                    igpo_credit(trees, CreditConfig(igpo_order=order))
                ).items():
                    assert ours == approx(theirs.pop(leaf), rel=2e-6, abs=2e-6), (order, leaf)
            assert not theirs  # every row of theirs is one of our trajectories


def test_mtgrpo_biased_matches_the_official_code_on_its_two_turns():
    """MT-GRPO's _compute_normalized_advantages, _find_result_positions and _assign_advantages
    (coefficient 1) on 8 batches of 1-3 prompts of G = 2-5 two-turn chains, the turn reward ours
    (`turn_reward`, its search rubric). Theirs runs in float32."""
    oracle = json.loads(FIXTURE.read_text())
    for case in oracle["mtgrpo"]:
        theirs = dict(case["advantages"])
        for prompt in case["prompts"]:
            for leaf, ours in by_leaf(mtgrpo([Tree.from_dict(t) for t in prompt], C)).items():
                assert ours == approx(theirs.pop(leaf), rel=2e-6, abs=2e-6), leaf
        assert not theirs
