"""The warm start's driver: `train` fits infra/warmstart.py's tiny Llama on the world's gold
trajectories, demonstrated by rollout.py's agent and validated by eval.py's `evaluate`; `ensure`
caches it for train.py (one per --out_dir, under a lock); `main` is `python train.py warmstart`.

    python train.py warmstart --out out/warmstart --world out/world   # alone
"""

import os
import random
import time
from dataclasses import dataclass, replace
from functools import partial

from safetensors import SafetensorError, safe_open

from eval import evaluate
from infra import data, files, flags, loaders, protocol
from infra.engines import HFEngine
from infra.policy import model_problem
from infra.search import BM25Retriever, load_corpus
from infra.warmstart import (
    RULES,
    WarmConfig,
    cached_settings,
    copy_batch,
    fit,
    free_mib,
    save,
    settings,
    steps_rule,
    tiny_llama,
    trajectory_batch,
    world_tokenizer,
)
from rollout import RULES as ROLLOUT_RULES
from rollout import Agent


def train(
    out_dir: str,
    world_dir: str,
    cfg: WarmConfig,
    agent_cfg,
    seed: int,
    search=None,
) -> str:
    """Warm-start a fresh tiny Llama on the world (the two stages, in the prompt and observation
    format of `agent_cfg`, rollout.py's AgentConfig; `seed` seeds the weights and the data) and
    save it with its tokenizer to out_dir. rollout.py's Agent demonstrates, eval.py's `evaluate`
    validates. `search`: the run's retriever, searched
    when it is BM25 over the world's corpus (one index per run); otherwise the warm start builds its
    own."""
    tok = world_tokenizer()
    model = tiny_llama(tok, seed=seed)
    rows = [r for r in loaders.load_rows(world_dir, "train") if r.gold_queries]
    if not rows:
        raise ValueError(
            f"{world_dir}/train.jsonl has no rows with gold_queries; the warm start needs the "
            f"embedded world (python -m infra.data --out DIR)"
        )
    corpus = os.path.join(world_dir, "corpus.jsonl")
    if not (isinstance(search, BM25Retriever) and search.corpus.path == corpus):
        search = BM25Retriever(load_corpus(corpus))
    agent = Agent(None, search, tok, agent_cfg, seed)
    rng = random.Random(seed)
    # copy names AND wording: a thought restates the question's relations
    words = set(data.TEMPLATE_WORDS)
    pieces = sorted(
        i for p, i in tok.get_vocab().items() if data.syllabify(p.removeprefix("##")) or p in words
    )
    names, by_hops = sorted({n for r in rows for n in r.gold_queries}), {}
    for r in rows:
        by_hops.setdefault(r.hops, []).append(r)
    # every query a trajectory makes, in one call
    passages = agent.retriever.search(names, agent.cfg.topk)
    observations = {
        q: agent.observation_ids(protocol.format_passages(p)) for q, p in zip(names, passages)
    }
    trajectories = partial(trajectory_batch, agent, rng, by_hops, cfg, names, observations)

    copy_steps = 0
    # the induction heads form after a seed-dependent number of steps: run until they have
    if cfg.copy_steps:
        copy_loss, copy_steps = fit(
            model,
            partial(copy_batch, rng, pieces, cfg, tok.bos_token_id),
            cfg.copy_steps,
            cfg.warm_lr,
            tok.pad_token_id,
            "warm start: copy",
            floor=1.0,
            until=cfg.copy_loss,
        )
        print(
            f"warm start: copy loss {copy_loss:.3f} after {copy_steps} steps"
            + (
                f" (above --copy_loss {cfg.copy_loss}: the induction heads may not have formed; "
                "the trajectory stage will take longer)"
                if copy_steps == cfg.copy_steps
                else ""
            ),
            flush=True,
        )
    loss, _ = fit(
        model,
        trajectories,
        cfg.sft_steps,
        cfg.warm_lr,
        tok.pad_token_id,
        "warm start: trajectories",
    )
    steps, dev = cfg.sft_steps, data.spread(loaders.load_rows(world_dir, "dev"), cfg.val_n)
    while cfg.target_em:  # greedy dev EM with the agent's retriever and budgets
        greedy = Agent(
            HFEngine(model, tok), agent.retriever, tok, replace(agent_cfg, temperature=0), seed
        )
        m = evaluate(greedy, dev)
        hops = ", ".join(f"{k[6:]}-hop {v:.2f}" for k, v in m.items() if k.startswith("em_hop"))
        print(
            f"warm start: greedy dev EM {m['em']:.3f} after {steps} trajectory steps ({hops}); "
            f"target {cfg.target_em}",
            flush=True,
        )
        if m["em"] >= cfg.target_em:
            break
        if steps + cfg.sft_steps > cfg.sft_max_steps:
            raise RuntimeError(
                f"warm start failed: greedy dev EM {m['em']:.3f} < target_em {cfg.target_em} "
                f"after {steps} trajectory steps (sft_max_steps {cfg.sft_max_steps}); nothing was "
                f"saved to {out_dir}. Raise --sft_max_steps, try another --seed, or lower "
                "--target_em (0 = no check) at your own risk"
            )
        loss, _ = fit(
            model,
            trajectories,
            cfg.sft_steps,
            cfg.warm_lr / 2,
            tok.pad_token_id,
            "warm start: more",
        )
        steps += cfg.sft_steps
    record = {
        **settings(cfg, agent_cfg, seed),
        "world": world_dir,
        "final_loss": loss,
        "copy_steps_done": copy_steps,
        "sft_steps_done": steps,
        **({"dev_em": m["em"]} if cfg.target_em else {}),
    }
    try:  # whole or not at all: a full disk leaves no half warm start for a later run to read
        files.write_dir(out_dir, partial(save, model, tok, record))
    except (OSError, RuntimeError, SafetensorError) as e:  # torch: RuntimeError
        raise OSError(
            f"saving the warm start to {out_dir} failed ({type(e).__name__}: {e}); nothing was "
            f"saved there. Free space on its disk ({free_mib(out_dir):.0f} MiB free), then rerun"
        ) from e
    return out_dir


