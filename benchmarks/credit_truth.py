"""Which credit is closest to the truth? Every method's per-step credit set against a Monte Carlo
estimate of the step's true advantage under the policy that grew the trees, in two policies.

    python benchmarks/credit_truth.py --quick    # the tables in ~2 min on 2 cores, wider
                                                 # intervals: out/credit_truth-quick
    python benchmarks/credit_truth.py            # the full run, ~45 min on 2 cores (the two
                                                 # policies at once): out/credit_truth
                                                 # (docs/credit_truth.md)
    python benchmarks/credit_truth.py --own      # also each method on the trees of its own strategy
    python benchmarks/credit_truth.py --warm_start DIR --trained DIR    # other policies
    python benchmarks/credit_truth.py --warm_only   # no RL-trained policy at hand
    python benchmarks/credit_truth.py --report docs/credit_truth.json --out DIR
                                                 # its results.md again, byte for byte, and figure

The policies: train.py's warm start (out_dir/warmstart; trained first if missing, as train.py
does) and the main job's RL-trained final model (out_dir/runs/tree_grpo-seedS/final; the main job,
`python train.py` with --train_flags, is run first if it is missing), or --warm_start and
--trained. Each is measured on --draws independent draws: draw d takes the d-th --prompts train
questions of train.py's order for --seed and samples with its own seeds (seed + 100 d: the trees,
+ 1: A*'s continuations, + 2: VinePPO's), the same prompts and seeds under both policies.

For a step taken in context s that leads to s' (the step's tokens and its observation), the true
advantage under the policy is A*(step) = V(s') - V(s). V(context) is estimated by the mean outcome
reward of K continuations sampled from that context's exact token ids (TITO: the tree's own
nodes are continued, then the continuations removed), by the same agent, engine, sampling and
retriever that grew the trees; a step that ended has V(s') = its reward, no estimate needed. Nodes
share contexts (a prompt's trees share the prompt), so each context is sampled once (keyed by a
hash of its ids). SE(A*) = sqrt(SE(V(s'))^2 + SE(V(s))^2), each the K rewards' std / sqrt(K), that
std never below a smoothed binomial one (`mean_se`: K equal rewards are no exact value).

One set of trees per prompt ("shared"), grown by --trees (bushier than any method's matched budget:
many sibling actions at many contexts), is credited by every credit function that can read it:
GRPO (the trees' root-to-leaf paths copied into chains, as `python advantages.py --demo` does),
Tree-GRPO both / intra / inter (inter is ARPO's soft credit), CARL, TreePS-RAG, GiGPO, IGPO and
MT-GRPO both ways (on the chains, as GRPO; IGPO from the trees' gold-answer log-probs,
`Agent.believe`), AT2PO, ARPO hard, TreePO, and BranPO where `prefix_end` marks exist (its own trees
only). This isolates credit from rollout. Two reference rows: "random", a seeded N(0, 1) per step
(the floor: chance), and "VinePPO, K = 4", the registry's VinePPO credit (A = V(s') - V(s)) from 4
continuations per context of its own, drawn apart from A*'s (how close a cheap Monte Carlo estimate
comes). "IGPO gain" is IGPO's raw turn reward, P(gold) after the step minus before (after a step
that ended, its reward): is the information gain a proxy for A* = V(s') - V(s)? --own adds each
method on its own strategy's trees at the comparison's matched budget
(benchmarks/compare_arms.py's MATCHED). A method's credit on a step is what its tokens receive in
the loss (`tree.step_credit`: the sum over the trajectories that train it); a step it does not
train has credit 0.

Statistics, tables and figure: benchmarks/credit_truth_report.py (the headline: sibling ranking
accuracy at branch points). Outputs in --out: results.json (every step: policy, draw, prompt, id,
the contexts before and after, depth, V before and after, A*, its SEs and halves, the
continuations' rewards from s', each credit), results.md (the tables, also printed) and
credit_truth.png.
"""

