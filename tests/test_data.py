"""infra/data.py: the embedded world (determinism, gold chains, split by entity, vocabulary),
loaders."""

import json
import os
import re
import subprocess
import sys

import pytest

from infra import data
from infra.data import (
    RELATIONS,
    TEMPLATE_WORDS,
    QARow,
    WorldConfig,
    build_world,
    syllabify,
    write_world,
)
from infra.loaders import DataError, load_rows, source_problem

SMALL = WorldConfig(
    people=300,
    companies=60,
    books=120,
    cities=30,
    countries=8,
    train_per_hop=40,
    test_per_hop=20,
    dev_per_hop=10,
)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def world():
    return build_world(SMALL)


def test_same_seed_same_world_other_seed_other_world(world):
    again = build_world(SMALL)
    assert again.corpus == world.corpus and again.train == world.train and again.test == world.test
    other = build_world(WorldConfig(**{**SMALL.__dict__, "seed": 1}))
    assert other.corpus != world.corpus


def test_each_split_has_its_questions_per_hop_indexed_without_duplicates(world):
    for split, per_hop in ((world.train, SMALL.train_per_hop), (world.test, SMALL.test_per_hop)):
        assert [sum(r.hops == h for r in split) for h in range(1, 5)] == [per_hop] * 4
        assert [r.index for r in split] == list(range(len(split)))
        # no duplicates
        assert len({(r.gold_chain[0], tuple(r.gold_relations)) for r in split}) == len(split)


def test_dev_split_is_held_out_from_test_and_leaves_test_unchanged(world):
    assert [sum(r.hops == h for r in world.dev) for h in range(1, 5)] == [SMALL.dev_per_hop] * 4
    key = lambda r: (r.gold_chain[0], tuple(r.gold_relations))
    # no test question is a dev question
    assert not {key(r) for r in world.dev} & {key(r) for r in world.test}
    train_side = {n for r in world.train for n in r.gold_chain[:-1]}
    # dev entities: test side only
    assert not {n for r in world.dev for n in r.gold_chain[:-1]} & train_side
    # drawn after test
    assert build_world(WorldConfig(**{**SMALL.__dict__, "dev_per_hop": 1})).test == world.test


def test_gold_chain_is_answerable_by_searching_the_gold_queries(world):
    by_id = {row["id"]: row["contents"] for row in world.corpus}
    for row in world.train + world.test + world.dev:
        assert len(row.gold_chain) == row.hops + 1 and len(row.gold_relations) == row.hops
        assert (
            row.gold_queries == row.gold_chain[:-1] and row.golden_answers[0] == row.gold_chain[-1]
        )
        # no entity twice: no query must be repeated
        assert len(set(row.gold_chain)) == len(row.gold_chain)
        # each gold passage states the fact that leads to the next hop
        for i, rel in enumerate(row.gold_relations):
            contents = by_id[row.gold_doc_ids[i]]
            assert contents.split("\n")[0] == row.gold_queries[i]
            assert (
                RELATIONS[rel].fact.format(s=row.gold_chain[i], o=row.gold_chain[i + 1]) in contents
            )


def test_question_wording_composes_the_relations(world):
    row = next(r for r in world.train if r.gold_relations == ["works_for", "founded_by"])
    assert row.question == f"who founded the employer of {row.gold_chain[0]}?"
    for row in world.test:
        phrase = row.gold_chain[0]
        for rel in row.gold_relations[:-1]:
            phrase = RELATIONS[rel].noun.format(s=phrase)
        assert row.question == RELATIONS[row.gold_relations[-1]].question.format(s=phrase)


def test_company_answers_accept_the_suffix(world):
    row = next(r for r in world.train if r.gold_relations[-1] == "works_for")
    assert row.golden_answers == [row.gold_chain[-1], row.gold_chain[-1] + " company"]


def test_test_split_never_touches_an_entity_asked_about_in_train(world):
    # subject + intermediate entities
    searched = lambda rows: {name for r in rows for name in r.gold_queries}
    assert searched(world.train) and searched(world.test)
    assert not searched(world.train) & searched(world.test)
    train_text = " ".join(r.question for r in world.train)
    assert not any(re.search(rf"\b{r.gold_chain[0]}\b", train_text) for r in world.test)


