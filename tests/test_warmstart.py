"""infra/warmstart.py: the thought format, every deliberate mistake, loss masks, and the cached
checkpoint's contract."""

import json
import random

import pytest

import rollout
from infra import loaders, protocol, warmstart
from infra.data import QARow
from infra.policy import load_policy
from infra.search import BM25Retriever, load_corpus
from scripts import warmstart as driver

ROW = QARow(
    id="t",
    question="where is the employer of kalo mire based?",
    golden_answers=["latori"],
    data_source="world",
    split="train",
    index=0,
    hops=2,
    gold_chain=["kalo mire", "ravoki", "latori"],
    gold_relations=["works_for", "based_in"],
    gold_queries=["kalo mire", "ravoki"],
)


def test_open_question_rewords_each_resolved_hop_and_fact_states_it():
    # nothing resolved yet: the original wording
    assert warmstart.open_question(ROW, 0) == ROW.question
    # "the employer of kalo mire" -> ravoki
    assert warmstart.open_question(ROW, 1) == "where is ravoki based?"
    assert warmstart.fact(ROW, 0) == "kalo mire works for ravoki."
    assert warmstart.fact(ROW, 1) == "ravoki is based in latori."


@pytest.fixture(scope="module")
def setup(env):
    world = str(env / "out" / "world")
    retriever = BM25Retriever(load_corpus(f"{world}/corpus.jsonl"))
    tok = warmstart.world_tokenizer()
    agent = rollout.Agent(
        None,
        retriever,
        tok,
        protocol.AgentConfig(instruction="short", topk=2, max_obs_tokens=60),
        0,
    )
    rows = loaders.load_rows(world, "train")
    return agent, retriever, rows, world


def observed(agent, queries):
    """Each query's observation ids, as the warm start caches them for its demonstrations (query ->
    ids)."""
    passages = agent.retriever.search(list(queries), agent.cfg.topk)
    return {
        q: agent.observation_ids(protocol.format_passages(p)) for q, p in zip(queries, passages)
    }


def steps_of(agent, ids, mask):
    """The model's steps of a supervised trajectory, parsed as the rollout parses them, and the
    observations."""
    runs, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            runs.append((mask[start], ids[start:i]))
            start = i
    actions = [protocol.parse_action(agent.tok.decode(seg), "think", 1) for m, seg in runs if m]
    observations = [seg for m, seg in runs[1:] if not m]
    return runs, actions, observations


def test_gold_trajectory_quotes_facts_and_masks_prompt_and_observations(setup):
    agent, retriever, rows, _ = setup
    row = next(r for r in rows if r.hops == 3)
    ids, mask = warmstart.trajectory(
        agent, row, random.Random(0), None, [], observed(agent, row.gold_queries)
    )
    runs, actions, observations = steps_of(agent, ids, mask)
    assert runs[0] == (0, agent.prompt_ids(row.question))  # the prompt is never trained
    assert actions == [("search", q, None) for q in row.gold_queries] + [
        ("answer", row.golden_answers[0], None)
    ]
    # exactly the ids the agent would append at RL time
    for q, obs in zip(row.gold_queries, observations):
        assert obs == agent.observation_ids(protocol.format_passages(retriever.search([q], 2)[0]))
    thoughts = [agent.tok.decode(seg) for m, seg in runs if m]
    assert thoughts[0].startswith("<think> " + row.question)
    assert "the answer is" in thoughts[-1] and warmstart.fact(row, 2).rstrip(".") in thoughts[-1]
    assert warmstart.open_question(row, 2) in thoughts[2]


