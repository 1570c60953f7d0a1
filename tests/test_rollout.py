"""rollout.py: the agent step (parsing, TITO, abnormal outcomes, rewards) and every strategy's tree
shape, with a scripted engine and an in-memory retriever so that every count below can be checked by
hand."""

import random
from dataclasses import dataclass

import pytest

import advantages
from advantages import CreditConfig
from infra.engines import Completion
from infra.health import metrics
from infra.protocol import parse_action
from infra.search import Passage
from retriever import Refiner, RetrievalError
from rollout import (
    ALGOS,
    Agent,
    AgentConfig,
    RolloutConfig,
    jaccard_prune,
)
from tree import Node, context_ids, depth_rule, path, to_samples, walk

PIECES = [
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "<information>",
    "</information>",
    "Doc",
    "Title",
    "ab",
]


class ToyTokenizer:
    """Greedy longest-match over a few multi-character pieces and every single character. Its
    decode/encode round trip is not the identity: ids ['a', 'b'] decode to "ab", which encodes to
    the one piece 'ab'."""

    chat_template = None

    def __init__(self):
        self.vocab = PIECES + [chr(c) for c in range(32, 127)] + ["\n"]
        self.ids = {p: i for i, p in enumerate(self.vocab)}

    def encode(self, text, add_special_tokens=False):
        out, i = [], 0
        while i < len(text):
            piece = next(
                p for p in sorted(self.vocab, key=len, reverse=True) if text.startswith(p, i)
            )
            out.append(self.ids[piece])
            i += len(piece)
        return out

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.vocab[i] for i in ids)


TOK = ToyTokenizer()


class ScriptedEngine:
    """Answers each prompt with policy(context_text) -> text or (text, logprob per token) or (ids,
    logprobs). Records the batch size of every generate call."""

    def __init__(self, policy):
        self.policy, self.calls = policy, []

    def generate(self, prompts, sampling):
        self.calls.append(len(prompts))
        outs = []
        for ids in prompts:
            got = self.policy(TOK.decode(ids))
            text, lp = got if isinstance(got, tuple) else (got, -1.0)
            ids_out = text if isinstance(text, list) else TOK.encode(text)
            lps = lp if isinstance(lp, list) else [lp] * len(ids_out)
            outs.append(Completion(token_ids=ids_out, logprobs=lps, finish_reason="stop"))
        return outs


class MemoryRetriever:
    """Doc ids from the query's first two characters; queries containing "boom" fail (as a timeout
    would)."""

    def __init__(self):
        self.calls = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        partial = [
            None
            if "boom" in q
            else [
                Passage(
                    id=f"{q[:2]}{i}", contents=f"T{q[:2]}\ntext {i} about {q}", score=1.0 / (i + 1)
                )
                for i in range(k)
            ]
            for q in queries
        ]
        failed = [i for i, p in enumerate(partial) if p is None]
        if failed:
            raise RetrievalError(f"retrieval failed for {len(failed)} queries", failed, partial)
        return partial


@dataclass
class Ex:
    question: str
    golden_answers: list


EX = Ex("who is it", ["Ivo"])


def turns(ctx: str) -> int:
    """Observations so far on this path (each starts with 'Doc 1(')."""
    return ctx.count("Doc 1(")


def agent_with(policy, retriever=None, **cfg):
    eng = ScriptedEngine(policy)
    return Agent(eng, retriever or MemoryRetriever(), TOK, AgentConfig(**cfg), seed=0), eng


def one_trajectory(policy, retriever=None, **cfg):
    agent, _ = agent_with(policy, retriever, **cfg)
    tree = agent.new_tree(EX, "p")
    (leaf,) = agent.run([(tree, tree.root)])
    return agent, tree, leaf


# ---- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,want",
    [
        ("<think>x</think><search> who </search>", ("search", "who", None)),
        ("<think>x</think><answer>Ivo</answer>", ("answer", "Ivo", None)),
        # the first complete tag is the action
        ("<answer>A</answer><search>q</search>", ("answer", "A", None)),
        ("<think>x</think> no tag at all", ("invalid", None, "parse_error")),
        ("<search>unclosed", ("invalid", None, "parse_error")),
        ("<search>   </search>", ("invalid", None, "parse_error")),  # empty query
        ("<think>open <answer>x</answer>", ("invalid", None, "parse_error")),  # unclosed <think>
        ("<search>a</search><search>b</search>", ("invalid", None, "too_many_calls")),
    ],
)
def test_parse_action_takes_the_first_complete_tag_or_names_the_error(text, want):
    assert parse_action(text, "think", max_calls=1) == want


