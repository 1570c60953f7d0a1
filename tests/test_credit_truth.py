"""benchmarks/credit_truth.py: the Monte Carlo ground truth recovers A* where V is known exactly,
each credit's statistics on hand-built trees and pairs match the arithmetic written below (sibling
ranking accuracy, its ties and its boundary, rho, Kendall's tau), --report writes the tables
again byte for byte, and the committed run's tables and worked example are its JSON's."""

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_rollout import EX, TOK, MemoryRetriever

from benchmarks.compare_arms import MATCHED, algo_config
from benchmarks.credit_truth import GAIN, ONLY_OWN, OWN, SHARED, credits, mean_se, step_rows
from benchmarks.credit_truth_report import (
    CEILING,
    FLOOR,
    REFERENCES,
    columns,
    kendall,
    measures,
    render,
    report_file,
    sibling_pairs,
    tables,
    taus,
    with_intervals,
    worked_example,
    write,
)
from infra.engines import Completion
from rollout import ALGOS, Agent, AgentConfig, RolloutConfig, tree_grpo
from tree import Tree, walk

DOCS = Path(__file__).resolve().parent.parent / "docs"

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

    def score(self, prompts, continuations):
        """IGPO's P(gold) after a context: here, the chance of answering right from it, its value
        (0.5 at the prompt), spread evenly over the gold's tokens."""
        out = []
        for ids, gold in zip(prompts, continuations):
            seen = [k for k in P_RIGHT if k in TOK.decode(ids)]
            out.append([math.log(P_RIGHT[seen[0]] if seen else 0.5)] * len(gold))
        return out


def true_a_star(step) -> float:
    if step.action == "search":
        return {"ab": +0.3, "zz": -0.3}[step.query]
    v_before = P_RIGHT["about " + step.parent.query]
    return step.reward - v_before


def test_ground_truth_and_vineppo_recover_the_hand_written_advantages_within_4_se():
    cfg = AgentConfig(topk=1, max_obs_tokens=40)
    agent = Agent(CoinEngine(), MemoryRetriever(), TOK, cfg, seed=0)
    [trees] = tree_grpo(agent, [EX], random.Random(0), RolloutConfig(tree_M=2, tree_N=1))
    agent.believe(trees)  # IGPO's P(gold) on the inner nodes: this world's V
    shape = lambda: [(n.id, n.n_sampled, dict(t.stats)) for t in trees for n in walk(t.root)]
    before = shape()
    truth, vine = (Agent(CoinEngine(), MemoryRetriever(), TOK, cfg, seed=s) for s in (1, 2))
    K = 200
    names = [*SHARED, GAIN, *REFERENCES]
    rows = step_rows((truth, vine), random.Random(0), [("shared", 0, trees, names)], K, K)
    assert shape() == before  # the continuations removed, the counts restored
    steps = {n.id: n for t in trees for n in walk(t.root)}
    assert len(rows) == len(steps) - 2  # every step is trained by some credit (2 roots)
    for r in rows:
        want = true_a_star(steps[r["id"]])
        # SE: sqrt(p (1 - p) / K) per estimated V; A* of a search step: two of them
        assert 0.02 < r["se"] < 0.06, r
        assert abs(r["a_star"] - want) < 4 * r["se"], (r, want)
        assert r["a_star"] == r["v_after"] - r["v_before"]
        # VinePPO's row (the registry's credit): the same A*, from K continuations of its own
        assert abs(r["credit"][CEILING] - want) < 4 * r["se"], (r, want)
        assert len(r["k_after"]) == (0 if steps[r["id"]].ended else K)
        # IGPO's information gain, read as a value (P after an answer: its reward), where the gold
        # probability is the value: A* exactly, e.g. search ab 0.8 - 0.5, answer Oda 0 - 0.8
        assert r["credit"][GAIN] == pytest.approx(want, abs=1e-12), (r, want)
    # the M = 2 trees' first steps are siblings: taken from the one context, the prompt
    first = [r for r in rows if r["depth"] == 1]
    assert len(first) >= 2 and len({r["from"] for r in first}) == 1