@pytest.mark.parametrize("seed", range(4))
def test_each_deliberate_mistake_is_well_formed_and_does_what_it_says(setup, seed):
    agent, retriever, rows, _ = setup
    row = next(r for r in rows if r.hops == 3)
    other = next(r.gold_queries[0] for r in rows if r.gold_queries[0] not in row.gold_chain)
    gold = row.gold_queries

    def searches(mistake):
        ids, mask = warmstart.trajectory(
            agent,
            row,
            random.Random(seed),
            mistake,
            [other],
            observed(agent, [*row.gold_queries, other]),
        )
        _, actions, _ = steps_of(agent, ids, mask)
        assert all(flag is None for _, _, flag in actions)  # every mistake is well-formed
        return [c for a, c, _ in actions if a == "search"], actions[-1]

    qs, last = searches("early")  # after 1 or 2 hops, answers the entity reached so far
    assert (
        qs == gold[: len(qs)]
        and 1 <= len(qs) < 3
        and last == ("answer", row.gold_chain[len(qs)], None)
    )
    # one unrelated search inserted before some gold query; still answers right
    qs, last = searches("wrong")
    assert (
        len(qs) == 4 and [q for q in qs if q != other] == gold and last[1] == row.golden_answers[0]
    )
    qs, last = searches("repeat")  # one gold query issued twice in a row
    assert len(qs) == 4 and sorted(set(qs), key=qs.index) == gold
    assert any(a == b for a, b in zip(qs, qs[1:])) and last[1] == row.golden_answers[0]


def test_ensure_trains_once_then_insists_on_the_same_settings(setup, tmp_path, capsys):
    agent, retriever, _, world = setup
    # the copy stage ends once the mean loss of its last 50 steps is below copy_loss: at once (50 of
    # 60 steps)
    # when that is any loss at all
    cfg = warmstart.WarmConfig(
        copy_steps=60, copy_loss=1e9, sft_steps=2, warm_batch_size=2, target_em=0
    )
    out = str(tmp_path / "warm")
    capsys.readouterr()
    # the run's BM25 over the world corpus
    driver.ensure(out, world, cfg, agent.cfg, 0, retriever)
    assert "retriever: bm25" not in capsys.readouterr().out  # reused (before: a second index)
    saved = json.loads((tmp_path / "warm" / "warmstart.json").read_text())
    assert saved["sft_steps"] == 2 and saved["topk"] == 2 and saved["max_obs_tokens"] == 60
    assert saved["copy_steps_done"] == 50 and saved["sft_steps_done"] == 2
    model, tok = load_policy(out)
    assert protocol.instruction_template("auto", tok) == protocol.SHORT_INSTRUCTION
    driver.ensure(out, world, cfg, agent.cfg, 0)
    assert "cached" in capsys.readouterr().out
    # another observation format: the checkpoint does not fit
    with pytest.raises(ValueError, match="topk"):
        driver.ensure(
            out,
            world,
            cfg,
            protocol.AgentConfig(**{**agent.cfg.__dict__, "topk": 3}),
            0,
        )
    # another seed: neither (the seed is the run's, kept in warmstart.json as "seed")
    with pytest.raises(ValueError, match=r"\{'seed': \(0, 1\)\}"):
        driver.ensure(out, world, cfg, agent.cfg, 1)
    # a truncated model file: before, a SafetensorError that named no file at the policy's load
    weights = tmp_path / "warm" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(
        ValueError,
        match=r"warm start in \S+warm is incomplete: \S+warm/model.safetensors cannot be read "
        r"\(SafetensorError: .*; truncated\?\); delete \S+warm to retrain it",
    ):
        driver.ensure(out, world, cfg, agent.cfg, 0)
    (tmp_path / "warm" / "tokenizer.json").unlink()  # a cache that lost a file: said before loading
    with pytest.raises(
        ValueError,
        match=r"the cached warm start in .*warm is incomplete: .*warm "
        r"has no tokenizer files \(none of tokenizer.json.*delete "
        r".*warm to retrain it",
    ):
        driver.ensure(out, world, cfg, agent.cfg, 0)