def test_every_word_is_a_template_word_or_made_of_syllables(world):
    texts = [row["contents"] for row in world.corpus]  # every string the world shows a model
    texts += [
        t for r in world.train + world.test + world.dev for t in [r.question, *r.golden_answers]
    ]
    for text in texts:
        for word in re.findall(r"[a-z]+", text):
            assert word in TEMPLATE_WORDS or syllabify(word), (word, text)
        assert set(re.sub(r"[a-z\s]", "", text)) <= set(data.PUNCTUATION), text
    assert (
        syllabify("kalo") == ["ka", "lo"] and syllabify("kal") is None and syllabify("born") is None
    )
    assert set(data.vocabulary()) >= set(TEMPLATE_WORDS) | set(data.SYLLABLES)


def test_distractors_are_confusable_and_never_asked(world):
    real = {e.name for e in world.entities if e.side != "distractor"}
    distractors = [e for e in world.entities if e.side == "distractor"]
    assert len(distractors) > 0.2 * len(real) and len({e.name for e in world.entities}) == len(
        world.entities
    )
    asked = {name for r in world.train + world.test for name in r.gold_chain}
    assert not asked & {d.name for d in distractors}

    def one_syllable_apart(a, b):
        sa, sb = [syllabify(w) for w in a.split()], [syllabify(w) for w in b.split()]
        return [len(x) for x in sa] == [len(y) for y in sb] and sum(
            x != y for wa, wb in zip(sa, sb) for x, y in zip(wa, wb)
        ) == 1

    d = distractors[0]
    assert any(one_syllable_apart(d.name, name) for name in real)