def test_parse_action_reads_a_renamed_think_tag():
    assert parse_action("<thinking>x</thinking><answer>y</answer>", "thinking", 1) == (
        "answer",
        "y",
        None,
    )
    assert parse_action("<thinking>x<answer>y</answer>", "thinking", 1)[2] == "parse_error"


# ---- one trajectory: observation, TITO, rewards, abnormal outcomes -------------------------------


def test_search_then_answer_observation_and_reward():
    agent, tree, leaf = one_trajectory(
        lambda c: "<search>who</search>" if turns(c) == 0 else "<answer>Ivo</answer>"
    )
    s = leaf.parent
    assert (s.action, s.query, s.doc_ids) == ("search", "who", ["wh0", "wh1", "wh2"])
    assert s.obs_text == (
        "\n\n<information>Doc 1(Title: Twh) text 0 about who\nDoc 2(Title: Twh) text 1 about who\n"
        "Doc 3(Title: Twh) text 2 about who</information>\n\n"
    )
    assert (leaf.action, leaf.answer, leaf.reward, leaf.flags) == ("answer", "Ivo", 1.0, [])
    assert tree.stats["tool_calls"] == 1 and tree.stats["generated_tokens"] == len(s.tokens) + len(
        leaf.tokens
    )


def test_observation_cut_to_max_obs_tokens_keeps_closing_tag():
    _, _, leaf = one_trajectory(
        lambda c: "<search>who</search>" if turns(c) == 0 else "<answer>Ivo</answer>",
        max_obs_tokens=12,
    )
    obs = leaf.parent.obs_tokens
    assert len(obs) == 12 and TOK.decode(obs).endswith("</information>\n\n")


def test_token_in_token_out_keeps_generated_ids():
    a, b = TOK.ids["a"], TOK.ids["b"]
    # 'a','b' as two ids, as a model may sample
    step1 = TOK.encode("<search>") + [a, b] + TOK.encode("</search>")
    assert TOK.encode(TOK.decode(step1)) != step1  # re-tokenizing would merge them into 'ab'
    agent, tree, leaf = one_trajectory(
        lambda c: (step1, -0.5) if turns(c) == 0 else "<answer>Ivo</answer>"
    )
    s = leaf.parent
    assert s.tokens == step1 and s.query == "ab"
    ctx = context_ids(leaf)
    assert ctx[: len(tree.root.tokens)] == tree.root.tokens
    assert ctx[len(tree.root.tokens) : len(tree.root.tokens) + len(step1)] == step1
    (sample,) = to_samples(advantages.grpo([tree], CreditConfig()))
    assert sample.input_ids == ctx  # training sees exactly the sampled ids
    assert sample.logprobs[len(tree.root.tokens) : len(tree.root.tokens) + len(step1)] == [
        -0.5
    ] * len(step1)


def test_reward_f1_em_and_format_penalty():
    answer = lambda text: (
        lambda c: "<search>q</search>" if turns(c) == 0 else f"<answer>{text}</answer>"
    )
    gold = Ex("q", ["Ivo Ra"])
    for cfg, text, want in [
        ({"reward": "f1"}, "Ivo", 2 / 3),
        ({"reward": "em"}, "Ivo", 0.0),
        ({"reward": "em"}, "ivo ra", 1.0),
    ]:
        agent, _ = agent_with(answer(text), **cfg)
        tree = agent.new_tree(gold, "p")
        (leaf,) = agent.run([(tree, tree.root)])
        # F1("Ivo", "Ivo Ra"): precision 1/1, recall 1/2 -> 2*1*0.5/1.5 = 2/3
        assert leaf.reward == pytest.approx(want)
    _, _, leaf = one_trajectory(lambda c: "<answer>Ivo</answer>", format_penalty=True)
    assert leaf.reward == -0.5  # correct, but answered without any search
    _, _, leaf = one_trajectory(lambda c: "<answer>Ivo</answer>")
    assert leaf.reward == 1.0
    _, _, leaf = one_trajectory(lambda c: "no tags", format_penalty=True)
    assert (leaf.flags, leaf.reward) == (["parse_error"], -0.5)