def test_a_warm_start_below_target_trains_to_its_cap_then_fails_loudly_and_saves_nothing(
    setup, tmp_path, capsys
):
    agent, _, _, world = setup
    # 2 steps, validate (EM 0 < 0.6), 2 more at half the lr, validate again, then 4 + 2 >
    # sft_max_steps 5: stop
    cfg = warmstart.WarmConfig(
        copy_steps=0, sft_steps=2, sft_max_steps=5, warm_batch_size=2, target_em=0.6, val_n=4
    )
    out = tmp_path / "warm"
    with pytest.raises(
        RuntimeError,
        match=r"warm start failed: greedy dev EM 0\.000 < target_em 0\.6 after 4 "
        r"trajectory steps \(sft_max_steps 5\)",
    ):
        driver.ensure(str(out), world, cfg, agent.cfg, 0)
    printed = capsys.readouterr().out
    assert (
        "greedy dev EM 0.000 after 2 trajectory steps" in printed
        and "after 4 trajectory steps" in printed
    )
    assert not out.exists()  # nothing a later run could mistake for a usable warm start


def test_the_demonstrator_stops_at_its_search_budget_on_longer_questions_only(setup):
    agent, _, rows, _ = setup
    four, three = next(r for r in rows if r.hops == 4), next(r for r in rows if r.hops == 3)
    other = next(r.gold_queries[0] for r in rows if r.gold_queries[0] not in four.gold_chain)

    def searches(row, cfg, rng):
        ids, mask = warmstart.demonstration(
            agent, row, rng, cfg, [other], observed(agent, [*row.gold_queries, other])
        )
        _, actions, _ = steps_of(agent, ids, mask)
        return [c for a, c, _ in actions if a == "search"], actions[-1]

    always = warmstart.WarmConfig(search_budget=3, budget_rate=1.0, mistake_rate=0.0)
    # 3 searches, then the entity reached: chain[3], wrong
    qs, last = searches(four, always, random.Random(0))
    assert qs == four.gold_queries[:3] and last == ("answer", four.gold_chain[3], None)
    assert last[1] != four.golden_answers[0]
    # a 3-hop question fits the budget: the gold chain
    qs, last = searches(three, always, random.Random(0))
    assert qs == three.gold_queries and last == ("answer", three.golden_answers[0], None)
    # 0 = no budget
    never = warmstart.WarmConfig(search_budget=0, budget_rate=1.0, mistake_rate=0.0)
    assert searches(four, never, random.Random(0))[0] == four.gold_queries
    # budget_rate 0.7: of 300 demonstrations of a 4-hop question, ~210 stop at 3 searches (binomial
    # sd sqrt(300 x 0.7 x 0.3) = 7.9, so 210 +- 4 sd = [178, 242]); the others search all 4 hops
    rng, cfg = (
        random.Random(1),
        warmstart.WarmConfig(search_budget=3, budget_rate=0.7, mistake_rate=0.0),
    )
    counts = [len(searches(four, cfg, rng)[0]) for _ in range(300)]
    assert set(counts) == {3, 4} and 178 <= counts.count(3) <= 242


def test_the_warm_start_command_refuses_an_out_that_is_not_a_warm_start(tmp_path):
    # before: `train.py warmstart --out out --world out/world` replaced out/ with the warm start,
    # deleting its runs and its world
    out = tmp_path / "out"
    (out / "world").mkdir(parents=True)
    (out / "world" / "train.jsonl").write_text("{}\n")
    (out / "runs" / "grpo-seed0").mkdir(parents=True)
    (out / "runs" / "grpo-seed0" / "metrics.jsonl").write_text('{"step": 1}\n')
    tiny = "--copy_steps 1 --sft_steps 1 --warm_batch_size 2 --target_em 0".split()
    with pytest.raises(SystemExit, match=r"--out '\S+/out' holds --world '\S+/out/world'"):
        driver.main(["--out", str(out), "--world", str(out / "world"), *tiny])
    with pytest.raises(SystemExit, match=r"is not empty and is not a warm start .*it holds runs"):
        driver.main(["--out", str(out), "--world", str(tmp_path / "world"), *tiny])
    (out / "warmstart.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"holds a run \(\S+/runs/grpo-seed0\)"):
        driver.main(["--out", str(out), "--world", str(tmp_path / "world"), *tiny])
    assert (out / "runs" / "grpo-seed0" / "metrics.jsonl").exists()
    assert (out / "world" / "train.jsonl").exists() and not (tmp_path / "world").exists()
    assert driver.out_problem(str(tmp_path / "new"), str(tmp_path / "world")) == ""