def test_cli_writes_the_four_files(tmp_path):
    args = [f"--{k}={v}" for k, v in SMALL.__dict__.items()]
    subprocess.run(
        [sys.executable, "-m", "infra.data", "--out", str(tmp_path), *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    assert sorted(os.listdir(tmp_path)) == [
        "corpus.jsonl",
        "dev.jsonl",
        "test.jsonl",
        "train.jsonl",
    ]
    first = json.loads(open(tmp_path / "corpus.jsonl").readline())
    assert set(first) == {"id", "contents"}
    # our own files load through the FlashRAG path, gold kept
    rows = load_rows(str(tmp_path), split="test")
    assert rows == build_world(SMALL).test


def test_cli_checks_its_flags_before_building(tmp_path):
    # before: --train_per_hop -1 wrote a world with an empty train split and exit 0 (train.py then
    # failed on it)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "infra.data",
            "--out",
            str(tmp_path / "w"),
            "--train_per_hop",
            "-1",
            "--people",
            "0",
            "--test_fraction",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and not (tmp_path / "w").exists()
    for message in (
        "--train_per_hop -1: must be an integer >= 1",
        "--people 0: must be an integer >= 1",
        "--test_fraction 1.0: must be in (0, 1)",
    ):
        assert message in out.stderr, out.stderr[-2000:]


def test_a_second_process_waits_for_the_world_then_reads_it(tmp_path, world):
    # before: two runs sharing an --out_dir both wrote out/world at once, each reading what the
    # other half-wrote
    import fcntl

    out = tmp_path / "world"
    # this test's process writes the world, as a first run would
    with open(tmp_path / "world.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write(f"{os.getpid()} testhost\n")
        lock.flush()
        code = (
            f"from infra import data; data.ensure_world({str(out)!r}, "
            f"data.WorldConfig(**{SMALL.__dict__!r}))"
        )
        second = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        said = second.stdout.readline()
        assert (
            f"waiting for process {os.getpid()} testhost to finish with the world {out}" in said
        ), said + second.stderr.read()
        assert not out.exists() and second.poll() is None  # it waits, writing nothing
        write_world(world, out)
    assert second.wait(timeout=120) == 0, second.stderr.read()
    # it found the world complete and used it as it was
    assert "writing" not in second.stdout.read()
    assert sorted(os.listdir(out)) == ["corpus.jsonl", "dev.jsonl", "test.jsonl", "train.jsonl"]


def test_a_world_killed_while_written_is_written_again(tmp_path, world, monkeypatch):
    # before: a kill in the middle of dev.jsonl left four files, so the next run read the torn split
    # as complete
    write = data.write_jsonl

    def killed_in_dev(path, rows):
        if "dev.jsonl" in str(path):
            write(path, rows[:3])  # the kill comes after 3 of the dev rows
            raise KeyboardInterrupt
        write(path, rows)

    monkeypatch.setattr(data, "write_jsonl", killed_in_dev)
    with pytest.raises(KeyboardInterrupt):
        data.ensure_world(str(tmp_path), SMALL)
    monkeypatch.setattr(data, "write_jsonl", write)
    data.ensure_world(str(tmp_path), SMALL)
    assert load_rows(str(tmp_path), "dev") == world.dev


# ---- loaders


def test_a_search_r1_parquet_loads_into_question_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompt = "Answer the given question... Question: who founded ravoki?\n"
    records = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": ["kalo mire", "kalo"]}},
            "extra_info": {"split": "train", "index": 7},
        },
        {
            "data_source": "hotpotqa",
            "prompt": [{"role": "user", "content": "Question: where is vosa?"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": ["tesuna"]}},
            "extra_info": {"split": "train", "index": 8},
        },
    ]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "train.parquet")
    rows = load_rows(str(tmp_path / "train.parquet"))
    assert rows[0] == QARow(
        id="train_0",
        question="who founded ravoki?",
        golden_answers=["kalo mire", "kalo"],
        data_source="nq",
        split="train",
        index=7,
    )
    assert rows[1].question == "where is vosa?" and rows[1].golden_answers == ["tesuna"]
    assert load_rows(str(tmp_path)) == rows  # a directory holding train.parquet


def test_search_r1_question_column_wins_over_prompt(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    record = {
        "id": "q1",
        "question": "Who wrote X?",
        "prompt": [{"role": "user", "content": "template ..."}],
        "reward_model": {"ground_truth": {"target": ["Y"]}},
    }
    pq.write_table(pa.Table.from_pylist([record]), tmp_path / "t.parquet")
    (row,) = load_rows(str(tmp_path / "t.parquet"))
    assert (row.id, row.question, row.golden_answers) == ("q1", "Who wrote X?", ["Y"])


def test_bad_parquet_row_names_file_and_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {"prompt": [{"role": "user", "content": "Question: a?"}], "reward_model": {"style": "rule"}}
    ] * 2
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "bad.parquet")
    with pytest.raises(
        DataError, match=r"bad\.parquet: row 0: Search-R1 row has no reward_model\.ground_truth"
    ):
        load_rows(str(tmp_path / "bad.parquet"))


def test_a_parquet_that_is_not_one_is_named(tmp_path):
    # before: pyarrow's ArrowInvalid traceback
    (tmp_path / "train.parquet").write_text('{"question": "a?"}\n')
    with pytest.raises(DataError, match=r"train\.parquet is not a Parquet file that pyarrow reads"):
        load_rows(str(tmp_path / "train.parquet"))


def test_a_flashrag_jsonl_loads_with_ids_and_a_list_of_golden_answers(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_text(
        '{"id": "a", "question": "q one?", "golden_answers": ["x", "y"]}\n\n'
        '{"question": "q two?", "golden_answers": "z", "metadata": {}}\n'
    )
    rows = load_rows(str(path), split="dev")
    assert [(r.id, r.question, r.golden_answers, r.split, r.index) for r in rows] == [
        ("a", "q one?", ["x", "y"], "dev", 0),
        ("dev_1", "q two?", ["z"], "dev", 1),
    ]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question": "q?"}', "line 2: not a question row"),
        (
            '{"question": "q?", "golden_answers": []}',
            "line 2: golden answers must be a non-empty list",
        ),
        (
            '{"question": "q?", "golden_answers": [3]}',
            "line 2: golden answers must be a non-empty list",
        ),
        ('{"question": " ", "golden_answers": ["x"]}', "line 2: empty or non-string question"),
        ('{"question": "q?", "golden_answers": ["x"]', "line 2: invalid JSON"),
        ('["q?", ["x"]]', "line 2: expected a JSON object"),
        # before: accepted, and EM / F1 then gave 1.0 to the answers "a", "the" and "?"
        ('{"question": "q?", "golden_answers": ["x", "The"]}', "line 2: golden answer 'The'"),
        ('{"question": "q?", "golden_answers": ""}', "line 2: golden answer '' is empty once"),
        ('{"question": "q?", "golden_answers": ["..."]}', "line 2: golden answer '...' is"),
    ],
)
def test_bad_jsonl_row_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "fine?", "golden_answers": ["x"]}\n' + line + "\n")
    with pytest.raises(DataError, match=re.escape(f"bad.jsonl: {message}")):
        load_rows(str(path))


