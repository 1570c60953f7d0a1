"""What --pack_trees saves, method by method: the sharing of a step's rows, the time of the
log-probs and the update in the path form and packed, and the activation memory at 3 B.

    python benchmarks/tree_train.py              # every --algo at the main job's settings, then
                                                 # bushier Tree-GRPO trees: ~10 min on 2 cores
    python benchmarks/tree_train.py --repeats 5 --algos tree_grpo carl

For each row: --prompts train prompts (the world's first) grown by the method's own rollout under
the main job's warm start (out_dir/warmstart, trained first if missing, as train.py does; or
--policy), credited by its own function, cut into train.py's micro-batches (`train.micro_batches`,
--micro_batch_size rows each). Printed:
- path / packed tokens: the micro-batches' row tokens (what the path form runs in each forward)
  against their tries' nodes (what --pack_trees runs); their ratio is the sharing;
- the time of pi_old and pi_ref's log-probs and the update (`train.add_old_and_ref_logprobs` then
  `train.update`, from the same weights each time), path form then packed, --repeats times: the
  paired ratio packed / path, its median and range (below 1: packing is faster);
- activation memory of a micro-batch at 3 B (the memory plan's one-GPU checkpointing recipe,
  Qwen2.5-3B, 2 rows of 4,096 tokens): the plan's activations scale with the tokens a forward
  runs, so the packed micro-batch holds (path / packed) fewer of them, plus its N x N attention
  mask (1 byte a pair; SDPA's memory-efficient kernel takes it as it is); a derived figure, never
  measured on a GPU.

Where packing loses: rows that share little (chains: only the prompt) pay for the mask and the trie
and save almost nothing, and SDPA given a mask leaves its flash kernel (on a GPU; the CPU path runs
the same math either way). Outputs: the table, printed, and OUT/results.md.
"""

import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import retriever  # noqa: E402  (the project's modules, from the repository root)
import rollout  # noqa: E402
import train  # noqa: E402
from benchmarks import memory_plan  # noqa: E402
from benchmarks.compare import parse_train  # noqa: E402
from benchmarks.compare_arms import algo_config, arm_name, tree  # noqa: E402
from infra import data, engines, flags, loaders, pack, policy  # noqa: E402
from rollout import Agent  # noqa: E402
from scripts import warmstart  # noqa: E402
from tree import to_samples  # noqa: E402

BUSHIER = [tree(4, 2, 1), tree(4, 4, 2)]  # credit truth's shared trees, and bushier still
PLAN_TOKENS = 2 * 4096  # the memory plan's one-GPU recipe: micro-batch 2 x 4,096 tokens


@dataclass
class Args:
    algos: list[str] = field(default_factory=lambda: list(rollout.ALGOS))
    """The methods, each at train.py's defaults for it (the main job's settings)."""
    bushier: bool = True
    """Also Tree-GRPO at (M, N, L) = (4, 2, 1) and (4, 4, 2)."""
    prompts: int = 8
    """Train prompts grown per row (train.py's prompts per step)."""
    micro_batch_size: int = 8
    """Rows per micro-batch: what one trie can share (train.py's default)."""
    repeats: int = 3
    """Timed pairs (path form, packed) per row."""
    threads: int = 1
    """Torch threads."""
    policy: str = ""
    """The policy that grows the trees and is updated; empty = the main job's warm start."""
    train_flags: str = ""
    """train.py flags for the world, agent and seed (no algorithm knobs)."""
    out: str = "out/tree_train"
    """Where results.md goes."""


def grow_samples(agent: Agent, examples: list, flags_: str, seed: int) -> list:
    """The training rows of `examples`' trees grown and credited as the train.py flags `flags_`."""
    cfg, credit_cfg = algo_config(flags_)
    method = rollout.ALGOS[cfg.algo]
    groups = method.grow(agent, examples, random.Random(seed), cfg)
    return to_samples([t for trees in groups for t in method.credit(trees, credit_cfg)])


