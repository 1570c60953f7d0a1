"""benchmarks/credit_truth.py: the Monte Carlo ground truth recovers A* where V is known exactly,
each credit's statistics on a hand-built tree match the arithmetic written below, and --report
writes the table again byte for byte."""

import json
import random
import subprocess
import sys

import pytest
from test_rollout import EX, TOK, MemoryRetriever

from benchmarks.compare_arms import MATCHED, algo_config
from benchmarks.credit_truth import OWN, SHARED, credits, step_rows
from benchmarks.credit_truth_report import measures, report_file, write
from infra.engines import Completion
from rollout import ALGOS, Agent, AgentConfig, RolloutConfig, tree_grpo
from tree import Tree, walk

# ---- (a) a world whose values are written by hand --------------------------------------------
# The first step searches "ab" or "zz" with probability 1/2 each; after the "ab" passages the
# answer is right (Ivo, reward 1) with probability 0.8, after the "zz" ones with 0.2. So
#   V(prompt) = 0.5 * 0.8 + 0.5 * 0.2 = 0.5, V(after "ab") = 0.8, V(after "zz") = 0.2,
#   A*(search ab) = 0.8 - 0.5 = +0.3, A*(search zz) = -0.3,
#   A*(answer) = its reward - V(after its search): Ivo after ab +0.2, Oda after ab -0.8,
#   Ivo after zz +0.8, Oda after zz -0.2.
P_RIGHT = {"about ab": 0.8, "about zz": 0.2}


class CoinEngine:
    """Samples each row's step from the probabilities above, seeded by the call's seed."""

    def generate(self, prompts, sampling):
        rng, outs = random.Random(sampling.seed), []
        for ids in prompts:
            ctx = TOK.decode(ids)
            seen = [k for k in P_RIGHT if k in ctx]
            if not seen:
                text = "<search>ab</search>" if rng.random() < 0.5 else "<search>zz</search>"
            else:
                right = rng.random() < P_RIGHT[seen[0]]
                text = f"<answer>{'Ivo' if right else 'Oda'}</answer>"
            tokens = TOK.encode(text)
            outs.append(Completion(tokens, [-0.7] * len(tokens), "stop"))
        return outs


def true_a_star(step) -> float:
    if step.action == "search":
        return {"ab": +0.3, "zz": -0.3}[step.query]
    v_before = P_RIGHT["about " + step.parent.query]
    return step.reward - v_before


def test_ground_truth_recovers_the_hand_written_advantages_within_4_se():
    cfg = AgentConfig(topk=1, max_obs_tokens=40)
    agent = Agent(CoinEngine(), MemoryRetriever(), TOK, cfg, seed=0)
    [trees] = tree_grpo(agent, [EX], random.Random(0), RolloutConfig(tree_M=2, tree_N=1))
    shape = lambda: [(n.id, n.n_sampled, dict(t.stats)) for t in trees for n in walk(t.root)]
    before = shape()
    truth = Agent(CoinEngine(), MemoryRetriever(), TOK, cfg, seed=1)
    K = 200
    rows = step_rows(truth, [("shared", 0, trees, list(SHARED))], K)
    assert shape() == before  # the continuations removed, the counts restored
    steps = {n.id: n for t in trees for n in walk(t.root)}
    assert len(rows) == len(steps) - 2  # every step is trained by some credit (2 roots)
    for r in rows:
        want = true_a_star(steps[r["id"]])
        # SE: sqrt(p (1 - p) / K) per estimated V; A* of a search step: two of them
        assert 0.02 < r["se"] < 0.06, r
        assert abs(r["a_star"] - want) < 4 * r["se"], (r, want)
        assert r["a_star"] == r["v_after"] - r["v_before"]


# ---- (b) a hand-built tree with A* given -----------------------------------------------------
#   q ─ q.0 search ─ q.0.0 answer r=1
#     │            └ q.0.1 answer r=0
#     └ q.1 search ─ q.1.0 answer r=0
# Steps in the order [q.0, q.0.0, q.0.1, q.1, q.1.0]; A* given = [+0.3, +0.5, -0.5, -0.3, -0.1],
# ranks [4, 5, 1, 2, 3].
IDS = ["q.0", "q.0.0", "q.0.1", "q.1", "q.1.0"]
A_STAR = [0.3, 0.5, -0.5, -0.3, -0.1]
HALVES = [[0.2, 0.4], [0.6, 0.4], [-0.4, -0.6], [-0.2, -0.4], [0.0, -0.2]]


def hand_tree() -> Tree:
    answer = lambda i, r: {"id": i, "action": "answer", "reward": r}
    return Tree.from_dict(
        {
            "id": "q",
            "children": [
                {
                    "id": "q.0",
                    "action": "search",
                    "children": [answer("q.0.0", 1.0), answer("q.0.1", 0.0)],
                },
                {"id": "q.1", "action": "search", "children": [answer("q.1.0", 0.0)]},
            ],
        }
    )


def hand_rows() -> list[dict]:
    got = credits([hand_tree()], list(SHARED))
    return [
        {
            "set": "shared",
            "prompt": 0,
            "id": i,
            "depth": i.count("."),
            "a_star": a,
            "se": 0.1,  # |A*| > 2 SE on all but q.1.0
            "halves": h,
            "credit": {name: c.get(i, 0.0) for name, c in got.items()},
        }
        for i, a, h in zip(IDS, A_STAR, HALVES)
    ]


