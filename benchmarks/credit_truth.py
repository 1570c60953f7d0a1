"""Which credit is closest to the truth? Every method's per-step credit set against a Monte Carlo
estimate of the step's true advantage under the policy that grew the trees.

    python benchmarks/credit_truth.py            # the embedded default's warm start, ~16 min on 2
                                                 # cores: out/credit_truth (docs/credit_truth.md)
    python benchmarks/credit_truth.py --prompts 4 --K 8       # a smoke run, ~2 min
    python benchmarks/credit_truth.py --own      # also each method on the trees of its own strategy
    python benchmarks/credit_truth.py --train_flags="--model out/runs/tree_grpo-seed0/final"
    python benchmarks/credit_truth.py --report docs/credit_truth.json --out DIR
                                                 # its results.md again, byte for byte, and figure

For a step taken in context s that leads to s' (the step's tokens and its observation), the true
advantage under the policy is A*(step) = V(s') - V(s). V(context) is estimated by the mean outcome
reward of K continuations sampled from that context's exact token ids (TITO: the tree's own
nodes are continued, then the continuations removed), by the same agent, engine, sampling and
retriever that grew the trees; a step that ended has V(s') = its reward, no estimate needed. Nodes
share contexts (two trees of one prompt share the prompt), so each context is sampled once (keyed
by a hash of its ids). SE(A*) = sqrt(SE(V(s'))^2 + SE(V(s))^2), each the K rewards' std / sqrt(K).

One set of trees per prompt ("shared"), grown by --strategy at the comparison's matched budget
(benchmarks/compare_arms.py's MATCHED), is credited by every credit function that can read it:
GRPO (the trees' root-to-leaf paths copied into chains, as `python advantages.py --demo` does),
Tree-GRPO both / intra / inter (inter is ARPO's soft credit), CARL, TreePS-RAG, GiGPO (on the
chains, as GRPO), AT2PO, ARPO hard, TreePO, and BranPO where `prefix_end` marks exist (its own trees
only). This isolates credit from rollout. --own adds each method on its own strategy's
trees at the matched budget (rollout and credit together). A method's credit on a step is what its
tokens receive in the loss (`tree.step_credit`: the sum over the trajectories that train it).

The steps of a tree set are those some method trains there; a step a method does not train has
credit 0 in every statistic (the update leaves it where it is). Statistics (credit_truth_report.py):
Spearman's rho between credit and A*, overall and at depth 1, 2, 3+; over the steps whose A* is
more than 2 SE from 0, the share of zero credit and, among the others, the share whose credit has
A*'s sign; each with a 95% bootstrap interval over prompts. The noise ceiling: rho between the A*
estimates from the two halves of the K continuations.

Outputs in --out: results.json (every step: prompt, id, context hash, depth, V before and after,
A*, its SE and halves, each method's credit), results.md (the table, also printed) and
credit_truth.png (credit against A* per method; rho by depth).
"""

import hashlib
import math
import os
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import retriever  # noqa: E402  (the project's modules, from the repository root)
import rollout  # noqa: E402
from advantages import CreditConfig  # noqa: E402
from benchmarks.compare import parse_train  # noqa: E402
from benchmarks.compare_arms import MATCHED, algo_config, arm_name  # noqa: E402
from benchmarks.compare_report import commit  # noqa: E402
from benchmarks.credit_truth_report import report_file, write  # noqa: E402
from infra import data, engines, flags, loaders, policy  # noqa: E402
from rollout import Agent, Algorithm, RolloutConfig  # noqa: E402
from scripts import warmstart  # noqa: E402
from tree import Node, Tree, context_ids, path, scored_leaves, step_credit, walk  # noqa: E402


@dataclass
class Args:
    """What to measure; the policy, world, agent and retriever settings are train.py's."""

    prompts: int = 24
    """P: train questions (the first P in train.py's order for --seed)."""
    K: int = 16
    """Continuations sampled from every context to estimate its value."""
    strategy: Algorithm = "tree_grpo"
    """The rollout strategy that grows the shared trees, at its matched budget (MATCHED)."""
    own: bool = False
    """Also each method on the trees of its own strategy at the matched budget (~2.5x the time)."""
    bootstrap: int = 1000
    """Bootstrap resamples of the prompts, for every interval."""
    train_flags: str = ""
    """train.py flags (--model, --seed, --out_dir, agent and retriever settings), as
    --train_flags="..."; its algorithm knobs are MATCHED's."""
    out: str = "out/credit_truth"
    """Output directory: results.json, results.md, credit_truth.png."""
    report: str = ""
    """Instead: the table and figure again from a results.json, results.md byte for byte."""


