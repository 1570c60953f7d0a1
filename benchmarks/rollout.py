"""Rollout benchmark on the embedded default: what each paper's tree buys per generated token, and what the agent
loop costs on top of the engine. Prints figures; asserts nothing.

    python benchmarks/rollout.py                      # the warm-start policy in out/warmstart (train.py makes it)
    python benchmarks/rollout.py --n_prompts 8 --model DIR

For every strategy, at the budgets below (each about 8 full trajectories per prompt, so the rows compare at
equal budget), it prints the generated tokens, tool calls and leaves per prompt, leaves per 1,000 generated
tokens, and wall time. Then it compares the agent loop's token throughput (generation + parsing + retrieval +
observation) with the raw engine's on the same prompts at the same batch size.
"""
import os
import random
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cli  # noqa: E402
import data  # noqa: E402
import rollout  # noqa: E402
from engines import load_policy, make_engine  # noqa: E402
from retriever import BM25Retriever, load_corpus  # noqa: E402

BUDGETS = {  # ~8 full-trajectory units per prompt each
    "grpo": {"G": 8},  # 8 chains
    "tree_grpo": {"M": 4, "N": 2, "L": 1},  # M (1 + L N / 2) = 8 (corrected Tree-GRPO budget)
    "branpo": {"N": 4},  # 4 chains + tail branches (1-2 steps each, several per chain)
    "carl": {"N0": 1, "N": 14},  # N0 + N / 2 = 8 (CARL Eq. 14 in trajectory units)
    "treeps": {"N": 8, "D": 4, "N_retain": 2},  # ~N nodes per layer over D layers
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


def main(a: Args, cfg: rollout.AgentConfig):
    """Every strategy at BUDGETS, under the run's agent settings (train.py's budgets and --seed)."""
    world = data.ensure_world(a.world)
    rows = data.spread(data.load_rows(world, "train"), a.n_prompts)
    model, tok = load_policy(a.model)
    engine = make_engine(a.engine, model, tok, a.model)
    retriever = BM25Retriever(load_corpus(os.path.join(world, "corpus.jsonl")))
    print(f"\n{'strategy':10} {'tokens/prompt':>14} {'calls/prompt':>13} {'leaves/prompt':>14} "
          f"{'leaves/1k tok':>14} {'seconds':>8}")
    for name, hp in BUDGETS.items():
        agent = rollout.Agent(engine, retriever, tok, cfg)
        t0 = time.perf_counter()
        prompts = rollout.STRATEGIES[name][0](agent, rows, random.Random(cfg.seed), **hp)
        seconds = time.perf_counter() - t0
        s = rollout.metrics(prompts)
        tokens, leaves = s["rollout/tokens_per_prompt"], s["tree/leaves_per_prompt"]
        print(f"{name:10} {tokens:14.0f} {s['rollout/tool_calls_per_prompt']:13.1f} {leaves:14.1f} "
              f"{1000 * leaves / max(tokens, 1):14.2f} {seconds:8.1f}")

    # agent loop vs raw engine: the same first-wave prompts, the same batch size and sampling
    agent = rollout.Agent(engine, retriever, tok, cfg)
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
    print(f"\nagent loop: {loop_tps:.0f} tok/s over {len(trees)} trajectories ({agent.counters['rollout/waves']} waves); "
          f"raw engine, batch {len(trees)}: {raw_tps:.0f} tok/s -> the loop runs at {100 * loop_tps / raw_tps:.0f}% "
          f"of raw engine throughput")


if __name__ == "__main__":
    main(*cli.parse(Args, rollout.AgentConfig))
