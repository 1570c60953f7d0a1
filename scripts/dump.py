"""`python -m scripts.dump`: one rollout batch of the embedded default's warm start, grown by one
algo's strategy and dumped as JSON (advantages.py --trees FILE --prompt K reads it); with --plot,
every algo's trees on one of its prompts, drawn with their credit.

    python -m scripts.dump --algo treeps --dump dump.json --n_prompts 2
"""

import os
import random
import time
from dataclasses import dataclass, fields
from typing import Literal

import rollout
from advantages import CreditConfig
from infra import data, draw, files, flags, health, loaders
from infra.engines import RULES as ENGINE_RULES
from infra.engines import make_engine
from infra.policy import load_policy, model_problem
from infra.protocol import AgentConfig
from infra.search import BM25Retriever, load_corpus
from scripts.credit import drawing, save_trees
from tree import depth_rule


@dataclass
class DumpArgs:
    """`python -m scripts.dump --algo ALGO --dump FILE`: one rollout batch on the embedded default,
    dumped as JSON."""

    dump: str
    """Output JSON: one list of trees per prompt (advantages.py --trees FILE --prompt I)."""
    n_prompts: int = 4
    """Questions of --split to roll out (spread over the hops)."""
    model: str = "out/warmstart"
    """Policy directory or hub name (train.py writes the warm start to out/warmstart)."""
    world: str = "out/world"
    """Embedded world directory (written on first use)."""
    engine: Literal["auto", "hf", "vllm"] = "auto"
    """Generation engine."""
    split: Literal["train", "dev", "test"] = "train"
    """Which questions of the world."""
    plot: str = ""
    """Also grow every other method on the same questions (at the knobs given); draw all to this
    PNG."""
    plot_prompt: int = 0
    """With --plot: which of the prompts to draw."""
    seed: int = 0
    """Seed of the engine's sampling and the strategies' random choices (train.py's --seed)."""


def main():
    """`python -m scripts.dump ...`: grow, dump, print the batch's metrics; with --plot, draw every
    method on one of its prompts."""
    args, r, c, agent_cfg = flags.parse(DumpArgs, rollout.RolloutConfig, CreditConfig, AgentConfig)
    no_model = model_problem(args.model)
    if args.model == "out/warmstart" and not os.path.exists(args.model):
        no_model = (
            "no policy in out/warmstart: train one first (python train.py warmstart, ~5 min "
            "on 2 cores, or any train.py run), or pass --model DIR"
        )
    no_out = [
        files.unwritable(args.dump, "--dump"),
        args.plot and files.unwritable(args.plot, "--plot"),
    ]
    flags.check(
        (args, r, agent_cfg),
        rollout.RULES + ENGINE_RULES + [("n_prompts", "an integer >= 1", lambda v: v >= 1)],
        [
            depth_rule(r, agent_cfg),
            (no_model, no_model),
            *zip(no_out, no_out),  # checked before the work, not after it
            (
                not 0 <= args.plot_prompt < args.n_prompts,
                f"--plot_prompt {args.plot_prompt}: must be in [0, --n_prompts)",
            ),
        ],
    )
    world = data.ensure_world(args.world)
    rows = data.spread(loaders.load_rows(world, args.split), args.n_prompts)
    model, tok = load_policy(args.model)
    engine = make_engine(args.engine, model, tok, args.model)
    retriever = BM25Retriever(load_corpus(os.path.join(world, "corpus.jsonl")))
    agent = rollout.Agent(engine, retriever, tok, agent_cfg, args.seed)
    algo = rollout.ALGOS[r.algo]
    t0 = time.perf_counter()
    tree_groups = algo.grow(agent, rows, random.Random(args.seed), r)  # a list of trees per prompt
    save_trees(tree_groups, args.dump)
    seconds = time.perf_counter() - t0
    print(f"{r.algo}: {len(tree_groups)} prompts in {seconds:.1f} s -> {args.dump}")
    for k, v in {**health.metrics(tree_groups), **agent.counters}.items():
        print(f"  {k:40} {v:10.2f}")
    print(
        f"credit assignment of the first prompt: python advantages.py --algo {r.algo} --trees "
        f"{args.dump} --prompt 0 --render"
    )
    if args.plot:  # every other method on the same questions, from a fresh agent as its own dump
        panels = []
        for name, other in rollout.ALGOS.items():
            fresh = rollout.Agent(engine, retriever, tok, agent_cfg, args.seed)
            rng = random.Random(args.seed)
            batch = tree_groups if name == r.algo else other.grow(fresh, rows, rng, r)
            trees = batch[args.plot_prompt]
            mine = [f.name for f in fields(r) if f.name.startswith(name.split("_")[0] + "_")]
            used = ", ".join(f"{f}={getattr(r, f)}" for f in mine)  # its knobs: grpo_G, tree_M, ...
            tokens = sum(t.stats["generated_tokens"] for t in trees)
            credit = other.credit(trees, c)
            panels.append(
                {
                    "algo": name,
                    "nodes": drawing(trees, credit),
                    "note": f"{used}\n{tokens} tokens generated",
                }
            )
        ex = rows[args.plot_prompt]
        draw.figure(panels, args.plot, f"{ex.question}  (answer: {' / '.join(ex.golden_answers)})")
        print(f"prompt {args.plot_prompt} under every method -> {args.plot}")


if __name__ == "__main__":
    main()