@pytest.mark.parametrize(
    "policy,cfg,flag,reward,depth",
    [
        (lambda c: "I think so", {}, "parse_error", 0.0, 1),
        (lambda c: "<search>a</search><search>b</search>", {}, "too_many_calls", 0.0, 1),
        (lambda c: "<search>same</search>", {}, "repeated_query", 0.0, 2),
        # 3 searches, then answer-only
        (lambda c: f"<search>q{turns(c)}</search>", {"max_turns": 3}, "max_turns", 0.0, 4),
        (lambda c: f"<search>q{turns(c)}</search>", {"max_traj_tokens": 40}, "truncated", 0.0, 1),
        (lambda c: "<search>boom</search>", {}, "env_error", None, 1),
    ],
)
def test_each_abnormal_outcome_is_flagged_counted_and_scored(policy, cfg, flag, reward, depth):
    agent, tree, leaf = one_trajectory(policy, **cfg)
    assert leaf.flags == [flag] and leaf.reward == reward and leaf.depth == depth
    assert agent.counters["abnormal/" + flag] == 1
    # a retrieval failure is discarded from group statistics
    assert leaf.scored == (flag != "env_error")


def test_truncated_counts_in_statistics_but_not_in_loss():
    agent, _ = agent_with(
        lambda c: f"<search>q{turns(c)}</search>" if "Ivo" in c else "<answer>Ivo</answer>",
        max_traj_tokens=40,
    )
    trees = [agent.new_tree(EX, "p.a"), agent.new_tree(Ex("Ivo?", ["Ivo"]), "p.b")]
    agent.run([(t, t.root) for t in trees])
    assert trees[1].leaves()[0].flags == ["truncated"]
    trajectories = advantages.grpo(trees, CreditConfig())
    assert [t.advantages[-1] for t in trajectories] == [
        pytest.approx(0.7071, abs=1e-4),
        pytest.approx(-0.7071, abs=1e-4),
    ]
    assert [s.leaf_id for s in to_samples(trajectories)] == ["p.a.0"]


def test_retrieval_failure_discards_only_its_own_trajectory():
    retriever = MemoryRetriever()
    agent, eng = agent_with(
        lambda c: (
            "<answer>Ivo</answer>"
            if turns(c)
            else "<search>boom</search>"
            if "boom" in c
            else "<search>who</search>"
        ),
        retriever,
    )
    trees = [
        agent.new_tree(EX, "p0"),
        agent.new_tree(Ex("boom", ["Ivo"]), "p1"),
        agent.new_tree(EX, "p2"),
    ]
    leaves = agent.run([(t, t.root) for t in trees])
    assert [(x.reward, x.flags) for x in leaves] == [(1.0, []), (None, ["env_error"]), (1.0, [])]
    assert retriever.calls == [["who", "boom", "who"]]  # one batched call for the wave
    assert agent.counters["rollout/retrieval_failed_queries"] == 1
    assert metrics([trees])["rollout/retrieval_failed_queries"] == 1  # logged per step by train.py
    # discarded: not in the group
    assert [t.leaf.id for t in advantages.grpo(trees, CreditConfig())] == ["p0.0.0", "p2.0.0"]


def test_retry_invalid_keeps_going():
    agent, tree, leaf = one_trajectory(
        lambda c: "oops" if "invalid" not in c else "<answer>Ivo</answer>", retry_invalid=True
    )
    bad = leaf.parent
    assert (
        bad.flags == ["parse_error"] and "Let me try again" in bad.obs_text and leaf.reward == 1.0
    )
    assert agent.counters["abnormal/parse_error"] == 1


def test_refiner_summary_replaces_passages():
    refine_engine = ScriptedEngine(lambda c: "Ivo founded it.")
    agent, _ = agent_with(
        lambda c: "<search>who</search>" if "<information>Ivo" not in c else "<answer>Ivo</answer>"
    )
    agent.refiner = Refiner(refine_engine, TOK, 128)
    tree = agent.new_tree(EX, "p")
    (leaf,) = agent.run([(tree, tree.root)])
    assert leaf.parent.obs_text == "\n\n<information>Ivo founded it.</information>\n\n"
    assert refine_engine.calls == [1] and leaf.reward == 1.0


# ---- strategies: hand-checkable shapes -----------------------------------------------------------


def search_then_answer(c):
    return "<search>q</search>" if turns(c) == 0 else "<answer>Ivo</answer>"


def test_chain_one_engine_call_per_wave():
    agent, eng = agent_with(search_then_answer)
    prompts = ALGOS["grpo"].grow(agent, [EX, EX], random.Random(0), RolloutConfig(grpo_G=3))
    assert [len(trees) for trees in prompts] == [3, 3]
    assert all(
        len(t.leaves()) == 1 and t.leaves()[0].depth == 2 for trees in prompts for t in trees
    )
    assert eng.calls == [6, 6]  # 2 waves (search, answer), all 6 trajectories in each
    assert metrics(prompts)["tree/leaves_per_prompt"] == 3
    assert metrics(prompts)["rollout/tool_calls_per_prompt"] == 3