def test_k_equal_rewards_are_no_exact_value():
    # 16 zeros: variance 0, but never below p (1 - p) at p = (0 + 1/2) / 17 = 1/34:
    # SE = sqrt(1/34 x 33/34 / 16) = 0.0422, not 0 (mean_se's floor)
    assert mean_se([0.0] * 16) == (0.0, pytest.approx(math.sqrt(33 / 34**2 / 16)))
    # 8 ones and 8 zeros: the unbiased variance 16/15 x 1/4 = 0.2667 is above p (1 - p) = 1/4 at
    # p = 8.5 / 17: SE = sqrt(0.2667 / 16) = 0.1291, the sample's own
    assert mean_se([1.0, 0.0] * 8) == (0.5, pytest.approx(math.sqrt(4 / 15 / 16)))


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
    """The tree above, with IGPO's P(gold) 0.4 at the prompt, 0.7 after q.0, 0.1 after q.1."""
    answer = lambda i, r: {"id": i, "action": "answer", "reward": r}
    return Tree.from_dict(
        {
            "id": "q",
            "gold_logp": math.log(0.4),
            "children": [
                {
                    "id": "q.0",
                    "action": "search",
                    "gold_logp": math.log(0.7),
                    "children": [answer("q.0.0", 1.0), answer("q.0.1", 0.0)],
                },
                {
                    "id": "q.1",
                    "action": "search",
                    "gold_logp": math.log(0.1),
                    "children": [answer("q.1.0", 0.0)],
                },
            ],
        }
    )


def step(i, a_star, se_after, credit, prompt=0, draw=0, parent=None, **more) -> dict:
    """A result row as credit_truth.py writes it; `parent`: the context it is taken from (default:
    its parent node's id)."""
    return {
        "policy": "warm start",
        "draw": draw,
        "set": "shared",
        "prompt": prompt,
        "id": i,
        "step": f"step {i}",
        "from": parent or i.rsplit(".", 1)[0],
        "depth": i.count("."),
        "v_before": 0.0,
        "v_after": a_star,
        "a_star": a_star,
        "se": se_after,
        "se_after": se_after,
        "halves": [a_star, a_star],
        "k_after": [],
        "credit": credit,
    } | more


def hand_rows() -> list[dict]:
    got = credits([hand_tree()], list(SHARED))
    # SE of V(s'): 0.05 for the searches, 0 for the answers (their reward is exact); SE(A*) 0.1
    return [
        step(i, a, 0.05 if i in ("q.0", "q.1") else 0.0, {n: c.get(i, 0.0) for n, c in got.items()})
        | {"se": 0.1, "halves": h}  # |A*| > 2 SE on all but q.1.0
        for i, a, h in zip(IDS, A_STAR, HALVES)
    ]


def point(rows: list[dict], name: str | None = None) -> dict:
    """measures() of credit `name` on `rows` as they are (no resampling)."""
    c = columns(rows, list(rows[0]["credit"]))
    got = measures(c, np.ones(c["units"], int))
    return {k: v if k == "ceiling" else v[c["names"].index(name)] for k, v in got.items()}


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
        assert abs(point(rows, name)["rho"] - want) < 1e-9, name
    # CARL: V = 1, 0, 0 on the leaves, 0.5 on q.0, 0 on q.1, 0.25 at the root; the forked actions
    # V(child) - V(state): q.0 +0.25, q.1 -0.25, q.0.0 +0.5, q.0.1 -0.5; q.1.0 (single child) 0
    assert [0.25, 0.5, -0.5, -0.25, 0.0] == credit("CARL")
    # TreePS: V(root) 1/3; A(q.0) = (1 - 2/3) / sqrt 2 in 2 paths: 0.4714; A(q.1) = -2/3;
    # A(q.0.0) = 2 - 1/3 - 1/2, A(q.0.1) = -1/3 - 1/2, A(q.1.0) = -1/3
    assert [0.4714, 1.1667, -0.8333, -0.6667, -0.3333] == credit("TreePS")
    for name in ("CARL", "TreePS"):  # ranks [4, 5, 1, 2, 3]: A*'s own
        m = point(rows, name)
        assert abs(m["rho"] - 1) < 1e-9 and m["zero"] == 0
    # noise ceiling: halves' ranks [4, 5, 1, 2, 3] and [4.5, 4.5, 1, 2, 3]: deviations (1, 2, -2,
    # -1, 0) and (1.5, 1.5, -2, -1, 0): rho = 9.5 / sqrt(10 * 9.5) = 0.9747
    assert abs(point(rows, "GRPO")["ceiling"] - 9.5 / (10 * 9.5) ** 0.5) < 1e-9
    # zero credit where |A*| > 2 SE (4 steps: all but q.1.0): GRPO never 0 there
    assert point(rows, "GRPO")["zero"] == 0
    # siblings: q.0 / q.1 (A* +0.3 / -0.3: 0.6 > 2 sqrt(0.05² + 0.05²) = 0.141) and q.0.0 / q.0.1
    # (+0.5 / -0.5, ended: 1.0 > 0): two separated pairs, every credit above orders both right
    assert [(b["id"], w["id"]) for b, w in sibling_pairs(rows)] == [
        ("q.0", "q.1"),
        ("q.0.0", "q.0.1"),
    ]
    for name in ("GRPO", "Tree-GRPO", "CARL", "TreePS"):
        assert point(rows, name)["sibling"] == 1 and point(rows, name)["ties"] == 0