def step_time(model, ref, samples, args: train.Args, accelerator, pad_id: int) -> float:
    """Seconds of one step's log-probs and update on `samples` from `model`'s weights (kept)."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    t0 = time.perf_counter()
    minis = train.micro_batches(samples, [len(samples)], accelerator, args, pad_id)
    train.add_old_and_ref_logprobs(minis, accelerator, model, ref, False)
    train.update(minis, accelerator, model, optimizer, scheduler, args)
    seconds = time.perf_counter() - t0
    model.load_state_dict(saved)
    return seconds


def measure(name, samples, model, ref, a: Args, accelerator, pad_id, per_token: float) -> dict:
    """One row: the tokens, the paired time ratios, the activation memory at 3 B (`per_token`:
    the plan's activation GiB per token)."""
    path_tokens = packed_tokens = 0
    for i in range(0, len(samples), a.micro_batch_size):
        b = train.collate(samples[i : i + a.micro_batch_size], pad_id)
        p = pack.pack(b["ids"], b["attn"])
        path_tokens, packed_tokens = path_tokens + p.path_tokens, packed_tokens + len(p.ids)
    ratios, times = [], {False: [], True: []}
    for _ in range(a.repeats):
        pair = {}
        for packing in (False, True):
            args = train.Args(micro_batch_size=a.micro_batch_size, pack_trees=packing)
            pair[packing] = step_time(model, ref, samples, args, accelerator, pad_id)
            times[packing].append(pair[packing])
        ratios.append(pair[True] / pair[False])
    sharing = path_tokens / packed_tokens
    packed_3b = PLAN_TOKENS / sharing
    return {
        "row": name,
        "rows": len(samples),
        "path": path_tokens,
        "packed": packed_tokens,
        "sharing": sharing,
        "path_s": statistics.median(times[False]),
        "packed_s": statistics.median(times[True]),
        "ratio": statistics.median(ratios),
        "ratio_range": (min(ratios), max(ratios)),
        "gib_path": per_token * PLAN_TOKENS,
        "gib_packed": per_token * packed_3b + packed_3b**2 / 2**30,
    }


def plan_gib_per_token() -> float:
    """Activation GiB per token of the memory plan's one-GPU checkpointing recipe at 3 B."""
    recipe = next(r for r in memory_plan.RECIPES if "HF engine (docs/gpu.md's command)" in r.name)
    table = json.loads((memory_plan.SHAPES / "h100_measured.json").read_text())  # gpu_memory's
    gib, _, _ = memory_plan.activation(recipe, [{**r, "source": "table"} for r in table["rows"]])
    return gib / (recipe.micro_batch * recipe.length)


def table(rows: list[dict], a: Args) -> str:
    lines = [
        f"Tree training: --pack_trees against the path form, {a.prompts} prompts a row, "
        f"micro-batches of {a.micro_batch_size}, {a.repeats} timed pairs, {a.threads} thread(s).",
        "",
        "| row | rows | path tokens | packed tokens | sharing | path s | packed s | packed / path "
        "time (median, range) | activations at 3 B, GiB: path → packed |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lo, hi = r["ratio_range"]
        lines.append(
            f"| {r['row']} | {r['rows']} | {r['path']} | {r['packed']} | {r['sharing']:.2f}x | "
            f"{r['path_s']:.2f} | {r['packed_s']:.2f} | {r['ratio']:.2f} [{lo:.2f}, {hi:.2f}] | "
            f"{r['gib_path']:.2f} → {r['gib_packed']:.2f} |"
        )
    return "\n".join(lines)


def main(a: Args):
    from accelerate import Accelerator

    flags.check(
        a, [("prompts micro_batch_size repeats threads", "an integer >= 1", lambda v: v >= 1)]
    )
    unknown = [x for x in a.algos if x not in rollout.ALGOS]
    if unknown:
        raise SystemExit(f"--algos {unknown}: not methods; pass some of {list(rollout.ALGOS)}")
    torch.set_num_threads(a.threads)
    targs, _, _, agent_cfg, retriever_cfg, warm = parse_train(a.train_flags)
    world = os.path.join(targs.out_dir, "world")
    data.ensure_world(world)
    search, _ = retriever.connect(retriever_cfg, os.path.join(world, "corpus.jsonl"))
    start = a.policy or os.path.join(targs.out_dir, "warmstart")
    if not a.policy:
        warmstart.ensure(start, world, warm, agent_cfg, targs.seed, search)
    model, tok = policy.load_policy(start)
    ref = policy.load_policy(start)[0].requires_grad_(False)
    engine = engines.make_engine("hf", model.eval(), tok, start, 32)
    examples = loaders.load_rows(world, "train")[: a.prompts]
    settings = [f"--algo {algo}" for algo in a.algos] + BUSHIER * a.bushier
    accelerator, rows, per_token = Accelerator(cpu=True), [], plan_gib_per_token()
    for flags_ in flags.progress(settings, desc="tree training"):
        agent = Agent(engine, search, tok, agent_cfg, targs.seed)
        samples = grow_samples(agent, examples, flags_, targs.seed)
        name = arm_name(flags_)  # the method and its knobs, as the comparison names its arms
        rows.append(measure(name, samples, model, ref, a, accelerator, tok.pad_token_id, per_token))
    text = table(rows, a)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main(*flags.parse(Args))