import hashlib
import math
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields, replace

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import retriever  # noqa: E402  (the project's modules, from the repository root)
import rollout  # noqa: E402
from advantages import CreditConfig  # noqa: E402
from benchmarks.compare import parse_train  # noqa: E402
from benchmarks.compare_arms import MATCHED, algo_config, arm_name, tree  # noqa: E402
from benchmarks.compare_report import commit  # noqa: E402
from benchmarks.credit_truth_report import (  # noqa: E402
    CEILING,
    FLOOR,
    REFERENCES,
    VINE_K,
    report_file,
    write,
)
from infra import data, engines, flags, loaders, policy  # noqa: E402
from rollout import Agent, RolloutConfig  # noqa: E402
from scripts import warmstart  # noqa: E402
from tree import Node, Tree, context_ids, path, scored_leaves, step_credit, walk  # noqa: E402


@dataclass
class Args:
    """What to measure; the world, agent and retriever settings are train.py's."""

    prompts: int = 64
    """P: train questions per draw (draw d: the d-th P in train.py's order for --seed)."""
    draws: int = 2
    """Independent draws per policy: their own prompts, trees and continuations."""
    K: int = 8
    """Continuations sampled from every context to estimate its value for A* (in a 4-prompt pilot
    K = 16 separated 73 sibling pairs, K = 8 61, for 20 against 12 continuations a context with
    VinePPO's 4)."""
    trees: str = tree(4, 2, 1)
    """The strategy and knobs (train.py's algorithm flags) that grow the shared trees."""
    warm_start: str = ""
    """The first policy; empty = train.py's warm start in out_dir (trained first if missing)."""
    trained: str = ""
    """The second policy; empty = the main job's final model, out_dir/runs/tree_grpo-seedS/final
    (`python train.py` with --train_flags is run first if it is missing: ~15 min on 2 cores)."""
    warm_only: bool = False
    """The warm start alone, where no RL-trained policy is at hand (tau: between its draws)."""
    quick: bool = False
    """A smaller run that prints the table in ~2 min on 2 cores, with wider intervals: QUICK's
    values for the flags left at their defaults (--quick --prompts 64 is --quick)."""
    own: bool = False
    """Also each method on the trees of its own strategy at the matched budget (~2.5x the time)."""
    bootstrap: int = 1000
    """Bootstrap resamples of the prompts, for every interval."""
    threads: int = 1
    """Torch threads per policy: on shared cores a second one made --quick about 4x slower (and
    the tiny model's training 5-15x: docs/comparison.md); more where the cores are this run's
    alone."""
    jobs: int = 2
    """Policies measured at once, each in a process of its own with --threads threads (the rows
    are the same for any --jobs: every sampling call is seeded)."""
    train_flags: str = ""
    """train.py flags (--seed, --out_dir, agent and retriever settings), as --train_flags="...";
    no --model (the policies: --warm_start, --trained) and no algorithm knobs."""
    out: str = ""
    """Output directory: results.json, results.md, credit_truth.png; empty = out/credit_truth
    (-quick with --quick)."""
    report: str = ""
    """Instead: the table and figure again from a results.json, results.md byte for byte."""


