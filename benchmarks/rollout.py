"""Rollout benchmark on the embedded default: what each paper's tree buys per generated token, and
what the agent loop costs on top of the engine. Prints figures; asserts nothing.

    python benchmarks/rollout.py  # the warm-start policy in out/warmstart (train.py makes it)
    python benchmarks/rollout.py --n_prompts 8 --model DIR
    VLLM_CPU_KVCACHE_SPACE=2 <vllm venv>/bin/python benchmarks/rollout.py --engine vllm \\
        --strategies tree_grpo

With the vLLM engine it also prints the prompt tokens each strategy fed the engine and how many of
them vLLM's prefix cache served instead of recomputing (the HF engine recomputes them all).

For every strategy, at the budgets below (each about 8 full trajectories per prompt, so the rows
compare at equal budget), it prints the generated tokens, tool calls and leaves per prompt, leaves
per 1,000 generated tokens, and wall time. Then it compares the agent loop's token throughput
(generation + parsing + retrieval + observation) with the raw engine's on the same prompts at the
same batch size.
"""

import os
import random
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import rollout
from infra import data, flags, health, loaders, protocol
from infra.engines import make_engine
from infra.policy import load_policy
from infra.search import BM25Retriever, load_corpus
from rollout import RolloutConfig

BUDGETS = {  # ~8 full-trajectory units per prompt each (RolloutConfig's knobs)
    "grpo": RolloutConfig(grpo_G=8),  # 8 chains
    # M (1 + L N / 2) = 8 (corrected Tree-GRPO budget)
    "tree_grpo": RolloutConfig(tree_M=4, tree_N=2, tree_L=1),
    "branpo": RolloutConfig(branpo_N=4),  # 4 chains + tail branches (1-2 steps each, several)
    "carl": RolloutConfig(carl_N0=1, carl_N=14),  # N0 + N / 2 = 8 (CARL Eq. 14 in trajectories)
    "treeps": RolloutConfig(treeps_N=8, treeps_D=4, treeps_retain=2),  # ~N nodes a layer, D layers
}


@dataclass
class Args:
    """What to measure."""

    model: str = "out/warmstart"
    """Policy directory (the embedded default's warm start)."""
    world: str = "out/world"
    """Embedded world directory (written if missing)."""
    n_prompts: int = 16
    """Train questions per strategy."""
    engine: str = "auto"
    """Generation engine: auto | hf | vllm."""
    strategies: str = "grpo,tree_grpo,branpo,carl,treeps"
    """Comma-separated strategies to run, each at its budget below."""
    vllm_block_size: int = 0
    """vLLM KV-cache block size in tokens (prefix caching reuses whole blocks); 0 = vLLM's default
    (16 on GPU, 128 on CPU, where it must be a multiple of 32)."""
    seed: int = 0
    """Seed of the engine's sampling and the strategies' random choices (train.py's --seed)."""


def main(a: Args, cfg: protocol.AgentConfig):
    """The chosen strategies at BUDGETS, under the run's agent settings (train.py's budgets) and
    --seed."""
    names = a.strategies.split(",")
    if set(names) - set(BUDGETS):  # checked before anything loads
        raise SystemExit(
            f"--strategies {a.strategies!r}: unknown {sorted(set(names) - set(BUDGETS))}; "
            f"choose from {','.join(BUDGETS)}"
        )
    world = data.ensure_world(a.world)
    rows = data.spread(loaders.load_rows(world, "train"), a.n_prompts)
    model, tok = load_policy(a.model)
    block = {"block_size": a.vllm_block_size} if a.vllm_block_size else {}
    engine = make_engine(a.engine, model, tok, a.model, **block)
    # strategy -> (prompt tokens, of which served by vLLM's prefix cache); vLLM only (HF's engine
    # has no prefix cache)
    prefill = {}
    retriever = BM25Retriever(load_corpus(os.path.join(world, "corpus.jsonl")))
    print(
        f"\n{'strategy':10} {'tokens/prompt':>14} {'calls/prompt':>13} {'leaves/prompt':>14} "
        f"{'leaves/1k tok':>14} {'seconds':>8}"
    )
    for name, hp in [(n, BUDGETS[n]) for n in names]:
        agent = rollout.Agent(engine, retriever, tok, cfg, a.seed)
        before = (getattr(engine, "prefill_tokens", 0), getattr(engine, "cached_prefill_tokens", 0))
        t0 = time.perf_counter()
        prompts = rollout.ALGOS[name].grow(agent, rows, random.Random(a.seed), hp)
        seconds = time.perf_counter() - t0
        if hasattr(engine, "cached_prefill_tokens"):
            prefill[name] = (
                engine.prefill_tokens - before[0],
                engine.cached_prefill_tokens - before[1],
            )
        s = health.metrics(prompts)
        tokens, leaves = s["rollout/tokens_per_prompt"], s["tree/leaves_per_prompt"]
        print(
            f"{name:10} {tokens:14.0f} {s['rollout/tool_calls_per_prompt']:13.1f} {leaves:14.1f} "
            f"{1000 * leaves / max(tokens, 1):14.2f} {seconds:8.1f}"
        )

    # the HF engine recomputes every prompt token of every call: its prefill is the first column
    if prefill:
        print(
            f"\nvLLM prefix cache (block size {a.vllm_block_size or 'default'}): prompt tokens "
            "per prompt, of which served from the cache"
        )
        for name, (total, cached) in prefill.items():
            share = 100 * cached / max(total, 1)
            print(f"{name:10} {total / len(rows):10.0f} {cached / len(rows):10.0f} ({share:.0f}%)")

    # agent loop vs raw engine: the same first-wave prompts, the same batch size and sampling
    agent = rollout.Agent(engine, retriever, tok, cfg, a.seed)
    trees = [agent.new_tree(r, f"p{i}.g{j}") for i, r in enumerate(rows) for j in range(8)]
    t0 = time.perf_counter()
    agent.run([(t, t.root) for t in trees])
    loop_seconds = time.perf_counter() - t0
    loop_tokens = sum(t.stats.get("generated_tokens", 0) for t in trees)
    t0 = time.perf_counter()
    outs = engine.generate([t.root.tokens for t in trees], agent.sampling)
    raw_seconds = time.perf_counter() - t0
    raw_tokens = sum(len(o.token_ids) for o in outs)
    loop_tps, raw_tps = loop_tokens / loop_seconds, raw_tokens / raw_seconds
    print(
        f"\nagent loop: {loop_tps:.0f} tok/s over {len(trees)} trajectories "
        f"({agent.counters['rollout/waves']} waves); raw engine, batch {len(trees)}: "
        f"{raw_tps:.0f} tok/s -> the loop runs at {100 * loop_tps / raw_tps:.0f}% of raw engine "
        "throughput"
    )


if __name__ == "__main__":
    main(*flags.parse(Args, protocol.AgentConfig))