def test_tree_grpo_221_gives_two_trees_of_three_leaves():
    agent, eng = agent_with(search_then_answer)
    [trees] = ALGOS["tree_grpo"].grow(
        agent, [EX], random.Random(0), RolloutConfig(tree_M=2, tree_N=2, tree_L=1)
    )
    # each chain has 2 expandable nodes (root, the search step); N = 2 picks both
    assert [len(t.leaves()) for t in trees] == [3, 3]  # M (L N + 1) = 2 * 3 = 6 leaves
    # one expansion from the root, one from the search step
    assert all(len(t.root.children) == 2 for t in trees)
    # init: 2 waves; expansion: 4 continuations, 2 of which need a 2nd step
    assert eng.calls == [2, 2, 4, 2]


def test_tree_grpo_expansion_nodes_with_replacement():
    # one chain (M = 1): expandable nodes [root, search step]; N = 2 draws from random.Random(0):
    # with replacement (official code): the search step twice
    assert random.Random(0).choices([0, 1], k=2) == [1, 1]
    agent, eng = agent_with(search_then_answer)
    [[t]] = ALGOS["tree_grpo"].grow(
        agent,
        [EX],
        random.Random(0),
        RolloutConfig(tree_M=1, tree_N=2, tree_L=1, tree_replace=True),
    )
    # its answer + 2 new answers
    assert len(t.root.children) == 1 and len(t.root.children[0].children) == 3
    assert eng.calls == [1, 1, 2]  # init: 2 waves; expansion: 2 answers in one wave
    # (without replacement both nodes are drawn once each:
    # test_tree_grpo_221_gives_two_trees_of_three_leaves)


def queue_policy(script, default="<answer>Oda</answer>"):
    it = iter(script)
    return lambda c: next(it, default)


def test_branpo_keeps_first_contrastive_branch():
    S, A, W = "<search>q</search>", "<answer>Ivo</answer>", "<answer>Oda</answer>"
    # initial: 2 chains (search, answer): correct + wrong -> acc 0.5; Recur = 2, Bran = 2 for both
    # first truncation point k = 1 (resample the answer): A's branches [A, W] -> keeps W; B's [W, A]
    # -> keeps A
    agent, eng = agent_with(queue_policy([S, S, A, W] + [A, W, W, A]))
    (trees,) = ALGOS["branpo"].grow(agent, [EX], random.Random(0), RolloutConfig(branpo_N=2))
    a, b = trees
    assert eng.calls == [2, 2, 4]
    # branch .1 pruned
    assert [n.id for n in walk(a.root)] == ["p0.n0", "p0.n0.0", "p0.n0.0.0", "p0.n0.0.2"]
    assert a.find("p0.n0.0").prefix_end and a.find("p0.n0.0").n_sampled == 3
    assert [x.reward for x in a.leaves()] == [1.0, 0.0] and [x.reward for x in b.leaves()] == [
        0.0,
        1.0,
    ]
    out = {t.leaf.id: t.advantages for t in advantages.branpo(trees, CreditConfig())}
    # r_base = 0.5, 0.5 -> A_base 0; branches [1,0,0,1] -> +-0.866
    assert out["p0.n0.0.0"] == [0.0, pytest.approx(0.866, abs=1e-3)] and out["p0.n0.0.2"][0] is None


def test_branpo_unbranched_original_stays_split_at_the_last_truncation_point():
    S, A, W = "<search>q</search>", "<answer>Ivo</answer>", "<answer>Oda</answer>"
    # initial: a = S W (wrong), b = S A (correct): acc 0.5 -> Bran 2, Recur 2 (k = 1, then k = 0)
    # k = 1: a's branches [A, W] keep A (contrast); b's [A, A] none
    # k = 0 (b only): [S, S] then [A, A]: none
    agent, eng = agent_with(queue_policy([S, S, W, A] + [A, W, A, A] + [S, S, A, A]))
    a, b = ALGOS["branpo"].grow(agent, [EX], random.Random(0), RolloutConfig(branpo_N=2))[0]
    assert eng.calls == [2, 2, 4, 2, 2]
    assert a.find("p0.n0.0").prefix_end and [x.reward for x in a.leaves()] == [0.0, 1.0]
    # Algorithm 1: b keeps its last split, B = τ≤0 (the prompt), C = {(τ>0, R)}: root marked
    assert b.root.prefix_end and len(b.root.children) == 1 and len(b.leaves()) == 1
    assert agent.counters["rollout/branpo_contrast"] == 1
    out = {t.leaf.id: t.advantages for t in advantages.branpo([a, b], CreditConfig())}
    # r_base = 0.5 (a), 1 (b, empty prefix: trains nothing); Eq. 12 over [0, 1, 1]: mean 2/3,
    # std 0.57735 -> -1.1547, +0.5774, +0.5774: b's two steps take A_branch (unmarked: +0.7071)
    assert out["p0.n1.0.0"] == [pytest.approx(0.5774, abs=1e-4)] * 2