QUICK = dict(prompts=2, bootstrap=200)  # --quick: ~2 min on 2 cores, two draws as the full run

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
    "IGPO": ("igpo", CreditConfig()),  # on the chains; the trees' gold log-probs (Agent.believe)
    "MT-GRPO": ("mtgrpo", CreditConfig()),  # on the chains, as GRPO
    "MT-GRPO unbiased": ("mtgrpo", CreditConfig(mtgrpo_baseline="unbiased")),
}
GAIN = "IGPO gain"  # IGPO's raw turn reward P(s') - P(s), P after a step that ended its reward
ONLY_OWN = {"VinePPO": ("vineppo", CreditConfig())}  # reads its continuations: on its trees only
ON_CHAINS = ("grpo", "gigpo", "igpo", "mtgrpo")  # credits of GRPO chains: the paths as chains
OWN = {  # --own: the credit each strategy's trees are trained with
    "grpo": "GRPO",
    "tree_grpo": "Tree-GRPO",
    "branpo": "BranPO",
    "carl": "CARL",
    "treeps": "TreePS",
    "gigpo": "GiGPO",
    "at2po": "AT2PO",
    "arpo": "Tree-GRPO inter",  # ARPO's soft credit (its default) is Tree-GRPO's inter
    "vineppo": "VinePPO",
    "igpo": "IGPO",
    "mtgrpo": "MT-GRPO",
}
GROUP_ROWS = 512  # continuations sampled together (one agent.run): prompts are grouped to ~this
HF_BATCH = 256  # rows per HF generate call (train.py's engine: 32); larger, the same distribution
DRAW_SEED = 100  # draw d samples with --seed + DRAW_SEED d (+ 1: A*, + 2: VinePPO)


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
    """Credit name (of SHARED or ONLY_OWN; REFERENCES: skipped) -> node id -> the credit its tokens
    receive (`tree.step_credit`), for one prompt's trees; BranPO only where they carry its
    `prefix_end` marks."""
    marked = any(n.prefix_end for t in trees for n in walk(t.root))
    out = {}
    for name in (n for n in names if n not in REFERENCES and n != GAIN):
        algo, cfg = (SHARED | ONLY_OWN)[name]
        if algo == "branpo" and not marked:
            continue
        chains = as_chains(trees) if algo in ON_CHAINS else trees
        out[name] = step_credit(rollout.ALGOS[algo].credit(chains, cfg))
    if GAIN in names:  # on the steps some credit trains
        trained = {i for c in out.values() for i in c}
        out[GAIN] = {n.id: gain(n) for t in trees for n in walk(t.root) if n.id in trained}
    return out


def gain(step: Node) -> float:
    """IGPO's information gain of `step`, its P(gold) after minus before (P = exp of the nodes'
    `gold_logp`), read as a value: after a step that ended, P is its reward (IGPO's last turn)."""
    P = lambda n: n.reward if n.ended else math.exp(n.gold_logp)
    return P(step) - P(step.parent)


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
    """The mean of n rewards in [0, 1] and its standard error sqrt(v / n), v their unbiased
    variance but never below p(1 - p) at the smoothed mean p = (sum + 1/2) / (n + 1) (so that n
    equal rewards, 16 zeros say, do not claim an exact value; for rewards of 0 or 1 it is the
    binomial variance, Jeffreys-smoothed)."""
    n = len(rewards)
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / (n - 1) if n > 1 else 0.0
    p = (sum(rewards) + 0.5) / (n + 1)
    return mean, math.sqrt(max(var, p * (1 - p)) / n)


def value(node: Node, sampled: dict[str, list[float]]):
    """V(context after `node`): (its estimate's halves, the estimate, its SE, the continuations'
    rewards): a reward for a step that ended (no continuations), else from `sampled`; None when no
    continuation was scored."""
    if node.ended:
        return None if node.reward is None else ([node.reward] * 2, node.reward, 0.0, [])
    rewards = sampled[context_key(node)]
    if not rewards:
        return None
    half = len(rewards) // 2 or 1
    halves = [mean_se(rewards[:half])[0], mean_se(rewards[half:] or rewards)[0]]
    return (halves, *mean_se(rewards), rewards)


def vineppo_credits(agent: Agent, tree_groups: list[list[Tree]], K: int) -> list[dict]:
    """The VinePPO row, for each prompt's trees in `tree_groups`: node id -> the credit of the
    registry's VinePPO (`advantages.vineppo`: V(s) the mean reward of s's Monte Carlo
    continuations, A = V(s') - V(s), R - V(s) for a step that ended; a step trained once) on a copy
    of the trees whose every leaf is marked the end of a trained path, with K continuations
    sampled by `agent` (apart from A*'s) from every context of a step, each tree's own (equal
    contexts of two trees not merged, as rollout.vineppo's chains), in one `agent.run`. The trees
    given are left as they were."""
    copies = [[Tree.from_dict(t.to_dict()) for t in trees] for trees in tree_groups]
    contexts = []
    for t in (t for trees in copies for t in trees):
        t.stats = Counter(t.stats)  # the agent counts into it
        for leaf in t.leaves():
            leaf.sampled = True  # the end of a trained path; the continuations are not
        contexts += [(t, n) for n in walk(t.root) if n.children]
    agent.run([job for job in contexts for _ in range(K)])
    vineppo = rollout.ALGOS["vineppo"].credit
    return [step_credit(vineppo(trees, CreditConfig())) for trees in copies]