# credit name -> (credit function in rollout.ALGOS, its options): every one that reads any tree
SHARED = {
    "GRPO": ("grpo", CreditConfig()),  # on the trees' paths copied into chains
    "Tree-GRPO": ("tree_grpo", CreditConfig()),
    "Tree-GRPO intra": ("tree_grpo", CreditConfig(tree_mode="intra")),
    "Tree-GRPO inter": ("tree_grpo", CreditConfig(tree_mode="inter")),
    "CARL": ("carl", CreditConfig()),
    "TreePS": ("treeps", CreditConfig()),
    "BranPO": ("branpo", CreditConfig()),  # where rollout.branpo marked the prefix ends
    "GiGPO": ("gigpo", CreditConfig()),  # on the chains, as GRPO; a node's copies share its state
    "AT2PO": ("at2po", CreditConfig()),
    "ARPO hard": ("arpo", CreditConfig(arpo_credit="hard")),  # ARPO soft: Tree-GRPO inter
    "TreePO": ("tree_grpo", CreditConfig(tree_mode="treepo")),
}
ON_CHAINS = ("grpo", "gigpo")  # the credits of GRPO chains: given the trees' paths as chains
OWN = {  # --own: the credit each strategy's trees are trained with
    "grpo": "GRPO",
    "tree_grpo": "Tree-GRPO",
    "branpo": "BranPO",
    "carl": "CARL",
    "treeps": "TreePS",
    "gigpo": "GiGPO",
    "at2po": "AT2PO",
    "arpo": "Tree-GRPO inter",  # ARPO's soft credit (its default) is Tree-GRPO's inter
}
GROUP_ROWS = 512  # continuations sampled together (one agent.run): prompts are grouped to ~this
HF_BATCH = 256  # rows per HF generate call (train.py's engine: 32); larger, the same distribution


def as_chains(trees: list[Tree]) -> list[Tree]:
    """Each root-to-leaf path of `trees` copied into a chain of its own (ids kept, so that
    `step_credit` adds up the chains through a step), as scripts/credit.py's demo does."""
    chains = []
    for t in trees:
        for leaf in scored_leaves(t.root):
            chain = Tree.from_dict(t.to_dict())
            for step in path(chain.find(leaf.id)):
                step.parent.children = [step]  # prune the copy to the root-to-leaf path
            chains.append(chain)
    return chains


def credits(trees: list[Tree], names: list[str]) -> dict[str, dict[str, float]]:
    """Credit name (of SHARED) -> node id -> the credit its tokens receive (`tree.step_credit`),
    for one prompt's trees; BranPO only where they carry its `prefix_end` marks."""
    marked = any(n.prefix_end for t in trees for n in walk(t.root))
    out = {}
    for name in names:
        algo, cfg = SHARED[name]
        if algo == "branpo" and not marked:
            continue
        chains = as_chains(trees) if algo in ON_CHAINS else trees
        out[name] = step_credit(rollout.ALGOS[algo].credit(chains, cfg))
    return out


def context_key(node: Node) -> str:
    """sha256 of the exact token ids the model sees after `node` (TITO)."""
    return hashlib.sha256(" ".join(map(str, context_ids(node))).encode()).hexdigest()


def continue_from(agent: Agent, jobs: list[tuple[Tree, Node]], K: int) -> dict[str, list[float]]:
    """Context hash -> the rewards of K continuations sampled from each distinct context of `jobs`
    (open nodes), all in one `agent.run`; the scored ones only (a retrieval error is discarded).
    The trees are left as they were: the continuations are removed, the nodes' `n_sampled` and the
    trees' `stats` restored."""
    todo: dict[str, tuple[Tree, Node]] = {}
    for t, n in jobs:
        todo.setdefault(context_key(n), (t, n))
    nodes = [(n, list(n.children), n.n_sampled) for _, n in todo.values()]
    stats = {id(t): (t, Counter(t.stats)) for t, _ in todo.values()}
    ends = agent.run([job for job in todo.values() for _ in range(K)])
    for n, children, n_sampled in nodes:
        n.children, n.n_sampled = children, n_sampled
    for t, saved in stats.values():
        t.stats = saved
    return {
        key: [e.reward for e in ends[i * K : (i + 1) * K] if e.scored] for i, key in enumerate(todo)
    }


def mean_se(rewards: list[float]) -> tuple[float, float]:
    n = len(rewards)
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


def value(node: Node, sampled: dict[str, list[float]]) -> tuple[list[float], float, float] | None:
    """V(context after `node`): (its estimate's halves, the estimate, its SE): a reward for a step
    that ended, else from `sampled`; None when no continuation was scored."""
    if node.ended:
        return None if node.reward is None else ([node.reward] * 2, node.reward, 0.0)
    rewards = sampled[context_key(node)]
    if not rewards:
        return None
    half = len(rewards) // 2 or 1
    halves = [mean_se(rewards[:half])[0], mean_se(rewards[half:] or rewards)[0]]
    return (halves, *mean_se(rewards))