def test_branpo_redundant_step_check():
    S1, S2, A, W = (
        "<search>q1</search>",
        "<search>q2</search>",
        "<answer>Ivo</answer>",
        "<answer>Oda</answer>",
    )
    # initial: A: S1 S2 A (3 steps, correct); B: S1 A (2, correct); C: S1 W (wrong) -> acc 2/3, mean
    # correct len 2.5
    # A is correct and longer than 2.5 -> RSM: 5 branches from depth 1; the 2nd answers at once
    # (shorter, correct)
    # B: contrast at k = 1: [A, A] no contrast, then k = 0 (default W: contrast, kept); C: [A, W]
    # keeps A
    script = (
        [S1, S1, S1, S2, A, W, A]
        + [
            "<search>q3</search>",
            A,
            "<search>q4</search>",
            "<search>q5</search>",
            "<search>q6</search>",
            A,
            A,
            A,
            W,
        ]
        + [A, A, A, A]
    )
    agent, eng = agent_with(queue_policy(script))
    a, b, c = ALGOS["branpo"].grow(agent, [EX], random.Random(0), RolloutConfig(branpo_N=3))[0]
    s1, s2 = path(a.leaves()[0])[:2]
    assert s1.prefix_end and s2.redundant and not s1.redundant
    assert [(x.depth, x.reward) for x in a.leaves()] == [(3, 1.0), (2, 1.0)]
    assert b.root.prefix_end and [x.reward for x in b.leaves()] == [1.0, 0.0]
    assert (
        agent.counters["rollout/branpo_shorter"] == 1
        and agent.counters["rollout/branpo_contrast"] == 2
    )
    out = {t.leaf.id: t.advantages for t in advantages.branpo([a, b, c], CreditConfig())}
    assert out[a.leaves()[0].id][2 - 1] is None  # the redundant step is not trained


def test_branpo_redundant_step_check_fires_at_f1_0_8():
    # rollout rsm-threshold: "correct" is F1 >= 0.8 (App. A.1's threshold), not App. A.1's r = 1.
    # gold "Ivo Ra", answer "Ivo Ra X": common 2 tokens, P = 2/3, R = 2/2 = 1, F1 = 2 (2/3)(1) /
    # (2/3 + 1) = 0.8
    S1, S2, P, W = (
        "<search>q1</search>",
        "<search>q2</search>",
        "<answer>Ivo Ra X</answer>",
        "<answer>Oda</answer>",
    )
    # initial: A: S1 S2 P (3 steps, F1 0.8); B: S1 P (2 steps, F1 0.8); C: S1 W (F1 0)
    # acc = (0.8 + 0.8 + 0) / 3 = 0.533 > 0.5; mean correct length (3 + 2) / 2 = 2.5 < 3: A gets the
    # RSM check (with r = 1 required it would not): 5 branches from depth 1 = T - 2; the 1st answers
    # P at once (2 < 3 steps)
    # B (2 steps, not longer): contrast at k = 1 [P, P] none, then k = 0 (default W, kept); C: k = 1
    # [P, W] keeps P
    script = [S1, S1, S1, S2, P, W, P] + [P, W, W, W, W, P, P, P, W]
    agent, _ = agent_with(queue_policy(script))
    a, b, c = ALGOS["branpo"].grow(
        agent, [Ex("who is it", ["Ivo Ra"])], random.Random(0), RolloutConfig(branpo_N=3)
    )[0]
    s1, s2 = path(a.leaves()[0])[:2]
    assert s1.prefix_end and s2.redundant
    assert [x.depth for x in a.leaves()] == [3, 2] and [
        x.reward for x in a.leaves()
    ] == pytest.approx([0.8, 0.8])
    assert (
        agent.counters["rollout/branpo_shorter"] == 1
        and agent.counters["rollout/branpo_contrast"] == 2
    )