def describe(node: Node) -> str:
    """A step in a few words: its action and query or answer (and reward), or its flags."""
    if node.action == "search":
        return f"search {node.query!r}"
    if node.action == "answer":
        return f"answer {node.answer!r}, reward {node.reward:g}"
    return f"{node.action or 'step'} ({', '.join(node.flags)})"


def step_rows(agents: tuple[Agent, Agent], floor: random.Random, group: list, K: int, vine_K: int):
    """One row per step that some credit of `names` trains in each (tree set, prompt, trees,
    names) of `group`: its A* from K continuations of every context involved (one `agent.run` of
    agents[0] for the whole group), each credit's value there (0: not trained), the random row's
    draw from `floor` and the VinePPO row's credit from vine_K continuations of agents[1] (the two
    where `names` hold them)."""
    truth, vine = agents
    plans, jobs = [], []
    for tree_set, prompt, trees, names in group:
        got = credits(trees, names)
        trained = {i for c in got.values() for i in c}
        steps = [n for t in trees for n in walk(t.root) if n.id in trained]
        plans.append((tree_set, prompt, got, steps))
        jobs += [(t, n) for t in trees for n in walk(t.root) if n.children and _needed(n, steps)]
    sampled = continue_from(truth, jobs, K)
    vined = iter(vineppo_credits(vine, [job[2] for job in group if CEILING in job[3]], vine_K))
    rows = []
    for (tree_set, prompt, got, steps), names in zip(plans, (job[3] for job in group)):
        vine_credit = next(vined) if CEILING in names else {}
        for s in steps:
            before, after = value(s.parent, sampled), value(s, sampled)
            if before is None or after is None:
                continue
            credit = {name: c.get(s.id, 0.0) for name, c in got.items()}
            if FLOOR in names:
                credit[FLOOR] = floor.gauss(0, 1)
            if CEILING in names:
                credit[CEILING] = vine_credit.get(s.id, 0.0)
            rows.append(
                {
                    "set": tree_set,
                    "prompt": prompt,
                    "id": s.id,
                    "step": describe(s),
                    "from": context_key(s.parent)[:16],
                    "context": context_key(s)[:16],
                    "depth": s.depth,
                    "v_before": before[1],
                    "v_after": after[1],
                    "a_star": after[1] - before[1],
                    "se": math.hypot(after[2], before[2]),
                    "se_after": after[2],
                    "halves": [after[0][h] - before[0][h] for h in (0, 1)],
                    "k_after": [round(r, 4) for r in after[3]],
                    "credit": credit,
                }
            )
    return rows


def _needed(node: Node, steps: list[Node]) -> bool:
    """Whether the open node `node`'s value enters an A*: it is a step's context before or after."""
    return any(node is s or node is s.parent for s in steps)


def grow(agent: Agent, examples: list, flags_: str, seed: int) -> list[list[Tree]]:
    """Every prompt's trees by the strategy and knobs of the train.py flags `flags_`."""
    cfg, _ = algo_config(flags_)
    return rollout.ALGOS[cfg.algo].grow(agent, examples, random.Random(seed), cfg)