def step_rows(agent: Agent, group: list[tuple[str, int, list[Tree], list[str]]], K: int):
    """One row per step that some credit of `names` trains in each (tree set, prompt, trees,
    names) of `group`: its A* from K continuations of every context involved (one `agent.run` for
    the whole group), and each credit's value there (0: not trained)."""
    plans, jobs = [], []
    for tree_set, prompt, trees, names in group:
        got = credits(trees, names)
        trained = {i for c in got.values() for i in c}
        steps = [n for t in trees for n in walk(t.root) if n.id in trained]
        plans.append((tree_set, prompt, got, steps))
        jobs += [(t, n) for t in trees for n in walk(t.root) if n.children and _needed(n, steps)]
    sampled = continue_from(agent, jobs, K)
    rows = []
    for tree_set, prompt, got, steps in plans:
        for s in steps:
            before, after = value(s.parent, sampled), value(s, sampled)
            if before is None or after is None:
                continue
            rows.append(
                {
                    "set": tree_set,
                    "prompt": prompt,
                    "id": s.id,
                    "context": context_key(s)[:16],
                    "depth": s.depth,
                    "v_before": before[1],
                    "v_after": after[1],
                    "a_star": after[1] - before[1],
                    "se": math.hypot(after[2], before[2]),
                    "halves": [after[0][h] - before[0][h] for h in (0, 1)],
                    "credit": {name: c.get(s.id, 0.0) for name, c in got.items()},
                }
            )
    return rows


def _needed(node: Node, steps: list[Node]) -> bool:
    """Whether the open node `node`'s value enters an A*: it is a step's context before or after."""
    return any(node is s or node is s.parent for s in steps)


def grow(agent: Agent, examples: list, algo: str, seed: int) -> list[list[Tree]]:
    """Every prompt's trees by `algo`'s strategy at its matched budget (MATCHED)."""
    cfg, _ = algo_config(MATCHED[algo])
    return rollout.ALGOS[algo].grow(agent, examples, random.Random(seed), cfg)


def main(a: Args):
    if a.report:
        print(report_file(a.report, a.out))
        return
    configs = parse_train(a.train_flags)
    targs, _, _, agent_cfg, retriever_cfg, warm = configs
    algo_flags = {f.name for c in (RolloutConfig, CreditConfig) for f in fields(c)}
    taken = [x for x in a.train_flags.split() if x.lstrip("-").removeprefix("no_") in algo_flags]
    flags.check(
        a,
        [("prompts bootstrap", "an integer >= 1", lambda v: v >= 1)]
        + [("K", "an integer >= 2 (two halves)", lambda v: v >= 2)],
        [(bool(taken), f"--train_flags sets {taken}: the algorithm knobs are MATCHED's")],
    )
    t0 = time.perf_counter()
    world = os.path.join(targs.out_dir, "world") if not (targs.data and targs.corpus) else ""
    if world:
        data.ensure_world(world)
    rows = loaders.load_rows(targs.data or world, "train")
    order = list(range(len(rows)))
    random.Random(targs.seed).shuffle(order)  # train.py's order of the questions
    examples = [rows[i] for i in order[: a.prompts]]
    search, where = retriever.connect(
        retriever_cfg, targs.corpus or os.path.join(world, "corpus.jsonl")
    )
    model_path = targs.model or os.path.join(targs.out_dir, "warmstart")
    if not targs.model:
        warmstart.ensure(model_path, world, warm, agent_cfg, targs.seed, search)
    model, tok = policy.load_policy(model_path, targs.gguf_file or None)
    kw = dict(dtype=targs.vllm_dtype, gpu_memory_utilization=targs.vllm_gpu_memory_utilization)
    engine = engines.make_engine(targs.engine, model.eval(), tok, model_path, HF_BATCH, **kw)
    print(f"policy {model_path}, retriever: {where}, {a.prompts} prompts, K = {a.K}", flush=True)

    # ---- trees: the shared set, then (--own) each method's own
    grower = Agent(engine, search, tok, agent_cfg, targs.seed)
    sets = {"shared": (grow(grower, examples, a.strategy, targs.seed), list(SHARED))}
    if a.own:
        for algo, name in OWN.items():
            if algo != a.strategy:
                sets[algo] = (grow(grower, examples, algo, targs.seed), [name])
    print(f"trees grown in {time.perf_counter() - t0:.0f} s", flush=True)

    # ---- ground truth: K continuations from every context, a prompt at a time
    truth = Agent(engine, search, tok, agent_cfg, targs.seed + 1)  # its own sampling stream
    steps, group = [], max(1, GROUP_ROWS // (a.K * 10 * len(sets)))  # ~10 contexts a prompt
    bar = flags.progress(range(0, a.prompts, group), desc=f"ground truth ({group} prompts each)")
    for start in bar:
        chunk = range(start, min(start + group, a.prompts))
        jobs = [(s, i, prompts[i], names) for s, (prompts, names) in sets.items() for i in chunk]
        steps += step_rows(truth, jobs, a.K)
        bar.set_postfix(steps=len(steps), refresh=False)
    stored = {
        "args": asdict(a) | {"out": None, "report": None},
        "matched": {s: arm_name(MATCHED[a.strategy if s == "shared" else s]) for s in sets},
        "agent": asdict(agent_cfg),
        "model": targs.model or "the embedded default's warm start",
        "seed": targs.seed,
        "commit": commit(),
        "wall_s": round(time.perf_counter() - t0),
        "steps": steps,
    }
    print("\n" + write(a.out, stored))


if __name__ == "__main__":
    main(*flags.parse(Args))