def test_a_missing_or_empty_source_is_refused(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_rows(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match="has no test.parquet or test.jsonl"):
        load_rows(str(tmp_path), split="test")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="holds no rows"):
        load_rows(str(tmp_path / "empty.jsonl"))


def test_a_missing_path_is_not_taken_for_a_hub_dataset(tmp_path, monkeypatch):
    # before: a path that did not exist, without a .jsonl/.json/.parquet suffix, went to
    # datasets.load_dataset and ended in its traceback (offline: after 48 s of retries)
    import datasets

    def no_hub(name, split):
        raise ConnectionError(f"Couldn't reach {name!r} on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    for source in (str(tmp_path / "questions"), "nq_hotpotqa", "nq_hotpotqa/", "./a/b", "a/b/c"):
        assert "does not exist: no file or directory" in source_problem(source, "train"), source
        with pytest.raises(DataError, match=re.escape(f"{source}: does not exist: no file or")):
            load_rows(source)
    # a directory without the split's file; an existing file, a directory with it, OWNER/NAME: fine
    said = source_problem(str(tmp_path), "test")
    assert said == "has no test.parquet or test.jsonl; pass a file, or a directory holding one"
    (tmp_path / "test.jsonl").write_text('{"question": "q?", "golden_answers": ["x"]}\n')
    for fine in (tmp_path, tmp_path / "test.jsonl", "RUC-NLPIR/FlashRAG_datasets"):
        assert source_problem(str(fine), "test") == "", fine
    (tmp_path / "q.csv").write_text("question,golden_answers\n")  # datasets reads none either
    assert source_problem(str(tmp_path / "q.csv"), "train").startswith("is not a .parquet, .jsonl")
    # a hub name that cannot be fetched says so, naming both readings
    with pytest.raises(DataError, match=r"owner/name: not a local file or directory, and "):
        load_rows("owner/name")


def test_a_hugging_face_dataset_name_loads_through_datasets(monkeypatch):
    import datasets

    calls = []

    # no network here: stand in for the hub with an in-memory dataset
    def fake_load_dataset(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_list(
            [{"id": "1", "question": "q?", "golden_answers": ["x", "y"]}]
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_rows("RUC-NLPIR/FlashRAG_datasets", split="test") == [
        QARow(
            id="1",
            question="q?",
            golden_answers=["x", "y"],  # ("a" would be refused: it normalises to "")
            data_source="unknown",
            split="test",
            index=0,
        )
    ]
    assert calls == [("RUC-NLPIR/FlashRAG_datasets", "test")]


def test_a_written_world_loads_back_unchanged(tmp_path, world):
    write_world(world, tmp_path)
    assert load_rows(str(tmp_path / "train.jsonl")) == world.train


def test_impossible_world_says_what_to_change():
    with pytest.raises(
        ValueError, match="no test-side entity can start a 1-hop question; move test_fraction"
    ):
        build_world(WorldConfig(**{**SMALL.__dict__, "test_fraction": 0.0}))
    with pytest.raises(ValueError, match="distinct 1-hop test questions could be drawn, 500 asked"):
        build_world(WorldConfig(**{**SMALL.__dict__, "test_per_hop": 500}))


def test_spread_takes_rows_evenly():
    assert data.spread(list(range(10)), 3) == [0, 3, 6]  # step 10 // 3 = 3
    assert data.spread(list(range(2)), 5) == [0, 1]  # fewer rows than asked: all of them


# ---- malformed inputs name the file and line


@pytest.mark.parametrize(
    "content, message",
    [
        (
            b'{"question": "q?", "golden_answers": ["x"], "hops": null}\n',
            "line 1: 'hops' must be an integer, got None",
        ),
        (
            b'{"question": "q?", "golden_answers": ["x"], "hops": "two"}\n',
            "line 1: 'hops' must be an integer, got 'two'",
        ),
        (
            b'{"question": "fine?", "golden_answers": ["x"]}\n{"question": "caf\xe9?", '
            b'"golden_answers": ["x"]}\n',
            "line 2: not UTF-8",
        ),
    ],
)
def test_odd_values_and_bytes_name_file_and_line(tmp_path, content, message):
    (tmp_path / "odd.jsonl").write_bytes(content)
    with pytest.raises(DataError, match=re.escape(f"odd.jsonl: {message}")):
        load_rows(str(tmp_path / "odd.jsonl"))


def test_empty_parquet_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    with pytest.raises(DataError, match="empty.parquet holds no rows"):
        load_rows(str(tmp_path / "empty.parquet"))
