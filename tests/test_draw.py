"""infra/draw.py: panels of plain node dicts drawn to a PNG; large panels simplified, saying so."""

import pytest

from infra import draw

PNG = b"\x89PNG\r\n\x1a\n"


def node(id_, parent, kind="search", credit=None, reward=None, marks=(), dropped=0):
    return {
        "id": id_,
        "parent": parent,
        "kind": kind,
        "credit": credit,
        "reward": reward,
        "marks": list(marks),
        "dropped": dropped,
    }


def test_abnormal_steps_and_a_one_node_tree_draw(tmp_path):
    abnormal = [
        node("p", None, "prompt", dropped=2, marks=["fork"]),
        node("p.0", "p", credit=0.5, marks=["prefix_end", "fork", "retained"]),
        node("p.0.0", "p.0", "truncated", reward=0.0),  # cut by the token budget
        node("p.0.1", "p.0", "invalid", credit=-1.0, reward=0.0),  # a parse-error leaf
        node("p.0.2", "p.0", "answer", credit=0.25, reward=0.67, marks=["sampled"]),
        node("p.1", "p", "discarded"),
        node("p.2", "p", "step", credit=0.0, reward=1.0),
    ]
    panels = [{"algo": name, "nodes": abnormal, "note": "a note"} for name in draw.PANELS]
    panels[0] = {"algo": "grpo", "nodes": [node("r", None, "prompt")]}  # the prompt alone
    draw.figure(panels, tmp_path / "f.png", "title", "caption")
    assert (tmp_path / "f.png").read_bytes()[:8] == PNG
    draw.figure([{"algo": "carl", "nodes": []}], tmp_path / "empty.png", "no node at all")
    assert (tmp_path / "empty.png").read_bytes()[:8] == PNG


def test_layout_places_leaves_in_order_and_parents_above_their_middle():
    nodes = [
        node("a", None, "prompt"),
        node("a.0", "a"),
        node("a.0.0", "a.0"),
        node("a.0.1", "a.0"),
        node("a.1", "a"),
        node("b", None, "prompt"),
        node("b.0", "b"),
    ]
    # leaves a.0.0, a.0.1, a.1 at x = 0, 1, 2; a.0 above (0 + 1) / 2; a above (0.5 + 2) / 2; the
    # next tree's leaf half a leaf further: 3.5
    assert draw.layout(nodes) == {
        "a.0.0": (0, 2),
        "a.0.1": (1, 2),
        "a.0": (0.5, 1),
        "a.1": (2, 1),
        "a": (1.25, 0),
        "b.0": (3.5, 1),
        "b": (3.5, 0),
    }


def test_large_panels_are_simplified_and_say_so(tmp_path):
    # 8 chains of 20 search steps of one credit, then an answer: each run of 20 becomes one "x20"
    chains = [node("p", None, "prompt")]
    for c in range(8):
        ids = [f"p.{c}" + ".0" * d for d in range(21)]
        chains += [node(ids[0], "p", credit=0.5)]
        chains += [node(ids[d], ids[d - 1], credit=0.5) for d in range(1, 20)]
        chains += [node(ids[20], ids[19], "answer", credit=0.5, reward=1.0)]
    assert len(chains) == 1 + 8 * 21
    drawn, note = draw.simplify(chains)
    # the root, then per chain the merged run (19 steps folded into its first) and the leaf
    leaf_0 = "p.0" + ".0" * 20
    assert [(n["id"], n["count"]) for n in drawn[:3]] == [("p", 1), ("p.0", 20), (leaf_0, 1)]
    assert len(drawn) == 1 + 8 * 2 and drawn[2]["parent"] == "p.0"
    assert note == "152 single-child steps merged into the step above (xk: k steps)"  # 8 * 19
    # a step with another credit, or a mark, is not merged: chain 0 becomes p.0 | p.0.0 (credit
    # -0.5) | 18 merged | leaf, chain 1 a run of 8 | the marked step | 11 merged | leaf
    chains[2]["credit"] = -0.5
    chains[22 + 8]["marks"] = ["redundant"]  # chain 1 starts at 22: p.1, then p.1.0 ... at depth 9
    drawn = draw.simplify(chains)[0]
    assert len(drawn) == 1 + 8 * 2 + 2 + 2
    assert [n["count"] for n in drawn[1:9]] == [1, 1, 18, 1, 8, 1, 11, 1]
    # 300 leaves under the root: the root and the first 119 leaves fit in 120 nodes
    wide = [node("w", None, "prompt")]
    wide += [node(f"w.{i}", "w", "answer", credit=0.1, reward=1.0) for i in range(300)]
    drawn, note = draw.simplify(wide)
    assert len(drawn) == draw.MAX_NODES and note == "only the first 119 of 300 leaves drawn"
    draw.figure(
        [{"algo": "treeps", "nodes": chains}, {"algo": "grpo", "nodes": wide}],
        tmp_path / "big.png",
        "big",
    )
    assert (tmp_path / "big.png").read_bytes()[:8] == PNG


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="node 'p.0' names parent 'p', which is not listed before"):
        draw.layout([node("p.0", "p"), node("p", None, "prompt")])
    with pytest.raises(ValueError, match=r"no panel style for \['ppo'\]"):
        draw.figure([{"algo": "ppo", "nodes": []}], tmp_path / "x.png", "")
    with pytest.raises(ValueError, match="node 'p' has kind 'thought'"):
        draw.figure(
            [{"algo": "grpo", "nodes": [node("p", None, "thought")]}], tmp_path / "x.png", ""
        )