def unreadable_weights(model_dir: str) -> str:
    """Which *.safetensors file of `model_dir` cannot be read (a truncated copy or save), found
    from its header without loading it; empty when none."""
    for name in sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors")):
        try:
            with safe_open(os.path.join(model_dir, name), "pt"):
                pass
        except (OSError, SafetensorError) as e:
            return f"{model_dir}/{name} cannot be read ({type(e).__name__}: {e}; truncated?)"
    return ""


def ensure(
    out_dir: str,
    world_dir: str,
    cfg: WarmConfig,
    agent_cfg,
    seed: int,
    search=None,
) -> str:
    """The cached warm-start checkpoint in out_dir; trained first (`train`, with `seed` and
    `search`) if it is not there yet. Under the lock OUT_DIR.lock: a second run waits
    for the first's warm start, then checks that its settings are this run's."""
    with data.claimed(out_dir.rstrip("/") + ".lock", f"the warm start {out_dir}"):
        swapped = files.finish_swap(out_dir)  # a save killed between its renames
        if swapped:
            print(f"warm start: {swapped}")
        saved = os.path.join(out_dir, "warmstart.json")  # written last: the warm start is complete
        was = cached_settings(saved)
        if was is not None:
            differ = {
                k: (was.get(k), v)
                for k, v in settings(cfg, agent_cfg, seed).items()
                if was.get(k) != v
            }
            if differ:
                raise ValueError(
                    f"the cached warm start in {out_dir} was trained with other "
                    f"settings (setting: (cached, asked)) {differ}; delete {out_dir} "
                    f"to retrain, match them, or give this run its own --out_dir"
                )
            problem = model_problem(out_dir) or unreadable_weights(out_dir)
            if problem:
                raise ValueError(
                    f"the cached warm start in {out_dir} is incomplete: {problem}; delete "
                    f"{out_dir} to retrain it"
                )
            print(f"warm start: cached in {out_dir}")
            return out_dir
        print(f"warm start: none in {out_dir}; training one (about 6 minutes on 2 CPU cores)")
        t0 = time.perf_counter()
        train(out_dir, world_dir, cfg, agent_cfg, seed, search)
        print(f"warm start: saved to {out_dir} in {time.perf_counter() - t0:.0f} s")
    return out_dir


@dataclass
class WarmArgs:
    """`python train.py warmstart`: where to read the world and write the checkpoint, and the seed
    (the agent format: AgentConfig)."""

    out: str = "out/warmstart"
    """Checkpoint directory (model + tokenizer + warmstart.json)."""
    world: str = "out/world"
    """Embedded world directory (written first if missing)."""
    seed: int = 0
    """Seed of the weights' initialisation and of the data (train.py's --seed)."""


def out_problem(out: str, world: str) -> str:
    """Why --out cannot take a warm start (it is replaced whole, with all it holds): it holds the
    --world, or it is not empty and not a warm start (no warmstart.json), or it holds a run
    (a run.lock or a metrics.jsonl); empty when it can."""
    real, held = os.path.realpath(out), sorted(os.listdir(out)) if os.path.isdir(out) else []
    if os.path.commonpath([real, os.path.realpath(world)]) == real:
        return (
            f"--out {out!r} holds --world {world!r}: the warm start replaces --out with all it "
            "holds, the world too; pass a directory of its own, e.g. --out OUT/warmstart"
        )
    if os.path.exists(out) and not os.path.isdir(out):
        return f"--out {out!r} is a file, not a directory; pass a new or empty directory"
    if held and "warmstart.json" not in held:
        return (
            f"--out {out!r} is not empty and is not a warm start (no warmstart.json; it holds "
            f"{', '.join(held[:8])}{', ...' * (len(held) > 8)}): the warm start would replace it "
            "with all it holds; pass a new or empty directory, e.g. --out OUT/warmstart"
        )
    runs = [d for d, _, names in os.walk(out) if {"run.lock", "metrics.jsonl"} & set(names)]
    if runs:
        return (
            f"--out {out!r} holds a run ({runs[0]}): the warm start would replace it with all it "
            "holds; pass a directory of its own, e.g. --out OUT/warmstart"
        )
    return ""


def main(argv: list[str]):
    """`python train.py warmstart ...` (`argv`: the arguments after `warmstart`): train a warm start
    into --out (new, empty, or a warm start, which is replaced) from the world in --world (written
    first if missing)."""
    cfg, a, agent_cfg = flags.parse(WarmConfig, WarmArgs, protocol.AgentConfig, args=argv)
    bad_out = out_problem(a.out, a.world)
    flags.check((cfg, agent_cfg), RULES + ROLLOUT_RULES, [steps_rule(cfg), (bad_out, bad_out)])
    world = data.ensure_world(a.world)
    with data.claimed(a.out.rstrip("/") + ".lock", f"the warm start {a.out}"):
        train(a.out, world, cfg, agent_cfg, a.seed)