def policies(a: Args, targs, world: str, warm, agent_cfg, search) -> dict[str, tuple[str, str]]:
    """Policy name -> (its path, what the results call it): the warm start and (unless
    --warm_only) the main job's final model, each found, or made first, where train.py puts it,
    unless given."""
    start = a.warm_start or os.path.join(targs.out_dir, "warmstart")
    if not a.warm_start:
        warmstart.ensure(start, world, warm, agent_cfg, targs.seed, search)
    seed = targs.seed
    found = {"warm start": (start, a.warm_start or f"train.py's warm start, seed {seed}")}
    if a.warm_only:
        return found
    name = targs.run_name or f"tree_grpo-seed{seed}"  # train.py's run name, its default algo
    final = a.trained or os.path.join(targs.out_dir, "runs", name, "final")
    if not a.trained and policy.model_problem(final):
        command = [sys.executable, os.path.join(ROOT, "train.py"), *a.train_flags.split()]
        print(f"the RL-trained policy: none in {final}; the main job first: {' '.join(command)}")
        done = subprocess.run(command)
        if done.returncode != 0:
            raise SystemExit(
                f"the main job (train.py {a.train_flags}) exited with {done.returncode} (its "
                f"output above) and left no policy in {final}; fix it, or pass --trained DIR"
            )
    return found | {
        "RL-trained": (final, a.trained or f"the main job's final model (train.py), seed {seed}")
    }


def measure(a: Args, targs, agent_cfg, retriever_cfg, corpus: str, policy_: tuple, draws: list):
    """The rows of one policy (`policy_`: its name, its path, its bar's line) for each draw (its
    examples, its seed): the shared trees (and with --own each method's), then A* and VinePPO's
    continuations of every context, a group of prompts at a time. A process of its own
    (--jobs): --threads torch threads, its own retriever."""
    name, model_path, line = policy_
    torch.set_num_threads(a.threads)
    search, _ = retriever.connect(retriever_cfg, corpus)
    model, tok = policy.load_policy(model_path, targs.gguf_file or None)
    kw = dict(dtype=targs.vllm_dtype, gpu_memory_utilization=targs.vllm_gpu_memory_utilization)
    engine = engines.make_engine(targs.engine, model.eval(), tok, model_path, HF_BATCH, **kw)
    steps = []
    for d, (examples, seed) in enumerate(draws):
        t0, grower = time.perf_counter(), Agent(engine, search, tok, agent_cfg, seed)
        shared = grow(grower, examples, a.trees, seed)
        grower.believe([t for trees in shared for t in trees])  # IGPO's P(gold): samples nothing
        sets = {"shared": (shared, [*SHARED, GAIN, *REFERENCES])}
        if a.own:
            for algo, name in OWN.items():
                sets[algo] = (grow(grower, examples, MATCHED[algo], seed), [name])
        print(f"{name}, draw {d}: trees grown in {time.perf_counter() - t0:.0f} s", flush=True)
        agents = (
            Agent(engine, search, tok, agent_cfg, seed + 1),  # their own sampling streams
            Agent(engine, search, tok, agent_cfg, seed + 2),
        )
        jobs = [
            (s, i, prompts[i], names)
            for s, (prompts, names) in sets.items()
            for i in range(len(examples))
        ]
        desc = f"{name}, draw {d}: A* and VinePPO"
        bar = flags.progress(_groups(jobs, a.K), desc=desc, position=line)
        for group in bar:
            floor = random.Random(f"{FLOOR} {seed} {group[0][1]}")  # one stream per group
            got = step_rows(agents, floor, group, a.K, VINE_K)
            steps += [dict(r, draw=d, policy=name) for r in got]
            bar.set_postfix(steps=len(steps), refresh=False)
    return steps