# ---- (c) sibling ranking accuracy on hand pairs ------------------------------------------------


def test_sibling_accuracy_a_tie_counts_one_half():
    # s.0 / s.1: answers (SE 0) with A* +0.5 / -0.5: |1.0| > 2 x 0 -> separated, s.0 the better.
    # s.2 / s.3 (another context, t): the same, A* +0.4 / -0.2.
    # credit X: s.0 = s.1 = 0 (neither trained): a tie, 1/2; s.2 +1 > s.3 -1: right, 1.
    # accuracy (1/2 + 1) / 2 = 0.75; ties 1 of 2 pairs = 0.5
    rows = [
        step("s.0", 0.5, 0.0, {"X": 0.0}),
        step("s.1", -0.5, 0.0, {"X": 0.0}),
        step("t.2", 0.4, 0.0, {"X": 1.0}),
        step("t.3", -0.2, 0.0, {"X": -1.0}),
    ]
    m = point(rows, "X")
    assert (m["pairs"], m["sibling"], m["ties"]) == (2, 0.75, 0.5)


def test_sibling_accuracy_without_a_separated_pair_is_undefined():
    # s.0 / s.1: A* +0.1 / -0.1, SE 0.1 each: |0.2| < 2 sqrt(0.1² + 0.1²) = 0.283: not separated.
    # u.0 (A* +1, SE 0) and s.2 (A* -1, SE 0) are far apart but taken from different contexts
    # (u, s): no siblings. So no pair: the accuracy is NaN, shown as n/a, never 0.5.
    rows = [
        step("s.0", 0.1, 0.1, {"X": 1.0}),
        step("s.1", -0.1, 0.1, {"X": -1.0}),
        step("u.0", 1.0, 0.0, {"X": 1.0}),
        step("s.2", -1.0, 0.0, {"X": -1.0}, prompt=1),  # context s of another prompt
    ]
    assert sibling_pairs(rows) == []
    m = point(rows, "X")
    assert m["pairs"] == 0 and math.isnan(m["sibling"]) and math.isnan(m["ties"])


def test_sibling_accuracy_of_one_pair_ordered_wrong_is_0():
    # s.0 / s.1: A* +0.3 / -0.3, SE 0.05 each: 0.6 > 2 sqrt(0.05² + 0.05²) = 0.141: separated.
    # credit X gives s.0 -1 < s.1 +1: wrong, 0; credit Y +0.2 > -0.7: right, 1.
    rows = [
        step("s.0", 0.3, 0.05, {"X": -1.0, "Y": 0.2}),
        step("s.1", -0.3, 0.05, {"X": 1.0, "Y": -0.7}),
    ]
    assert [(b["id"], w["id"]) for b, w in sibling_pairs(rows)] == [("s.0", "s.1")]
    assert (point(rows, "X")["sibling"], point(rows, "Y")["sibling"]) == (0, 1)


def test_a_pair_exactly_2_se_apart_is_not_separated():
    # SE 0.375 and 0.5: combined sqrt(0.375² + 0.5²) = 0.625 (a 3-4-5 triangle, exact in binary);
    # A* +0.75 and -0.5 differ by 1.25 = 2 x 0.625: not MORE than 2 SE, so not a pair ('>' is
    # strict). Moved 2^-10 further apart, it is one.
    at = lambda a: [step("s.0", a, 0.375, {"X": 1.0}), step("s.1", -0.5, 0.5, {"X": 0.0})]
    assert sibling_pairs(at(0.75)) == []
    assert len(sibling_pairs(at(0.75 + 2**-10))) == 1


