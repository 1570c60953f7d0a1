"""tree.py: structure helpers, JSON round trip (and scripts/credit.py's dump files and drawing
data), rendering, and trees -> token-level training samples (TITO)."""

import json

import pytest

from scripts.credit import drawing, load_trees, save_trees
from tree import (
    FLAGS,
    Node,
    Trajectory,
    Tree,
    context_ids,
    leaves,
    path,
    scored_leaves,
    step_credit,
    to_samples,
    walk,
)


def small_tree() -> Tree:
    """prompt [1,2] -> s0 (search) -> {a0 (answer, r=1), a1 (answer, r=0)}; prompt -> s1 (answer,
    env_error)."""
    root = Node("p", tokens=[1, 2])
    s0 = root.add_child(
        tokens=[10, 11],
        logprobs=[-0.1, -0.2],
        obs_tokens=[50, 51, 52],
        action="search",
        query="q",
        doc_ids=["d1", "d2"],
    )
    s0.add_child(tokens=[20], logprobs=[-0.3], action="answer", answer="x", reward=1.0)
    s0.add_child(tokens=[21, 22], logprobs=[-0.4, -0.5], action="answer", answer="y", reward=0.0)
    root.add_child(tokens=[30], logprobs=[-0.6], action="answer", reward=0.0, flags=["env_error"])
    return Tree(root, question="Q?", golden_answers=["x"], stats={"generated_tokens": 6})


def test_nodes_leaves_paths_and_depths_of_a_small_tree():
    t = small_tree()
    assert [n.id for n in walk(t.root)] == ["p", "p.0", "p.0.0", "p.0.1", "p.1"]
    assert [n.id for n in leaves(t.root)] == ["p.0.0", "p.0.1", "p.1"]
    # env_error leaf is discarded
    assert [n.id for n in scored_leaves(t.root)] == ["p.0.0", "p.0.1"]
    leaf = t.find("p.0.1")
    assert [n.id for n in path(leaf)] == ["p.0", "p.0.1"]  # root (the prompt) is not a step
    assert (t.root.depth, t.find("p.0").depth, leaf.depth) == (0, 1, 2)
    with pytest.raises(KeyError, match="no node 'nope'"):
        t.find("nope")


def test_context_ids_are_exact_concatenation():
    t = small_tree()
    # prompt [1,2] + s0 tokens [10,11] + s0 observation [50,51,52] + leaf tokens [21,22]
    assert context_ids(t.find("p.0.1")) == [1, 2, 10, 11, 50, 51, 52, 21, 22]
    assert context_ids(t.root) == [1, 2]


def test_json_round_trip_keeps_every_field_in_both_file_formats(tmp_path):
    t = small_tree()
    t.find("p.0").prefix_end = True
    t.find("p.0.0").redundant = True
    t.find("p.0").entropy = 0.7
    t.find("p.0").value, t.find("p.0").advantage = 0.5, -0.25
    d = t.to_dict()
    back = Tree.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d
    assert back.find("p.0.1").parent.id == "p.0"
    assert back.find("p.0").doc_ids == ["d1", "d2"] and back.find("p.1").flags == ["env_error"]
    assert (back.question, back.golden_answers, back.stats) == (
        "Q?",
        ["x"],
        {"generated_tokens": 6},
    )
    # the rollout dump format (one list of trees per prompt) and the --trees format (one prompt's
    # list)
    save_trees([[t, t]], tmp_path / "dump.json")
    per_prompt = json.loads((tmp_path / "dump.json").read_text())
    (tmp_path / "one.json").write_text(json.dumps(per_prompt[0]))
    assert [x.to_dict() for x in load_trees(tmp_path / "one.json", None)] == [d, d]
    assert [x.to_dict() for x in load_trees(tmp_path / "dump.json", 0)] == [d, d]
    with pytest.raises(ValueError, match="rollout dump of 1 prompts; pick one with --prompt"):
        load_trees(tmp_path / "dump.json", None)


def test_json_errors_are_specific(tmp_path):
    with pytest.raises(ValueError, match=r"unknown keys \['rewrd'\]"):
        Tree.from_dict({"id": "r", "children": [{"id": "r.0", "rewrd": 1.0}]})
    with pytest.raises(ValueError, match="unknown flags"):
        Tree.from_dict({"id": "r", "flags": ["oops"]})
    with pytest.raises(ValueError, match="has no 'id'"):
        Tree.from_dict({"children": []})
    (tmp_path / "bad.json").write_text(json.dumps({"id": "r"}))
    with pytest.raises(ValueError, match="expected a JSON list of trees"):
        load_trees(tmp_path / "bad.json", None)