def test_each_credits_rank_correlation_on_a_hand_built_tree():
    rows = hand_rows()
    credit = lambda name: pytest.approx([r["credit"][name] for r in rows], abs=1e-4)
    assert "BranPO" not in rows[0]["credit"]  # no prefix_end marks
    # GRPO on the 3 paths as chains: rewards [1, 0, 0], mean 1/3, std sqrt(1/3): A = +1.1547 on
    # q.0.0's path, -0.5774 on the others; q.0 sums two chains: 1.1547 - 0.5774 = +0.5774.
    assert [0.5774, 1.1547, -0.5774, -0.5774, -0.5774] == credit("GRPO")
    # ranks [4, 5, 2, 2, 2] against [4, 5, 1, 2, 3]: deviations from 3 (1, 2, -1, -1, -1) and
    # (1, 2, -2, -1, 0): rho = 8 / sqrt(8 * 10) = 0.8944
    want = 8 / (8 * 10) ** 0.5
    for name in ("GRPO", "Tree-GRPO", "Tree-GRPO intra", "Tree-GRPO inter"):  # one tree: x1 or x2
        assert abs(measures(rows, name)["all"] - want) < 1e-9, name
    # CARL: V = 1, 0, 0 on the leaves, 0.5 on q.0, 0 on q.1, 0.25 at the root; the forked actions
    # V(child) - V(state): q.0 +0.25, q.1 -0.25, q.0.0 +0.5, q.0.1 -0.5; q.1.0 (single child) 0
    assert [0.25, 0.5, -0.5, -0.25, 0.0] == credit("CARL")
    # TreePS: V(root) 1/3; A(q.0) = (1 - 2/3) / sqrt 2 in 2 paths: 0.4714; A(q.1) = -2/3;
    # A(q.0.0) = 2 - 1/3 - 1/2, A(q.0.1) = -1/3 - 1/2, A(q.1.0) = -1/3
    assert [0.4714, 1.1667, -0.8333, -0.6667, -0.3333] == credit("TreePS")
    for name in ("CARL", "TreePS"):  # ranks [4, 5, 1, 2, 3]: A*'s own
        m = measures(rows, name)
        assert abs(m["all"] - 1) < 1e-9 and m["sign"] == 1 and m["zero"] == 0
    # by depth: depth 1 (q.0, q.1) has 2 steps, depth 2 three: CARL [0.5, -0.5, 0] vs [0.5, -0.5,
    # -0.1] has ranks [3, 1, 2] and [3, 1, 2]: rho 1
    assert measures(rows, "CARL")["depth 2"] == 1
    assert measures(rows, "CARL")["depth 1"] != measures(rows, "CARL")["depth 1"]  # n < 3: NaN
    # noise ceiling: halves' ranks [4, 5, 1, 2, 3] and [4.5, 4.5, 1, 2, 3]: deviations (1, 2, -2,
    # -1, 0) and (1.5, 1.5, -2, -1, 0): rho = 9.5 / sqrt(10 * 9.5) = 0.9747
    assert abs(measures(rows, None)["all"] - 9.5 / (10 * 9.5) ** 0.5) < 1e-9
    # zero credit where A* != 0: Tree-GRPO intra on a single tree is GRPO, never 0 there
    assert measures(rows, "GRPO")["zero"] == 0


def test_own_trees_every_strategy_at_its_matched_budget_with_its_own_credit():
    # --own: each strategy of the registry grows at the comparison's matched budget and is scored
    # with the credit it trains with; ARPO's soft credit (its default) is Tree-GRPO's inter
    assert set(OWN) == set(ALGOS) == set(MATCHED)
    for algo, name in OWN.items():
        assert algo_config(MATCHED[algo])[0].algo == algo
        credit, cfg = SHARED[name]
        assert (credit, cfg.tree_mode) == (
            ("tree_grpo", "inter") if algo == "arpo" else (algo, cfg.tree_mode)
        )


def test_report_writes_the_table_again_byte_for_byte(tmp_path):
    rows = hand_rows()
    rows += [dict(r, prompt=1, a_star=-r["a_star"]) for r in rows]  # two prompts to resample
    stored = {
        "args": {"prompts": 2, "K": 4, "bootstrap": 50},
        "matched": {"shared": "Tree-GRPO (2,1,1)"},
        "model": "hand-built",
        "seed": 0,
        "commit": "abc",
        "wall_s": 1,
        "steps": rows,
    }
    write(str(tmp_path / "run"), stored)
    report_file(str(tmp_path / "run" / "results.json"), str(tmp_path / "again"))
    first, again = (tmp_path / d / "results.md" for d in ("run", "again"))
    assert first.read_bytes() == again.read_bytes()
    assert "| CARL (8 with credit) | shared: Tree-GRPO (2,1,1) | 10 |" in first.read_text()
    assert (tmp_path / "again" / "credit_truth.png").stat().st_size > 0


def test_the_script_runs_end_to_end_with_a_tiny_budget(env, tmp_path):
    flags = f"--model {env / 'tiny'} --out_dir {env / 'out'} --max_turns 1 --max_step_tokens 8"
    done = subprocess.run(
        [sys.executable, "benchmarks/credit_truth.py", "--prompts", "2", "--K", "2"]
        + ["--bootstrap", "20", "--out", str(tmp_path), f"--train_flags={flags}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["args"]["K"] == 2 and {s["prompt"] for s in stored["steps"]} <= {0, 1}
    assert (tmp_path / "results.md").read_text().startswith("Credit against Monte Carlo truth")