def test_carl_forks_from_lowest_density():
    # search actions are uncertain (NLL 2 per token), answers confident (NLL 0.1): H(root) = 2,
    # H(search) = 0.1
    policy = lambda c: (
        ("<search>q</search>", -2.0) if turns(c) == 0 else ("<answer>Ivo</answer>", -0.1)
    )
    agent, eng = agent_with(policy)
    ([tree],) = ALGOS["carl"].grow(
        agent, [EX], random.Random(0), RolloutConfig(carl_N0=1, carl_N=2)
    )
    # fork 1: root (H/n = 2/1) beats the search state (0.1/1); fork 2: root (2/2 = 1) again
    assert len(tree.root.children) == 3 and len(tree.leaves()) == 3
    assert tree.root.entropy == pytest.approx(2.0) and tree.root.children[
        0
    ].entropy == pytest.approx(0.1)
    policy2 = lambda c: (
        ("<search>q</search>", -0.1) if turns(c) == 0 else ("<answer>Ivo</answer>", -2.0)
    )
    agent, _ = agent_with(policy2)
    ([tree],) = ALGOS["carl"].grow(
        agent, [EX], random.Random(0), RolloutConfig(carl_N0=1, carl_N=2)
    )
    # now the search state is the uncertain one: both forks resample the answer (2/1, then 2/2 vs
    # root 0.1)
    assert len(tree.root.children) == 1 and len(tree.root.children[0].children) == 3


def test_carl_marks_the_steps_of_its_first_phase_chains_phase1():
    # advantages.py --no_carl_train_phase1 leaves out exactly these steps (App. C.1); trees without
    # the marks are refused there
    policy = lambda c: (
        ("<search>q</search>", -2.0) if turns(c) == 0 else ("<answer>Ivo</answer>", -0.1)
    )
    agent, _ = agent_with(policy)
    ([tree],) = ALGOS["carl"].grow(
        agent, [EX], random.Random(0), RolloutConfig(carl_N0=2, carl_N=2)
    )
    # the N0 = 2 chains: the root's first two children and their answers; the 2 forks from the root
    # (H/n = 2/2, then 2/3, beats the searches' 0.1): its last two children and theirs
    first, forks = tree.root.children[:2], tree.root.children[2:]
    assert len(first) == 2 and len(forks) == 2
    assert all(n.phase1 for c in first for n in walk(c))
    assert not any(n.phase1 for c in forks for n in walk(c)) and not tree.root.phase1
    assert tree.to_dict()["children"][0]["phase1"] is True  # and so in a dump's JSON


def alternating_searches():
    """Every step searches; queries alternate between two doc families ('qa' / 'qb'): 2 clusters per
    parent."""
    n = iter(range(10_000))

    def policy(c):
        k = next(n)
        return f"<search>q{'ab'[k % 2]} {k}</search>"

    return policy


def test_treeps_grows_eight_prompts_per_layer_and_keeps_two_per_parent():
    # 3 search rounds + the answer-only step: D = 4
    agent, eng = agent_with(alternating_searches(), max_turns=3)
    ([tree],) = ALGOS["treeps"].grow(
        agent, [EX], random.Random(0), RolloutConfig(treeps_N=8, treeps_retain=2)
    )
    # B_d = ceil(8 / |M(d-1)|) with |M| = 1, 2, 4, 8 -> 8, 4, 2, 1 children per parent: 8 prompts
    # per layer
    assert eng.calls == [8, 8, 8, 8]
    by_depth = [sum(1 for x in walk(tree.root) if x.depth == d) for d in range(1, 5)]
    # kept 2 per parent at depths 1-3; 1 per parent at depth 4 (nothing to prune)
    assert by_depth == [2, 4, 8, 8]
    assert all(x.flags == ["max_turns"] for x in tree.leaves())