def test_render_shows_reward_value_advantage_and_flags():
    t = small_tree()
    t.find("p.0").value, t.find("p.0").advantage = 0.5, -0.25
    text = t.render()
    assert "p.0  search 'q'  V=+0.500  A=-0.250" in text
    assert "p.0.0  answer -> 'x'  r=+1.000" in text
    assert "[env_error]" in text
    assert text.splitlines()[0].startswith("p  prompt")


def test_samples_mask_advantage_and_logprobs():
    t = small_tree()
    a0, a1 = t.find("p.0.0"), t.find("p.0.1")
    samples = to_samples([Trajectory(a0, [0.5, 2.0]), Trajectory(a1, [None, -1.0])])
    s0, s1 = samples
    assert s0.input_ids == [1, 2, 10, 11, 50, 51, 52, 20]
    assert s0.loss_mask == [0, 0, 1, 1, 0, 0, 0, 1]  # prompt and observation tokens never trained
    assert s0.advantages == [0, 0, 0.5, 0.5, 0, 0, 0, 2.0]
    assert s0.logprobs == [0, 0, -0.1, -0.2, 0, 0, 0, -0.3]
    # second trajectory trains only its own last step: the shared prefix was trained in the first
    assert s1.input_ids == [1, 2, 10, 11, 50, 51, 52, 21, 22]
    assert s1.loss_mask == [0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert s1.advantages == [0, 0, 0, 0, 0, 0, 0, -1.0, -1.0]
    assert s1.leaf_id == "p.0.1"
    for s in samples:  # every masked-in position is a model token with its rollout log-prob
        assert len(s.input_ids) == len(s.loss_mask) == len(s.advantages) == len(s.logprobs)
        assert all(lp < 0 for lp, m in zip(s.logprobs, s.loss_mask) if m)


def test_samples_drop_truncated_and_untrained():
    t = small_tree()
    a0, a1 = t.find("p.0.0"), t.find("p.0.1")
    a1.flags.append("truncated")  # token budget exceeded: reward counts, tokens are not trained
    assert [
        s.leaf_id for s in to_samples([Trajectory(a0, [None, None]), Trajectory(a1, [1.0, 1.0])])
    ] == []
    with pytest.raises(ValueError, match="1 advantages for 2 steps"):
        to_samples([Trajectory(a0, [1.0])])
    a0.logprobs = []
    with pytest.raises(ValueError, match="0 logprobs for 1 tokens"):
        to_samples([Trajectory(a0, [1.0, 1.0])])


def test_the_abnormal_flags_are_the_six_outcomes():
    assert set(FLAGS) == {
        "parse_error",
        "repeated_query",
        "too_many_calls",
        "max_turns",
        "truncated",
        "env_error",
    }


def test_step_credit_sums_the_rows_that_train_a_step():
    t = small_tree()
    a0, a1 = t.find("p.0.0"), t.find("p.0.1")
    # p.0 is trained in both rows: 0.5 + (-2.0) = -1.5; p.0.1 only in the second; None counts
    # nothing
    assert step_credit([Trajectory(a0, [0.5, None]), Trajectory(a1, [-2.0, 1.0])]) == {
        "p.0": -1.5,
        "p.0.1": 1.0,
    }
    a1.flags.append("truncated")  # to_samples drops the row: its advantages reach no token
    assert step_credit([Trajectory(a0, [0.5, 2.0]), Trajectory(a1, [-2.0, 1.0])]) == {
        "p.0": 0.5,
        "p.0.0": 2.0,
    }


def test_drawing_kinds_marks_and_dropped_children():
    t = small_tree()
    t.find("p.0").prefix_end = True
    t.find("p.0.1").flags.append("truncated")
    t.root.n_sampled = 4  # two children kept of four sampled
    rows = {r["id"]: r for r in drawing([t], [Trajectory(t.find("p.0.0"), [0.5, 2.0])])}
    assert list(rows) == ["p", "p.0", "p.0.0", "p.0.1", "p.1"]
    assert [r["kind"] for r in rows.values()] == [
        "prompt",
        "search",
        "answer",
        "truncated",
        "discarded",
    ]
    assert [r["credit"] for r in rows.values()] == [None, 0.5, 2.0, None, None]
    assert [r["reward"] for r in rows.values()] == [None, None, 1.0, 0.0, 0.0]
    assert rows["p"] | {"marks": None} == {
        "id": "p",
        "parent": None,
        "kind": "prompt",
        "credit": None,
        "reward": None,
        "marks": None,
        "dropped": 2,
    }
    assert rows["p"]["marks"] == ["fork"] and rows["p.0"]["marks"] == [
        "prefix_end",
        "fork",
        "retained",
    ]
    assert rows["p.0.1"]["parent"] == "p.0" and rows["p.0.1"]["marks"] == []