def test_random_credit_scores_chance_on_a_large_synthetic_case():
    # 200 prompts, each with one context of 5 answers (SE 0) whose A* are 5 distinct values: 10
    # separated pairs a prompt, 2000 in all; a credit drawn N(0, 1) per step orders each pair right
    # with probability 1/2: its accuracy is 0.5 within the interval, which holds 0.5
    rng = random.Random(0)
    rows = [
        step(f"p{p}.{k}", a, 0.0, {FLOOR: rng.gauss(0, 1)}, prompt=p, parent=f"p{p}")
        for p in range(200)
        for k, a in enumerate([0.0, 0.25, 0.5, 0.75, 1.0])
    ]
    c = columns(rows, [FLOOR])
    m = with_intervals(c, 200)[FLOOR]
    value, low, high = m["sibling"]
    assert m["pairs"][0] == 2000 and m["ties"][0] == 0
    assert abs(value - 0.5) < 0.04 and low < 0.5 < high and high - low < 0.1


def test_kendall_tau_of_the_methods_rankings_on_a_tiny_hand_case():
    # tau-b over the pairs of 3 credits: (0.9 vs 0.7, 0.8 vs 0.5) concordant, (0.9 vs 0.6, 0.8 vs
    # 0.6) concordant, (0.7 vs 0.6, 0.5 vs 0.6) discordant: (2 - 1) / 3
    assert abs(kendall([0.9, 0.7, 0.6], [0.8, 0.5, 0.6]) - 1 / 3) < 1e-12
    # the same through the report: draws 0 and 1, one separated pair (a.0 better than a.1) each;
    # credit (a.0, a.1): A (1, 0) right in both; B (0, 0) a tie in draw 0, (0, 1) wrong in draw 1;
    # C (0, 1) wrong, then (0, 0) a tie. Accuracies A 1, B 0.5, C 0 and A 1, B 0, C 0.5: tau 1/3.
    # The random row (right in draw 0, wrong in draw 1) is left out: with it, tau-b would be 0
    # ((A,B) +, (A,C) +, (B,C) -, (A,F) -, (B,F) +, (C,F) -).
    credit = [
        ({"A": 1.0, "B": 0.0, "C": 0.0, FLOOR: 1.0}, {"A": 0.0, "B": 0.0, "C": 1.0, FLOOR: 0.0}),
        ({"A": 1.0, "B": 0.0, "C": 0.0, FLOOR: 0.0}, {"A": 0.0, "B": 1.0, "C": 0.0, FLOOR: 1.0}),
    ]
    rows = [step(f"a.{k}", 1.0 - k, 0.0, credit[d][k], draw=d) for d in (0, 1) for k in (0, 1)]
    stored = {"policies": {"warm start": ""}, "sets": {"shared": "hand"}, "steps": rows}
    labels, tau = taus(stored)
    assert labels == ["warm start 0", "warm start 1"]
    assert abs(tau[0, 1] - 1 / 3) < 1e-12 and tau[0, 0] == 1


def stored_hand(tmp_path=None) -> dict:
    rows = hand_rows()
    rows += [dict(r, prompt=1, a_star=-r["a_star"]) for r in rows]  # two prompts to resample
    rows = [dict(r, credit=r["credit"] | {FLOOR: 0.0, CEILING: r["a_star"]}) for r in rows]
    return {
        "args": {"prompts": 2, "draws": 1, "K": 4, "bootstrap": 50, "quick": False},
        "sets": {"shared": "Tree-GRPO (2,1,1)"},
        "policies": {"warm start": "hand-built"},
        "seed": 0,
        "commit": "abc",
        "wall_s": 1,
        "steps": rows,
    }


def test_own_trees_every_strategy_at_its_matched_budget_with_its_own_credit():
    # --own: each strategy of the registry grows at the comparison's matched budget and is scored
    # with the credit it trains with; ARPO's soft credit (its default) is Tree-GRPO's inter
    assert set(OWN) == set(ALGOS) == set(MATCHED)
    for algo, name in OWN.items():
        assert algo_config(MATCHED[algo])[0].algo == algo
        credit, cfg = (SHARED | ONLY_OWN)[name]
        assert (credit, cfg.tree_mode) == (
            ("tree_grpo", "inter") if algo == "arpo" else (algo, cfg.tree_mode)
        )


