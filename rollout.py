"""Rollout: the outcome reward, the multi-turn search agent, every paper's tree-building strategy.

The agent speaks Search-R1's protocol (<think>, <search> query </search>, <information> ...
</information>, <answer> ... </answer>; its settings, its texts, and `parse_action`, which reads a
step's text into its action: infra/protocol.py).
`Agent.step` advances a frontier of nodes across all prompts by one step with ONE batched engine
call and ONE batched retriever call; `Agent.run` steps until every branch has ended. A strategy
(one per paper, `chain` for GRPO and GiGPO) picks the nodes to continue from; a chain is the
degenerate tree. ALGOS, the algorithm registry, pairs each with its credit function in
advantages.py; each reads its paper's knobs (tree.py, advantages.py) from the config it is given.

Abnormal outcomes ("Cut the Bill" §5.4), each a flag on the node and a counter: too_many_calls,
parse_error, repeated_query (5.4.1) and max_turns (5.4.3) stop with reward 0; env_error (retrieval
failed or timed out) is discarded, neither trained nor in group statistics (5.4.2); truncated (token
budget exceeded) stops, its reward counts in statistics, its tokens are not trained (5.4.4).

Deviations from the papers, each cited by its name (argued in docs/paper_code.md):
- branch-waves: a truncation point's Bran(r, acc) branches are sampled together, not one by one
- rsm-fallback-split: a redundancy check that keeps no branch splits the original at k = T - 2
- rsm-threshold: RSM runs for r >= 0.8 (App. A.1: r = 1); a short trajectory may truncate at k = 0
- truncated-loser: a branch cut by the token budget can be a contrastive pair's losing side
- rsm-any-reward: the redundancy check keeps any shorter correct branch, whatever its reward
- acc-mean-f1: BranPO's acc is the initial rollouts' mean F1, not the share of rewards >= 0.8
- carl-entropy: H(s) from the rollout engine's log-probs; forks of different prompts in one batch
- treeps-pruning: the first sampled member of each cluster is kept; depth-limit children tie
- format-penalty: -0.5 for format breaks and answers without search; other abnormal ends keep 0
- expand-without-replacement: N expansion nodes drawn without replacement (`--tree_replace`: with)
- squad-reward: SQuAD's EM / F1, best gold; Unicode punctuation; HotpotQA's yes / no; no empty gold
- at2po-truncated-leaf: a step whose observation overflows the token budget is a leaf, not resampled
- arpo-entropy: H is a step's mean sampled-token NLL, not the normalised top-10 entropy of 20 tokens
- arpo-branch-step: ΔH is the tool-calling step's (the official code's), not the step's after it
- arpo-initial-entropy: ΔH against the first step of its own chain or branch, in this rollout only
- raw-logprobs: log-probs of the raw logits whatever temperature / top_p (verl divides by T)
- vineppo-contexts: K continuations per context of each chain trained, equal contexts apart
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable
from copy import copy
from dataclasses import dataclass, fields, replace
from typing import Literal

from scipy.cluster.hierarchy import cut_tree, linkage
from scipy.spatial.distance import squareform

import advantages
import turns
from infra import protocol
from infra.engines import Sampling
from infra.protocol import RETRY, AgentConfig, encode, format_passages, parse_action, query_key
from infra.squad import exact_match, token_f1  # the outcome reward's EM and F1 (squad-reward)
from retriever import RetrievalError
from tree import (
    ROLLOUT_RULES,
    ARPORollout,
    AT2PORollout,
    BranPORollout,
    CARLRollout,
    GRPORollout,
    Node,
    Tree,
    TreeGRPORollout,
    TreePSRollout,
    TreeShape,
    VinePPORollout,
    action_nll,
    context_ids,
    path,
    scored_leaves,
    truncated,
    walk,
)

CORRECT_F1 = 0.8  # BranPO App. A.1: "an F1 score of 0.8 is used as a threshold" for correctness
AT2PO_ALPHA = 0.05  # AT2PO: branching penalty per existing sibling (official code's constant)
ARPO_BEAM, ARPO_BETA, ARPO_TAU = 2, 0.2, 0.5  # ARPO: beam size, ΔH weight, threshold (official run)
WAVE_SEED_STEP = 7919  # a prime: wave w samples with seed + 7919 w (vLLM: vllm_engine.row_seeds)


# --------------------------------------------------------------------------------------------------
# The agent and its step


def rollout_logprob(logits, tokens):  # (B, V) float32, (B,) -> (B,)
    """log pi_rollout of each sampled token, what TIS weighs by (train.ppo_loss): the log_softmax of
    the raw logits it was sampled from, whatever temperature and top_p (raw-logprobs). The HF engine
    calls it as it samples (infra/engines.py's capture); vLLM's raw_logprobs mode is the same."""
    return logits.log_softmax(-1).gather(-1, tokens[:, None])[:, 0]  # (B,)


class Agent:
    """Generates, parses, executes and scores the steps of frontiers of nodes of many prompts."""

    def __init__(self, engine, retriever, tokenizer, cfg: AgentConfig, seed: int, refiner=None):
        self.engine, self.retriever, self.tok = engine, retriever, tokenizer
        self.cfg, self.seed, self.refiner = cfg, seed, refiner
        self.template = protocol.instruction_template(cfg.instruction, tokenizer)
        kw = dict(temperature=cfg.temperature, top_p=cfg.top_p, stop=["</search>", "</answer>"])
        kw.update(max_tokens=cfg.max_step_tokens, seed=seed, logprob=rollout_logprob)  # pi_rollout
        self.sampling = Sampling(**kw)
        self.counters = Counter()  # abnormal/<flag>, rollout/steps, rollout/waves, ...
        self.obs_open = encode(tokenizer, "\n\n<information>")
        self.obs_close = encode(tokenizer, "</information>\n\n")

    def prompt_ids(self, question: str) -> list[int]:
        """The instruction (Search-R1's by default) as one user turn."""
        text = self.template.format(think=self.cfg.think_tag, question=question.strip())
        return protocol.user_turn_ids(self.tok, text)

    def new_tree(self, example, tree_id: str) -> Tree:
        """An empty tree for one prompt: the root holds the prompt's ids; `stats` counts from 0."""
        root = Node(tree_id, tokens=self.prompt_ids(example.question))
        return Tree(root, example.question, list(example.golden_answers), Counter())

    def step(self, frontier: list[tuple[Tree, Node]]) -> list[tuple[Tree, Node]]:
        """Sample one child for every (tree, node) entry (repeat an entry for several children) and
        return them in frontier order. A child that ended carries its reward and flags; an open one
        has its observation."""
        cfg, t0 = self.cfg, time.perf_counter()
        wave = self.counters["rollout/waves"]  # a fresh seed per wave
        sampling = replace(self.sampling, seed=self.seed + WAVE_SEED_STEP * wave)
        outs = self.engine.generate([context_ids(node) for _, node in frontier], sampling)
        gen_time = time.perf_counter() - t0
        self.counters["rollout/waves"] += 1
        total_tokens = sum(len(o.token_ids) for o in outs) or 1
        children, searching = [], []  # searching: (tree, child, query)
        for (tree, node), out in zip(frontier, outs):
            ids, logprobs = list(out.token_ids), list(out.logprobs)
            child = node.add_child(tokens=ids, logprobs=logprobs, text=self.tok.decode(ids))
            children.append((tree, child))
            tree.stats["generated_tokens"] += len(out.token_ids)
            # a wave is one engine call: its time is shared among prompts by generated tokens
            tree.stats["gen_seconds"] += gen_time * (len(out.token_ids) / total_tokens)
            self.counters["rollout/steps"] += 1
            action, content, flag = parse_action(child.text, cfg.think_tag, cfg.max_calls)
            child.action = action
            if len(context_ids(child)) - len(tree.root.tokens) > cfg.max_traj_tokens:
                self._end(child, "truncated", 0.0)
            elif flag == "parse_error" and cfg.retry_invalid and child.depth <= cfg.max_turns:
                child.flags.append(flag)  # flagged, not ended: the retry message is its observation
                self.counters["abnormal/" + flag] += 1
                child.obs_tokens, child.obs_text = encode(self.tok, RETRY), RETRY
            elif flag:
                self._end(child, flag, -0.5 if cfg.format_penalty else 0.0)
            elif action == "answer":
                child.answer = content
                child.em = exact_match(content, tree.golden_answers)
                child.f1 = token_f1(content, tree.golden_answers)
                # format-penalty
                penalty = cfg.format_penalty and not any(s.action == "search" for s in path(child))
                child.reward = -0.5 if penalty else child.f1 if cfg.reward == "f1" else child.em
            else:
                child.query = content
                if query_key(content) in {query_key(s.query) for s in path(node) if s.query}:
                    self._end(child, "repeated_query", 0.0)
                elif child.depth > cfg.max_turns:
                    self._end(child, "max_turns", 0.0)
                else:
                    searching.append((tree, child, content))
        self._observe(searching)
        return children

    def _end(self, child: Node, flag: str, reward: float | None):
        """End the trajectory at `child`: an abnormal outcome (a flag, a counter) and its reward."""
        child.flags.append(flag)
        child.reward = reward
        self.counters["abnormal/" + flag] += 1

    def _observe(self, searching: list[tuple[Tree, Node, str]]):
        """One retriever call for the wave's queries; each gets its <information> or env_error."""
        if not searching:
            return
        queries = [q for _, _, q in searching]
        t0 = time.perf_counter()
        try:
            results = self.retriever.search(queries, self.cfg.topk)
        except RetrievalError as e:
            self.counters["rollout/retrieval_failed_queries"] += len(e.failed)
            results = e.partial  # the passages of the queries that succeeded, None for the others
        bodies = [None if r is None else format_passages(r) for r in results]
        if self.refiner is not None:  # Cut the Bill §6: the agent reads the summary only
            bodies = self.refiner.summarize(queries, bodies)
        retrieval_time = time.perf_counter() - t0
        for (tree, child, _), passages, body in zip(searching, results, bodies):
            tree.stats["tool_calls"] += 1
            tree.stats["retrieval_seconds"] += retrieval_time / len(queries)
            if passages is None:
                tree.stats["failed_queries"] += 1
                self._end(child, "env_error", None)
                continue
            child.doc_ids = [p.id for p in passages]
            child.obs_tokens = self.observation_ids(body)
            child.obs_text = self.tok.decode(child.obs_tokens)
            if len(context_ids(child)) - len(tree.root.tokens) > self.cfg.max_traj_tokens:
                self._end(child, "truncated", 0.0)

    def observation_ids(self, body: str) -> list[int]:
        """<information> body </information> as token ids, the body cut to fit max_obs_tokens."""
        room = self.cfg.max_obs_tokens - len(self.obs_open) - len(self.obs_close)
        return self.obs_open + encode(self.tok, body)[: max(room, 0)] + self.obs_close

    def believe(self, trees: list[Tree]) -> None:
        """IGPO §3's P: `gold_logp` on each node with children, the first gold's (igpo-first-gold)
        mean log-prob forced after its context (FORCED_ANSWER), one `engine.score` call for all."""
        nodes = [(t, n) for t in trees for n in walk(t.root) if n.children]
        tok, think, t0 = self.tok, self.cfg.think_tag, time.perf_counter()
        forced = [protocol.forced_answer_ids(tok, think, t.golden_answers[0]) for t, _ in nodes]
        contexts = [context_ids(n) + head for (_, n), (head, _) in zip(nodes, forced)]
        lps = self.engine.score(contexts, [g for _, g in forced])
        dt = (time.perf_counter() - t0) / max(len(nodes), 1)  # the call's time, shared evenly
        for (t, n), lp in zip(nodes, lps):
            n.gold_logp, t.stats["gold_seconds"] = sum(lp) / len(lp), t.stats["gold_seconds"] + dt

    def run(self, frontier: list[tuple[Tree, Node]]) -> list[Node]:
        """Run each frontier entry to its end, one `step` per wave; the leaves in frontier order."""
        heads = list(frontier)
        going = list(range(len(heads)))
        while going:
            for i, head in zip(going, self.step([heads[i] for i in going])):
                heads[i] = head
            going = [i for i in going if not heads[i][1].ended]
        return [node for _, node in heads]


# --------------------------------------------------------------------------------------------------
# Strategies: each grows the trees of a batch of prompts and returns one list of trees per prompt.


RULES = protocol.RULES + ROLLOUT_RULES  # flags.check: AgentConfig's, RolloutConfig's (tree.py)


def chain(agent: Agent, examples, rng: random.Random, cfg: GRPORollout) -> list[list[Tree]]:
    """GRPO: G = cfg.grpo_G independent trajectories per prompt, each a chain-shaped tree of its
    own."""
    G = cfg.grpo_G
    tree_groups = [
        [agent.new_tree(ex, f"p{i}.g{j}") for j in range(G)] for i, ex in enumerate(examples)
    ]
    agent.run([(t, t.root) for trees in tree_groups for t in trees])
    return tree_groups


def tree_grpo(agent: Agent, examples, rng: random.Random, cfg: TreeGRPORollout) -> list[list[Tree]]:
    """Tree-GRPO §4.2.3: M chains per prompt (the initial trees), then L rounds in which N nodes per
    tree, drawn uniformly among the root and the non-leaf nodes (without replacement unless the tree
    has fewer, or with `tree_replace`: expand-without-replacement), each get one new full
    continuation. M (L N + 1) leaves per prompt."""
    M, N, L = cfg.tree_M, cfg.tree_N, cfg.tree_L
    tree_groups = [
        [agent.new_tree(ex, f"p{i}.t{m}") for m in range(M)] for i, ex in enumerate(examples)
    ]
    agent.run([(t, t.root) for trees in tree_groups for t in trees])  # initialization
    for _ in range(L):
        frontier = []
        for t in (t for trees in tree_groups for t in trees):
            # root + intermediate steps (never a final answer)
            inner = [n for n in walk(t.root) if n.children]
            picks = (
                rng.choices(inner, k=N)
                if cfg.tree_replace or len(inner) < N
                else rng.sample(inner, N)
            )
            frontier += [(t, n) for n in picks]
        agent.run(frontier)  # expansion: all trees of all prompts in one batch
    return tree_groups


def _f1(leaf: Node) -> float:
    """The agent's F1 on a leaf (0 without an answer): BranPO's r, correct if >= CORRECT_F1."""
    return leaf.f1 or 0.0


def _bran(acc: float) -> int:
    """BranPO Eq. 15: branches per truncation point."""
    return 1 if acc == 1 else 2


def _recur(r: float, acc: float) -> int:
    """BranPO Eq. 16: how many truncation points, moving back from the last step."""
    if acc < 0.5 and r < CORRECT_F1:
        return 3
    return 2 if acc < 1 or r < CORRECT_F1 else 1


def _kept(branch: Node, original: Node, mode: str) -> bool:
    """BranPO: whether a branch's leaf is kept for `original`'s: "contrast", its correctness is the
    other; "shorter" (the RSM check), it is correct in fewer steps."""
    if mode == "contrast":
        return (_f1(branch) >= CORRECT_F1) != (_f1(original) >= CORRECT_F1)
    return _f1(branch) >= CORRECT_F1 and branch.depth < original.depth


def branpo(agent: Agent, examples, rng: random.Random, cfg: BranPORollout) -> list[list[Tree]]:
    """BranPO §4.2, App. A.1 (Algorithm 1; branch-waves, rsm-threshold, rsm-fallback-split): N
    chains per prompt, one tree per original trajectory; acc = their mean F1. Each trajectory (F1 r,
    T steps) is truncated at depth k = T-1, T-2, ... (Recur(r, acc) points, Eq. 16) with Bran(acc)
    continuations at each (Eq. 15) until one's correctness (F1 >= 0.8) differs from the original's:
    it is kept and its truncation node marked `prefix_end`. With RSM (§4.4), a correct trajectory
    longer than the group's mean correct length (acc > 0.5) is instead branched 5 times before its
    penultimate step; the first shorter correct branch is kept and the original's penultimate step
    marked `redundant`. Unkept branches are removed (their tokens still count in the stats). An
    original with no branch kept stays split at the last truncation point tried (Algorithm 1):
    marked `prefix_end`, its one continuation the original suffix. N: cfg.branpo_N."""
    N = cfg.branpo_N
    tree_groups = [
        [agent.new_tree(ex, f"p{i}.n{j}") for j in range(N)] for i, ex in enumerate(examples)
    ]
    agent.run([(t, t.root) for trees in tree_groups for t in trees])
    # (tree, original leaf, plan: the truncations still to try, each (depth k, n branches, mode))
    jobs = []
    for trees in tree_groups:
        originals = [(t, t.leaves()[0]) for t in trees if t.leaves()[0].scored]
        f1s = [_f1(leaf) for _, leaf in originals]
        if not f1s:
            continue
        acc = sum(f1s) / len(f1s)
        correct_len = [leaf.depth for (_, leaf), r in zip(originals, f1s) if r >= CORRECT_F1]
        mean_len = sum(correct_len) / len(correct_len) if correct_len else math.inf
        for (t, leaf), r in zip(originals, f1s):
            T = leaf.depth
            if cfg.branpo_rsm and acc > 0.5 and r >= CORRECT_F1 and T > mean_len and T >= 2:
                plan = [(T - 2, 5, "shorter")]
            else:
                plan = [
                    (T - d, _bran(acc), "contrast")
                    for d in range(1, _recur(r, acc) + 1)
                    if T - d >= 0
                ]
            jobs.append((t, leaf, plan))
    while jobs:  # one wave of truncation points: each job's next one, all jobs in one batch
        # the truncation nodes
        starts = [([t.root] + path(leaf))[plan[0][0]] for t, leaf, plan in jobs]
        ends = agent.run(
            [(t, start) for (t, _, plan), start in zip(jobs, starts) for _ in range(plan[0][1])]
        )
        for (_, leaf, plan), start in zip(jobs, starts):
            k, n_branches, mode = plan.pop(0)
            mine, ends = ends[:n_branches], ends[n_branches:]
            keep = next((e for e in mine if e.scored and _kept(e, leaf, mode)), None)
            for e in mine:  # prune the branches that are not kept
                if e is not keep:
                    start.children.remove(path(e)[k])
            if keep is not None:
                if mode == "shorter":
                    # the original's extra step (its penultimate one)
                    path(leaf)[k].redundant = True
                agent.counters["rollout/branpo_" + mode] += 1
                plan.clear()
            if not plan:  # kept one, or the last truncation point tried: B = τ≤k (Algorithm 1)
                start.prefix_end = True
        jobs = [(t, leaf, plan) for t, leaf, plan in jobs if plan]
    return tree_groups


def _states(tree: Tree) -> list[Node]:
    """Set H(s) (CARL Eq. 6-8) on every state of `tree` (root and inner nodes); return them."""
    states = [n for n in walk(tree.root) if n.children]
    for s in states:
        s.entropy = sum(action_nll(c) for c in s.children) / len(s.children)
    return states


def carl(agent: Agent, examples, rng: random.Random, cfg: CARLRollout) -> list[list[Tree]]:
    """CARL App. C.1 (progressive rollout; carl-entropy), one tree per prompt: N0 chains from the
    root, then N forks, each a full trajectory from the state of lowest action density n(s) / H(s)
    (Eq. 12): n(s) actions sampled at s, H(s) their mean length-normalised NLL (Eq. 6-8). It samples
    N0/N + 1/2 of the actions of GRPO with N chains (Eq. 14: a fork starts halfway down, on
    average). The N0 chains' steps are marked `phase1` (App. C.1, carl-phase1)."""
    N0, N = cfg.carl_N0, cfg.carl_N
    tree_groups = [[agent.new_tree(ex, f"p{i}")] for i, ex in enumerate(examples)]
    agent.run([(trees[0], trees[0].root) for trees in tree_groups for _ in range(N0)])
    for step in (n for [t] in tree_groups for n in walk(t.root) if n.parent is not None):
        step.phase1 = True
    for _ in range(N):  # lowest n/H = highest H/n
        agent.run(
            [(t, max(_states(t), key=lambda s: s.entropy / len(s.children))) for [t] in tree_groups]
        )
    for [t] in tree_groups:
        _states(t)  # the final H(s), kept on the tree
    return tree_groups


def jaccard_prune(children: list[Node], k: int) -> list[Node]:
    """TreePS-RAG §2.2: keep min(k, |children|) search children, one per cluster of a hierarchical
    clustering (average linkage) on the Jaccard distance 1 - |P_i ∩ P_j| / |P_i ∪ P_j| of their
    retrieved doc-id sets. The dendrogram is cut into exactly k clusters (cut_tree; fcluster's
    maxclust returns fewer on tied distances)."""
    if len(children) <= k:
        return children
    sets = [set(c.doc_ids) for c in children]
    dist = [[1 - len(a & b) / len(a | b) if a | b else 0.0 for b in sets] for a in sets]
    labels = cut_tree(
        linkage(squareform(dist, checks=False), method="average"), n_clusters=k
    ).ravel()
    first = {}
    for c, label in zip(children, labels):
        first.setdefault(label, c)  # the first sampled member represents its cluster
    return list(first.values())


def treeps(agent: Agent, examples, rng: random.Random, cfg: TreePSRollout) -> list[list[Tree]]:
    """TreePS-RAG §2.2 (Algorithm 1, phase 1; treeps-pruning), layer by layer from M(0) = {root}: at
    depth d each retained parent gets B_d = ceil(N / |M(d-1)|) children (Eq. 2), every tree's layer
    in one engine call; answers (and abnormal ends) are leaves; of each parent's search children
    min(N_retain, count) are kept by Jaccard clustering as M(d), the rest pruned (a retried invalid
    step joins M(d) unpruned). At the depth limit D (0: max_turns + 1) the kept search children end
    with reward 0 (Alg. 1 l. 24; treeps-pruning). Then N_train (0: N) root-to-leaf paths per tree
    are drawn with `rng` and their leaves marked `sampled`: the trajectories advantages.treeps
    trains (§2.3). N, N_retain, D, N_train: cfg.treeps_N, _retain, _D, _train."""
    N, N_retain = cfg.treeps_N, cfg.treeps_retain
    D, N_train = cfg.treeps_D or agent.cfg.max_turns + 1, cfg.treeps_train or cfg.treeps_N
    trees = [agent.new_tree(ex, f"p{i}") for i, ex in enumerate(examples)]
    retained = [[t.root] for t in trees]  # M(d-1) per tree
    for d in range(1, D + 1):
        frontier = [
            (t, p)
            for t, parents in zip(trees, retained)
            for p in parents
            for _ in range(math.ceil(N / len(parents)))
        ]
        if not frontier:
            break
        agent.step(frontier)
        for i, parents in enumerate(retained):
            kept = []
            for p in parents:
                search = [
                    c
                    for c in p.children
                    if c.action == "search"  # Alg. 1 l. 11
                    and (not c.ended or c.flags == ["max_turns"])
                ]  # the limit ended too
                keep = jaccard_prune(search, N_retain)
                p.children = [c for c in p.children if c not in search or c in keep]
                kept += [c for c in p.children if c in keep or not c.ended]  # + retried invalid
            # Alg. 1 l. 24: leaves at D, reward 0
            for c in [c for c in kept if d == D and not c.ended]:
                agent._end(c, "max_turns", 0.0)
            retained[i] = kept
    for t in trees:
        pool = scored_leaves(t.root)
        # §2.3: "randomly sample N trajectories"
        for leaf in rng.sample(pool, min(N_train, len(pool))):
            leaf.sampled = True
    return [[t] for t in trees]


def at2po_pick(tree: Tree, n: int) -> list[Node]:
    """AT2PO's selection (official `sample_expansion_nodes`, "entropy"): the n best of the root and
    the non-leaf steps by H(x) - alpha (siblings - 1), H = `action_nll` (the root's 0), siblings
    its parent's children (the root's: its own); ties go breadth first; too few candidates cycle."""
    score = lambda x: action_nll(x) - AT2PO_ALPHA * max(0, len((x.parent or x).children) - 1)
    ranked = sorted((x for x in walk(tree.root) if x.children), key=lambda x: (-score(x), x.depth))
    return [ranked[k % len(ranked)] for k in range(n)]


def at2po_fit(tree: Tree, k: int, rng: random.Random):
    """AT2PO's fixed leaf count (official `sample_leaves`): of more than k leaves (breadth first), k
    drawn with `rng` are kept and the others pruned, with the steps left without a leaf; fewer are
    padded with copies of the last leaf (breadth first) as its siblings, trained as trajectories."""
    leaves = sorted(tree.leaves(), key=lambda x: x.depth)  # breadth first: by depth, stable
    keep = rng.sample(leaves, k) if len(leaves) > k else leaves
    for node in (x for x in leaves if x not in keep):
        while len(node.parent.children) == 1 and node.parent.parent is not None:
            node = node.parent  # the highest step with no other leaf below
        node.parent.children.remove(node)
    own = [f.name for f in fields(Node) if f.name not in ("id", "parent", "children")]
    for _ in range(k - len(leaves)):  # copies of the last leaf: every field but its place
        leaves[-1].parent.add_child(**{name: copy(getattr(leaves[-1], name)) for name in own})


def at2po(agent: Agent, examples, rng: random.Random, cfg: AT2PORollout) -> list[list[Tree]]:
    """AT2PO §3, Entropy-Guided Tree Expansion (official code: the offline tree search of
    vllm_rollout_with_tools_tree_offline.py), one tree per prompt: M chains from the root, then L
    rounds in which each tree's N nodes picked by `at2po_pick` are resampled, each by one new full
    continuation from its parent (the root: from itself), all trees in one batch; ended steps are
    leaves (at2po-truncated-leaf). `at2po_fit` then prunes or pads each tree to K leaves. M, N, L,
    K: cfg.tree_M, tree_N, tree_L, at2po_leaves (0: M + L N, the leaves grown)."""
    M, N, L = cfg.tree_M, cfg.tree_N, cfg.tree_L
    trees = [agent.new_tree(ex, f"p{i}") for i, ex in enumerate(examples)]
    agent.run([(t, t.root) for t in trees for _ in range(M)])
    for _ in range(L):  # a step picked is sampled again from its parent; the root from itself
        agent.run([(t, x.parent or x) for t in trees for x in at2po_pick(t, N)])
    for t in trees:
        at2po_fit(t, cfg.at2po_leaves or M + L * N, rng)
    return [[t] for t in trees]


def arpo_branch(heads: list, made: list[int], roots: list[Node], M: int, rng: random.Random):
    """ARPO §3, entropy-based adaptive rollout (equation numbers unchecked: no copy of the paper is
    kept), as its official code's "Apply beam search" block, after a wave. heads: the open (prompt,
    step, first), first the first step of its chain or branch; made: trajectories started per
    prompt, updated. Prompt by prompt (first appearance), while fewer than M, each step draws U =
    rng.random() once and, if U - beta ΔH <= tau (ΔH = H(step) - H(first), H = `action_nll`),
    branches ARPO_BEAM - 1 times, as many as M leaves room for; a prompt with no open step starts a
    chain. Returns the new heads."""
    new = []
    for i in dict.fromkeys(i for i, _, _ in heads):
        for step, first in [(s, f) for j, s, f in heads if j == i]:
            dH = action_nll(step) - action_nll(first)
            if made[i] < M and rng.random() - ARPO_BETA * dH <= ARPO_TAU:  # one decision a step
                for _ in range(min(ARPO_BEAM - 1, M - made[i])):
                    new.append((i, step, None))  # its first step: not sampled yet
                    made[i] += 1
    for i in (i for i in range(len(roots)) if made[i] < M and all(i != j for j, _, _ in heads)):
        new.append((i, roots[i], None))
        made[i] += 1
    return new


def arpo(agent: Agent, examples, rng: random.Random, cfg: ARPORollout) -> list[list[Tree]]:
    """ARPO §3, Entropy-based Adaptive Rollout (official code: vllm_rollout_with_tools.py), one tree
    per prompt of M trajectories: N = min(grpo_G, M) chains from the root, stepped a wave at a time,
    every prompt's open steps (searches with their observation) in one batch; after each wave
    `arpo_branch` branches open steps by their entropy change ΔH and starts a chain for a prompt
    with none open (arpo-entropy, arpo-branch-step, arpo-initial-entropy). N, M: grpo_G, arpo_M."""
    M, trees = cfg.arpo_M, [agent.new_tree(ex, f"p{i}") for i, ex in enumerate(examples)]
    made = [min(cfg.grpo_G, M)] * len(trees)  # trajectories started per prompt
    heads = [(i, t.root, None) for i, t in enumerate(trees) for _ in range(made[i])]
    while heads:  # (prompt, node, the first step of its chain or branch, None before it)
        steps = zip(heads, agent.step([(trees[i], node) for i, node, _ in heads]))
        heads = [(i, x, first or x) for (i, _, first), (_, x) in steps if not x.ended]
        heads += arpo_branch(heads, made, [t.root for t in trees], M, rng)
    return [[t] for t in trees]


def vineppo(agent: Agent, examples, rng: random.Random, cfg: VinePPORollout) -> list[list[Tree]]:
    """VinePPO §4 (official code: MathEpisodeGeneratorWithMCAdvantages; equation numbers unchecked:
    no copy of the paper is kept), one tree per prompt: G = grpo_G chains, their leaves marked
    `sampled` (trained), then K = vineppo_K full continuations, never trained, from the root and
    each step but the last of every chain neither discarded nor truncated, in one batch:
    advantages.vineppo's V(s) (vineppo-contexts)."""
    trees = [agent.new_tree(ex, f"p{i}") for i, ex in enumerate(examples)]
    chains = [t for t in trees for _ in range(cfg.grpo_G)]  # each chain's tree
    contexts: dict[Node, Tree] = {}  # s_t -> its tree, once: the root's K serve all its chains
    for t, end in zip(chains, agent.run([(t, t.root) for t in chains])):
        end.sampled = True  # a trained path; the continuations below are not
        if end.scored and not truncated(end):
            contexts |= {s: t for s in [t.root, *path(end)[:-1]]}
    agent.run([(t, s) for s, t in contexts.items() for _ in range(cfg.vineppo_K)])
    return [[t] for t in trees]


def igpo(agent: Agent, examples, rng: random.Random, cfg: GRPORollout) -> list[list[Tree]]:
    """IGPO §3: GRPO's grpo_G chains per prompt, then each node's gold-answer log-prob."""
    tree_groups = chain(agent, examples, rng, cfg)
    agent.believe([t for trees in tree_groups for t in trees])
    return tree_groups


# --------------------------------------------------------------------------------------------------
# The algorithm registry: --algo picks one entry, train.py's loop calls it.


@dataclass(frozen=True)
class Algo:
    """One paper: how it grows each prompt's trees, how it turns their rewards into advantages."""

    grow: Callable  # a strategy above: (agent, examples, rng, its knobs) -> trees per prompt
    credit: Callable  # advantages.py's function: (one prompt's trees, CreditConfig) -> Trajectories


ALGOS = {
    "grpo": Algo(chain, advantages.grpo),
    "tree_grpo": Algo(tree_grpo, advantages.tree_grpo),
    "branpo": Algo(branpo, advantages.branpo),
    "carl": Algo(carl, advantages.carl),
    "treeps": Algo(treeps, advantages.treeps),
    "gigpo": Algo(chain, advantages.gigpo),  # GiGPO's groups come from plain GRPO chains
    "at2po": Algo(at2po, advantages.at2po),
    "arpo": Algo(arpo, advantages.arpo),
    "vineppo": Algo(vineppo, advantages.vineppo),
    "igpo": Algo(igpo, turns.igpo),
    "mtgrpo": Algo(chain, turns.mtgrpo),  # its turn rewards: read off GRPO's chains
}


@dataclass
class RolloutConfig(
    VinePPORollout,
    ARPORollout,
    AT2PORollout,
    TreePSRollout,
    CARLRollout,
    BranPORollout,
    TreeGRPORollout,
    TreeShape,
    GRPORollout,
):
    """Every paper's rollout knobs, each paper's class in tree.py (the last base's flags come
    first), and which paper (the credit options: CreditConfig)."""

    algo: Literal[*ALGOS] = "tree_grpo"
    """Which paper: its rollout strategy and its credit function (ALGOS, the registry)."""