def test_treeps_prunes_at_the_depth_limit_and_samples_n_paths():
    retriever = MemoryRetriever()
    agent, eng = agent_with(alternating_searches(), retriever, max_turns=1)  # D = max_turns + 1 = 2
    ([tree],) = ALGOS["treeps"].grow(
        agent, [EX], random.Random(0), RolloutConfig(treeps_N=8, treeps_retain=2, treeps_train=3)
    )
    # depth 1: 8 searches, 2 kept (one per doc family); depth 2: B = ceil(8/2) = 4 per parent, 8
    # searches that the agent ends at its step limit (max_turns, not retrieved): pruned like any, 2
    # per parent -> 4 leaves (8 before)
    assert eng.calls == [8, 8] and [len(q) for q in retriever.calls] == [8]
    assert [sum(1 for x in walk(tree.root) if x.depth == d) for d in (1, 2)] == [2, 4]
    assert all(x.flags == ["max_turns"] and x.reward == 0.0 for x in tree.leaves())
    # §2.3: N_train = 3 of the 4 leaves drawn with the strategies' rng:
    # random.Random(0).sample(range(4), 3)
    assert random.Random(0).sample(range(4), 3) == [3, 1, 0]
    leaves = tree.leaves()
    assert [x.sampled for x in leaves] == [True, True, False, True]
    # only those trained
    assert [t.leaf for t in advantages.treeps([tree], CreditConfig())] == [
        leaves[0],
        leaves[1],
        leaves[3],
    ]
    ([tree],) = ALGOS["treeps"].grow(
        agent_with(alternating_searches(), max_turns=1)[0], [EX], random.Random(0), RolloutConfig()
    )
    assert all(x.sampled for x in tree.leaves())  # N_train = N = 8 >= 4 leaves: every path

    # D <= max_turns: the depth-D searches are retrieved, pruned by Jaccard (a 'qa' and a 'qb' per
    # parent), ended
    retriever = MemoryRetriever()
    agent, eng = agent_with(alternating_searches(), retriever, max_turns=3)
    ([tree],) = ALGOS["treeps"].grow(
        agent, [EX], random.Random(0), RolloutConfig(treeps_N=8, treeps_D=2, treeps_retain=2)
    )
    assert [len(q) for q in retriever.calls] == [8, 8]
    assert [sum(1 for x in walk(tree.root) if x.depth == d) for d in (1, 2, 3)] == [2, 4, 0]
    assert sorted(x.query[:2] for x in tree.leaves()) == ["qa", "qa", "qb", "qb"]
    assert all(x.flags == ["max_turns"] and x.reward == 0.0 for x in tree.leaves())
    # a deeper limit is refused at parse time (tree.depth_rule), before anything runs
    broken, message = depth_rule(RolloutConfig(treeps_D=5), agent.cfg)
    assert broken and "must be at most --max_turns + 1 = 4" in message


def test_treeps_retried_invalid_step_is_not_pruned_as_a_search_child():
    # --retry_invalid: a parse error is flagged and retried, not ended. Depth 1 (N = 4):
    # [oops, qa, qb, oops]; C_search = {qa, qb} (Alg. 1 l. 11), N_retain = 1 keeps one (qa, the
    # first of its cluster; p0.2 pruned). Before, the two invalid steps joined the clustering with
    # no documents and the single cluster kept the first of all four: an invalid one, no search.
    script = iter(["oops", "<search>qa 1</search>", "<search>qb 2</search>", "oops"])
    retriever = MemoryRetriever()
    agent, eng = agent_with(
        lambda c: next(script, "<answer>Ivo</answer>"), retriever, max_turns=1, retry_invalid=True
    )
    ([tree],) = ALGOS["treeps"].grow(
        agent, [EX], random.Random(0), RolloutConfig(treeps_N=4, treeps_retain=1)
    )
    assert [(c.id, c.action, c.flags) for c in tree.root.children] == [
        ("p0.0", "invalid", ["parse_error"]),
        ("p0.1", "search", []),
        ("p0.3", "invalid", ["parse_error"]),
    ]
    assert retriever.calls == [["qa 1", "qb 2"]]
    # M(1) = {p0.0, p0.1, p0.3}: B_2 = ceil(4 / 3) = 2 answers each (depth 2 = D = max_turns + 1)
    assert eng.calls == [4, 6] and [len(c.children) for c in tree.root.children] == [2, 2, 2]
    assert all(x.reward == 1.0 and x.depth == 2 for x in tree.leaves())