def test_report_writes_the_table_again_byte_for_byte(tmp_path):
    write(str(tmp_path / "run"), stored_hand())
    report_file(str(tmp_path / "run" / "results.json"), str(tmp_path / "again"))
    first, again = (tmp_path / d / "results.md" for d in ("run", "again"))
    assert first.read_bytes() == again.read_bytes()
    text = first.read_text()
    # two prompts, each with two separated pairs; CARL orders prompt 0's two as A* does and
    # prompt 1's (A* negated, the credit not) the other way: (1 + 1 + 0 + 0) / 4
    assert "| CARL | shared: Tree-GRPO (2,1,1) | 4 | 0.50 [" in text
    assert "| | warm start 0 |" in text  # the tau table of the one draw
    assert (tmp_path / "again" / "credit_truth.png").stat().st_size > 0


def test_the_committed_run_gives_its_tables_and_worked_example_byte_for_byte():
    # docs/credit_truth.md is results.md of docs/credit_truth.json; docs/credit.md quotes its
    # worked example (one branch point, both siblings' continuations and every credit)
    stored = json.loads((DOCS / "credit_truth.json").read_text())
    text = render(stored, tables(stored)) + "\n"
    assert (DOCS / "credit_truth.md").read_text() == text
    example = worked_example(stored)
    assert example.strip() and example.strip() in (DOCS / "credit.md").read_text()


def test_the_script_runs_end_to_end_with_a_tiny_budget_and_any_jobs_gives_the_same_rows(
    env, tmp_path
):
    flags = f"--out_dir {env / 'out'} --max_turns 1 --max_step_tokens 8"
    policy = ["--warm_start", str(env / "tiny"), "--trained", str(env / "tiny")]
    runs = {}
    for jobs in (2, 1):  # the two policies in two spawned processes, then one after the other
        done = subprocess.run(
            [sys.executable, "benchmarks/credit_truth.py", "--prompts", "2", "--K", "2"]
            + ["--draws", "2", "--bootstrap", "20", "--jobs", str(jobs)]
            + ["--out", str(tmp_path / f"jobs{jobs}")]
            + policy
            + [f"--train_flags={flags}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[jobs] = json.loads((tmp_path / f"jobs{jobs}" / "results.json").read_text())
    assert runs[1]["steps"] == runs[2]["steps"]  # every sampling call is seeded
    stored, tmp_path = runs[2], tmp_path / "jobs2"
    assert stored["args"]["K"] == 2 and {s["prompt"] for s in stored["steps"]} <= {0, 1}
    assert list(stored["policies"]) == ["warm start", "RL-trained"]
    assert {(s["policy"], s["draw"]) for s in stored["steps"]} == {
        (p, d) for p in ("warm start", "RL-trained") for d in (0, 1)
    }
    assert (tmp_path / "results.md").read_text().startswith("Credit against Monte Carlo truth")


def test_a_killed_runs_spawned_workers_end_with_it(env, tmp_path):
    # SIGKILL of the run (no cleanup of its own) takes its --jobs workers down: each watches its
    # parent (credit_truth.exit_with_parent) instead of measuring on, unseen
    import signal
    import time

    import psutil

    flags = f"--out_dir {env / 'out'} --max_turns 1 --max_step_tokens 8"
    run = subprocess.Popen(
        [sys.executable, "benchmarks/credit_truth.py", "--prompts", "2", "--K", "2"]
        + ["--warm_start", str(env / "tiny"), "--trained", str(env / "tiny")]
        + ["--out", str(tmp_path), f"--train_flags={flags}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    parent, workers = psutil.Process(run.pid), []
    deadline = time.monotonic() + 120
    while len(workers) < 2 and time.monotonic() < deadline:  # the two policies' workers
        workers = [p for p in parent.children() if "spawn_main" in " ".join(p.cmdline())]
        time.sleep(0.5)
    assert len(workers) == 2, "the run did not start its two workers within 120 s"
    run.send_signal(signal.SIGKILL)
    run.wait()
    # a worker still importing its modules watches from when it is up: allow for a loaded machine
    gone, alive = psutil.wait_procs(workers, timeout=180)
    assert not alive, f"workers still running 180 s after their parent was killed: {alive}"