def exit_with_parent(parent: int):
    """A --jobs worker's start: a thread that ends the worker once its parent `parent` is gone (a
    killed run's spawned workers would otherwise measure on, unseen, on the cores)."""

    def watch():
        while os.getppid() == parent:
            time.sleep(2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _groups(jobs: list, K: int) -> list[list]:
    """`jobs` (tree set, prompt, trees, names) in consecutive groups of about GROUP_ROWS
    continuations (K per open context; a larger job alone)."""
    groups, rows = [[]], 0
    for job in jobs:
        contexts = sum(1 for t in job[2] for n in walk(t.root) if n.children) * K
        if groups[-1] and rows + contexts > GROUP_ROWS:
            groups.append([])
            rows = 0
        groups[-1].append(job)
        rows += contexts
    return [g for g in groups if g]


def main(a: Args):
    if a.report:
        print(report_file(a.report, a.out or "out/credit_truth"))
        return
    if a.quick:  # QUICK's values where the flag is at its default (given or not)
        a = replace(a, **{k: v for k, v in QUICK.items() if getattr(a, k) == getattr(Args(), k)})
    out = a.out or "out/credit_truth" + "-quick" * a.quick
    configs = parse_train(a.train_flags)
    targs, _, _, agent_cfg, retriever_cfg, warm = configs
    algo_flags = {f.name for c in (RolloutConfig, CreditConfig) for f in fields(c)}
    taken = [x for x in a.train_flags.split() if x.lstrip("-").removeprefix("no_") in algo_flags]
    flags.check(
        a,
        [("prompts draws bootstrap threads jobs", "an integer >= 1", lambda v: v >= 1)]
        + [("K", "an integer >= 2 (two halves)", lambda v: v >= 2)],
        [
            (bool(taken), f"--train_flags sets {taken}: the algorithm knobs are --trees'"),
            (
                a.warm_only and bool(a.trained),
                f"--warm_only and --trained {a.trained}: the second policy is measured or not; "
                "pass one of them",
            ),
            (
                bool(targs.model),
                f"--train_flags sets --model {targs.model}: the policies are --warm_start and "
                "--trained",
            ),
        ],
    )
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    world = os.path.join(targs.out_dir, "world") if not (targs.data and targs.corpus) else ""
    if world:
        data.ensure_world(world)
    rows = loaders.load_rows(targs.data or world, "train")
    if a.prompts * a.draws > len(rows):
        raise SystemExit(
            f"--prompts {a.prompts} x --draws {a.draws} needs {a.prompts * a.draws} train "
            f"questions; the world has {len(rows)}: lower one of them"
        )
    order = list(range(len(rows)))
    random.Random(targs.seed).shuffle(order)  # train.py's order of the questions
    draws = [
        ([rows[i] for i in order[d * a.prompts : (d + 1) * a.prompts]], targs.seed + DRAW_SEED * d)
        for d in range(a.draws)
    ]
    corpus = targs.corpus or os.path.join(world, "corpus.jsonl")
    search, where = retriever.connect(retriever_cfg, corpus)
    found = policies(a, targs, world, warm, agent_cfg, search)
    print(f"retriever: {where}; {a.draws} draw(s) of {a.prompts} prompts, K = {a.K}", flush=True)
    for name, (model_path, _) in found.items():
        print(f"policy {name}: {model_path}", flush=True)
    tasks = [
        (a, targs, agent_cfg, retriever_cfg, corpus, (name, path, line), draws)
        for line, (name, (path, _)) in enumerate(found.items())
    ]
    workers = min(a.jobs, len(tasks))
    if workers > 1:  # spawned: a forked child of a running torch can hang
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, spawn, exit_with_parent, (os.getpid(),)) as pool:
            measured = list(pool.map(measure, *zip(*tasks)))
    else:
        measured = [measure(*task) for task in tasks]
    steps = [row for rows in measured for row in rows]
    stored = {
        "args": asdict(a) | {"out": None, "report": None, "warm_start": None, "trained": None},
        "sets": {"shared": arm_name(a.trees)}
        | {algo: arm_name(MATCHED[algo]) for algo in OWN if a.own},
        "policies": {name: said for name, (_, said) in found.items()},
        "agent": asdict(agent_cfg),
        "seed": targs.seed,
        "commit": commit(),
        "wall_s": round(time.perf_counter() - t0),
        "steps": steps,
    }
    print("\n" + write(out, stored))


if __name__ == "__main__":
    main(*flags.parse(Args))