def test_jaccard_prune_keeps_the_first_child_of_each_cluster():
    kids = [
        Node(f"c{i}", doc_ids=d)
        for i, d in enumerate([["a", "b"], ["a", "b"], ["c", "d"], ["a", "c"]])
    ]
    # distances: c0-c1 0; c0-c2 1; c0-c3, c1-c3, c2-c3 = 1 - 1/3; average linkage merges c0+c1
    # first, then c3
    # with one side (a tie): either way the 2 clusters' first members are c0 and c2
    assert [k.id for k in jaccard_prune(kids, 2)] == ["c0", "c2"]
    assert jaccard_prune(kids[:2], 2) == kids[:2]
    # Algorithm 1 keeps exactly min(N_retain, |children|), ties or not (fcluster's maxclust kept
    # fewer):
    # all distances 0: merges x+y, then z; cut into 2 clusters: {x, y}, {z}
    same = [Node(i, doc_ids=["a"]) for i in "xyz"]
    assert [k.id for k in jaccard_prune(same, 2)] == ["x", "z"]
    # [a] [a] [a] [b]: merges c0+c1 (0), c2 (0), then c3 (1); 3 clusters: {c0, c1}, {c2}, {c3}
    kids = [Node(f"c{i}", doc_ids=d) for i, d in enumerate([["a"], ["a"], ["a"], ["b"]])]
    assert [k.id for k in jaccard_prune(kids, 3)] == ["c0", "c2", "c3"]
    # six disjoint sets (the most diverse case): all distances 1, merged in index order; 2 clusters:
    # {c0..c4}, {c5}
    kids = [Node(f"c{i}", doc_ids=[d]) for i, d in enumerate("abcdef")]
    assert [k.id for k in jaccard_prune(kids, 2)] == ["c0", "c5"]


def test_cli_dump_feeds_advantages(env):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    dump = env / "dump.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.dump",
            "--algo",
            "treeps",
            "--dump",
            str(dump),
            "--n_prompts",
            "2",
            "--model",
            str(env / "tiny"),
            "--world",
            str(env / "out" / "world"),
            "--treeps_N",
            "3",
            "--treeps_D",
            "2",
            "--split",
            "test",
            "--plot",
            str(env / "five.png"),
            "--plot_prompt",
            "1",
            "--grpo_G",
            "2",
            "--tree_M",
            "1",
            "--branpo_N",
            "2",
            "--carl_N",
            "2",
        ],
        cwd=env,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tree/leaves_per_prompt" in out.stdout and "engine: hf" in out.stdout
    # every method on test question 1
    assert (env / "five.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prompts = json.loads(dump.read_text())
    assert len(prompts) == 2 and all(len(trees) == 1 for trees in prompts)
    got = subprocess.run(
        [
            sys.executable,
            str(root / "advantages.py"),
            "--algo",
            "treeps",
            "--trees",
            str(dump),
            "--prompt",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    report = json.loads(got.stdout)
    assert report["algo"] == "treeps" and len(report["trajectories"]) >= 1


def test_cli_checks_its_flags_before_anything_loads(tmp_path):
    # before: --n_prompts 0 raised a bare ZeroDivisionError in data.spread after the world was
    # built, N 0 rolled out nothing, D 9 failed only after the model loaded (one name per knob now:
    # a flag of another algo is simply that algo's setting, shared with train.py)
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.dump",
            "--algo",
            "treeps",
            "--dump",
            "x.json",
            "--world",
            str(tmp_path / "world"),
            "--n_prompts",
            "0",
            "--treeps_N",
            "0",
            "--treeps_train",
            "-1",
            "--treeps_D",
            "9",
            "--plot_prompt",
            "1",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    for message in (
        "--n_prompts 0: must be an integer >= 1",
        "--treeps_N 0: must be an integer >= 1",
        "--treeps_train -1: must be an integer >= 0",
        # max_turns 4
        "--treeps_D 9: TreePS-RAG's depth limit must be at most --max_turns + 1 = 5",
        "--plot_prompt 1: must be in [0, --n_prompts)",
    ):
        assert message in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "world").exists()  # stopped before the world was written


def test_cli_checks_its_output_paths_before_anything_loads(tmp_path):
    # before: --dump and --plot into a missing directory failed only after the world was written,
    # the model loaded and every rollout grown (a FileNotFoundError traceback)
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    missing = tmp_path / "missing"
    out = subprocess.run(
        [sys.executable, "-m", "scripts.dump", "--dump", str(missing / "d.json")]
        + ["--plot", str(missing / "p.png"), "--world", str(tmp_path / "world")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    for flag, name in (("--dump", "d.json"), ("--plot", "p.png")):
        message = f"{flag} {str(missing / name)!r}: the directory {missing} does not exist"
        assert message in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "world").exists()  # stopped before the world was written


def test_rollout_benchmark_refuses_an_unknown_strategy(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "rollout.py"),
            "--strategies",
            "tree_grpo,nope",
            "--world",
            str(tmp_path / "world"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        out.returncode != 0 and "--strategies 'tree_grpo,nope': unknown ['nope']" in out.stderr
    ), out.stderr[-2000:]
    assert not (tmp_path / "world").exists()  # refused before anything was built or loaded
