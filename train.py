"""RL for multi-turn search agents: every paper's rollout and credit assignment, one PPO loss, under
Accelerate.

    python train.py --algo tree_grpo             # grpo | tree_grpo | branpo | carl | treeps
    accelerate launch train.py --algo tree_grpo  # under your `accelerate config` (DDP, ...)
    python train.py warmstart --out DIR --world DIR  # only the embedded default's warm start,
                                                     # retrained into DIR

With no --model it runs the embedded default: the generated world (infra/data.py), BM25 and a tiny
Llama warm-started on gold trajectories (infra/warmstart.py); CPU only, no downloads.

Deviations from the papers, each cited by its name:
- loss-form: PPO clipped surrogate per token with the per-token advantage, token-mean over the
  mini-batch (verl's default; "seq-mean-token-mean" optional), k3 KL to the frozen initial policy on
  the trained tokens as a loss term (GRPO style), not a reward penalty.
- tis-old-policy: TIS ("Cut the Bill" §5.5.2) weighs the policy-gradient term per token by
  min(pi_old / pi_rollout, tis_cap); pi_rollout is the engine's log-prob of each sampled token.
  pi_theta, pi_old and pi_ref share one forward and precision (the accelerator's autocast under
  mixed precision). A float32 run on the HF engine takes pi_old from the engine, whose log-probs are
  the trainer's (`exact_logprobs`, tested; TIS weight 1); otherwise (vLLM, or mixed precision: the
  engine's incremental forward rounds differently) the trainer recomputes pi_old and TIS corrects
  the engine/trainer difference. BranPO Table 5's "rollout IS batch normalize" (mean-1 weights per
  batch) is not applied: Cut the Bill has none.
- dual-clip (`--dual_clip c`, 0 = off by default): a token with A < 0 loses at most -A c (Ye et
  al. 2020; verl's clip_ratio_c, always on there, 3). The papers' objective has no such cap.
- log-ratio-bound: every log ratio is clamped to [-20, 20] before its exp, as verl does: the loss
  changes only past a 4.9e8-fold ratio, where float32 overflows, and has no gradient there.
- k3-unclamped: verl's low_var_kl also clamps k3 to [-10, 10]; we do not: that takes the KL's
  gradient from exactly the tokens that moved furthest from pi_ref (ref - logp > 2.61 or < -11),
  where the anchor matters most; log-ratio-bound keeps k3 finite, grad_clip bounds the step.
"""

import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import gather_object
from transformers import get_constant_schedule_with_warmup

import retriever
import rollout
from advantages import CreditConfig
from eval import evaluate
from infra import data, engines, flags, health, protocol, run, rundir, warmstart
from infra.logprobs import TokenLogp
from infra.warmstart import WarmConfig
from retriever import RetrieverConfig
from rollout import AgentConfig, RolloutConfig
from tree import Sample, Trajectory, to_samples, trained_steps


@dataclass
class Args:
    """The run; with RolloutConfig, CreditConfig, AgentConfig, RetrieverConfig and WarmConfig, every
    flag of `train.py --help`."""

    model: str = ""
    """Policy: HF hub name or local directory; empty = the embedded default (warm-started tiny
    Llama)."""
    gguf_file: str = ""
    """A GGUF file inside --model's directory to load (transformers dequantizes it)."""
    data: str = ""
    """Train questions: .parquet / .jsonl / a directory with train.* / a datasets name; empty = the
    embedded world."""
    test_data: str = ""
    """Test questions (same forms); empty = --data's test split (a single --data file has none),
    else the world's."""
    corpus: str = ""
    """Retrieval corpus JSONL ({"id", "contents"}); empty = the embedded world's corpus."""
    max_env_error_rate: float = 0.5
    """Stop when the share of trajectories lost to retrieval errors (abnormal/env_error) stays above
    this."""
    env_error_patience: int = 3
    """Steps in a row above --max_env_error_rate before the run stops."""
    engine: Literal["auto", "hf", "vllm"] = "auto"
    """Rollout engine: vLLM when installed with CUDA, else Hugging Face generate (printed once at
    start)."""
    vllm_gpu_memory_utilization: float = 0.3
    """Share of each rank's GPU memory its vLLM engine may take (the rank's training replica shares
    that GPU)."""
    vllm_dtype: Literal["", "float32", "bfloat16", "float16"] = ""
    """vLLM's dtype; empty = the policy's, so TIS corrects kernel differences, not rounding to a
    narrower type."""
    out_dir: str = "out"
    """Where the world, warm start, runs (metrics.jsonl, curve.png, checkpoints) go."""
    run_name: str = ""
    """Subdirectory of out_dir/runs for this run; empty = ALGO-seedSEED (e.g. tree_grpo-seed0)."""
    seed: int = 0
    """Seed of the run: data order, the engine's sampling, the strategies' random choices, the warm
    start."""

    steps: int = 15
    """RL steps (each: one rollout batch, then PPO updates)."""
    prompts_per_step: int = 8
    """Questions rolled out per step (Search-R1 / Tree-GRPO use 512 / 64 on GPUs)."""
    lr: float = 5e-5
    """AdamW learning rate (the papers use 1e-6 for 3B-7B models; a tiny model needs more)."""
    warmup_steps: int = 3
    """Linear learning-rate warmup, in optimizer steps."""
    ppo_mini_batches: int = 2
    """Optimizer steps per rollout batch (the batch is split into this many mini-batches)."""
    ppo_epochs: int = 1
    """Passes over the rollout batch."""
    micro_batch_size: int = 8
    """Rows per forward/backward pass (gradient accumulation inside a mini-batch)."""
    clip_low: float = 0.2
    """PPO clip: ratio >= 1 - clip_low."""
    clip_high: float = 0.2
    """PPO clip: ratio <= 1 + clip_high (DAPO's clip-higher uses 0.28)."""
    dual_clip: float = 0.0
    """Dual-clip c: a token with A < 0 loses at most -A c (verl's clip_ratio_c); 0 = off."""
    kl_coef: float = 0.001
    """Weight of the k3 KL to the frozen initial policy (Search-R1, BranPO Table 5: 0.001)."""
    tis_cap: float = 2.0
    """TIS cap C on pi_old / pi_rollout (BranPO Table 5: 2.0; its batch-normalize option: README); 0
    disables TIS."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    """How per-token losses are averaged."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""

    eval_every: int = 15
    """Evaluate on test questions every this many steps (and at the end, and at the start:
    --eval_start); 0 = never."""
    eval_n: int = 1000
    """Test questions per evaluation, spread evenly over the split (the world's: 250 per hop
    count)."""
    eval_start: bool = True
    """With --eval_every: evaluate the starting policy too (off where it was evaluated already, e.g.
    by compare.py)."""
    checkpoint_every: int = 10
    """Save model, optimizer, scheduler, RNG states and step every this many steps (the last two are
    kept), and on SIGTERM / Ctrl-C; 0 = only then."""
    resume: bool = False
    """Continue from the run's last checkpoint (from the one before when the last is unreadable)."""
    overwrite: bool = False
    """Delete what the run directory holds and start fresh (without --resume or this, a run there is
    refused)."""
    log_with: Literal["", *run.TRACKERS] = ""
    """An accelerate tracker to log to as well (pip install it: README, Metrics); empty = none."""


def validate(args: Args, *configs):
    """Every flag against its module's RULES, and the rules that tie flags together (infra/run.py's
    validate, given the top level's); one message lists all broken."""
    rollout_cfg, agent = (
        next(c for c in configs if isinstance(c, t)) for t in (RolloutConfig, AgentConfig)
    )
    depth = rollout.depth_rule(rollout_cfg, agent)
    run.validate(args, configs, rollout.RULES + retriever.RULES, depth)


# --------------------------------------------------------------------------------------------------
# Loss


LOG_RATIO_BOUND = 20.0  # log-ratio-bound: |log ratio| <= 20 before any exp (verl's); e^20 = 4.9e8


def token_logprobs(model, ids: torch.Tensor, attn: torch.Tensor, entropy: bool = False):
    """Per-token log pi(token_t | tokens_<t), aligned with `ids` (entry 0 is 0); with `entropy`,
    also the policy's entropy at t (no gradient), else None. Chunk by chunk (infra/logprobs.py)."""
    logits = model(input_ids=ids, attention_mask=attn).logits  # (B, T, V)
    B, T, V = logits.shape
    targets = ids.roll(-1, 1)  # (B, T): the next token; each row's last is a dummy, dropped below
    logp, ent = TokenLogp.apply(logits.reshape(B * T, V), targets.reshape(B * T), entropy)  # (BT,)
    aligned = lambda x: F.pad(x.view(B, T)[:, :-1], (1, 0))
    return aligned(logp), aligned(ent) if entropy else None  # (B, T), (B, T) or None


def ppo_loss(logp, old_logp, ref_logp, rollout_logp, adv, mask, args: Args, denom: float):
    """Per-token PPO-clip surrogate x TIS weight + kl_coef x k3 KL, summed over masked tokens /
    `denom` (loss-form, tis-old-policy, dual-clip, log-ratio-bound, k3-unclamped).

    All inputs (B, T). ratio = exp(logp - old_logp); surrogate = max(-A ratio, -A clip(ratio,
    1-eps_l, 1+eps_h)), for A < 0 at most -A c (--dual_clip c); TIS weight w = min(exp(old_logp -
    rollout_logp), C), no gradient; k3 = exp(ref - logp) - (ref - logp) - 1. `denom` is the
    mini-batch's token count (token-mean) or row count (seq-mean-token-mean; rows are then first
    averaged over their own tokens), so micro-batches add up to the mini-batch mean."""
    m = mask.bool()  # (B, T)
    # Untrained positions (prompt, observations, padding) may hold anything, inf or NaN: their log
    # ratios become 0 before any exp and torch.where drops their loss (x mask would make inf x 0 =
    # NaN in the loss or its gradient). log-ratio-bound then clamps each log ratio to +-20.
    bound = LOG_RATIO_BOUND
    bounded = lambda x: torch.where(m, x, 0.0).clamp(-bound, bound)
    ratio = torch.exp(bounded(logp - old_logp))  # (B, T)
    # (B, T)
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1 - args.clip_low, 1 + args.clip_high)
    surrogate = torch.max(unclipped, clipped)  # (B, T)
    stats = {"clipped": (clipped > unclipped)[m].detach()}  # the clipped branch: no gradient (verl)
    if args.dual_clip:  # dual-clip: a token with A < 0 loses at most -A c, whatever its ratio
        dual = -adv * args.dual_clip  # (B, T)
        dual_clipped = (adv < 0) & (dual < surrogate)  # (B, T): the cap is active, no gradient
        surrogate = torch.where(dual_clipped, dual, surrogate)  # (B, T)
        stats["dual_clipped"] = dual_clipped[m]
    tis = torch.exp(bounded(old_logp - rollout_logp))  # (B, T)
    weight = tis.clamp(max=args.tis_cap) if args.tis_cap > 0 else torch.ones_like(tis)
    log_ratio_ref = bounded(ref_logp - logp)  # (B, T)
    kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1  # (B, T), k3 estimator, >= 0 (k3-unclamped)
    per_token = torch.where(m, surrogate * weight.detach() + args.kl_coef * kl, 0.0)  # (B, T)
    if args.loss_agg == "token-mean":
        loss = per_token.sum() / denom
    else:
        loss = (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / denom
    stats.update(ratio=ratio[m].detach(), tis=tis[m].detach(), kl=kl[m].detach())
    return loss, stats


def collate(samples, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of tree.Sample into (B, T) tensors."""
    T = max(len(s.input_ids) for s in samples)
    pad = lambda xs, v: [x + [v] * (T - len(x)) for x in xs]
    return {
        "ids": torch.tensor(pad([s.input_ids for s in samples], pad_id)),  # (B, T)
        "attn": torch.tensor(pad([[1] * len(s.input_ids) for s in samples], 0)),  # (B, T)
        # (B, T)
        "mask": torch.tensor(pad([s.loss_mask for s in samples], 0), dtype=torch.float),
        "adv": torch.tensor(pad([s.advantages for s in samples], 0.0)),  # (B, T)
        "rollout_logp": torch.tensor(pad([s.logprobs for s in samples], 0.0)),
    }  # (B, T)


# --------------------------------------------------------------------------------------------------
# One RL step (the loop in main): grow -> credit -> samples -> log-probs -> PPO update -> sync


def sample_metrics(trajectories: list[Trajectory], samples: list[Sample]) -> dict[str, float]:
    """What the step trains: tokens, rows, and update actions (CARL's |D_upd|, counted per
    trajectory: `tree.trained_steps`)."""
    actions = sum(1 for _ in trained_steps(trajectories))
    return {
        "train/tokens_trained": float(sum(sum(s.loss_mask) for s in samples)),
        "train/actions_trained": float(actions),
        "train/samples": float(len(samples)),
    }


def micro_batches(
    samples, counts, accelerator, model, ref_model, args: Args, pad_id: int, old_from_engine: bool
):
    """This rank's samples as mini-batches of micro-batches, with pi_old (the trainer's before this
    step's updates, or the engine's: tis-old-policy) and pi_ref log-probs by the policy's forward
    and precision.

    The mini-batches are one process's, however many ranks share the step: the step's samples in
    rank order (`counts`: every rank's number of samples; rank r rolled out the r-th contiguous
    share of the step's prompts) cut into micro-batches of micro_batch_size rows, dealt round-robin
    into min(ppo_mini_batches, micro-batches) mini-batches. Each rank takes its own rows of each
    mini-batch, micro_batch_size at a time, and adds zero-weight one-token rows up to the count of
    the rank with the most (DDP's collectives need the same number of backward passes on every
    rank); `update` divides by the mini-batch's count over all ranks. With one process these are
    exactly its micro-batches, in its order."""
    size, first = args.micro_batch_size, sum(counts[: accelerator.process_index])
    n_mini = max(1, min(args.ppo_mini_batches, math.ceil(sum(counts) / size)))
    # the step's samples g in [lo, lo + n) that fall in mini-batch j
    rows = lambda lo, n, j: [g for g in range(lo, lo + n) if g // size % n_mini == j]
    starts = [sum(counts[:r]) for r in range(len(counts))]
    padding = Sample([pad_id], [0], [0.0], [0.0], "padding")
    minis = []
    model.eval()
    for j in range(n_mini):
        mine = [samples[g - first] for g in rows(first, len(samples), j)]
        most = max(math.ceil(len(rows(lo, n, j)) / size) for lo, n in zip(starts, counts))
        mini = []
        for i in range(0, most * size, size):
            chunk = mine[i : i + size] or [padding]
            b = {k: v.to(accelerator.device) for k, v in collate(chunk, pad_id).items()}
            with torch.no_grad():
                b["old_logp"] = (
                    b["rollout_logp"]
                    if old_from_engine
                    else token_logprobs(model, b["ids"], b["attn"])[0]
                )
                with accelerator.autocast():  # the prepared policy's forward runs under this
                    b["ref_logp"], _ = token_logprobs(ref_model, b["ids"], b["attn"])
            mini.append(b)
        minis.append(mini)
    return minis


def update(minis, accelerator, model, optimizer, scheduler, args: Args):
    """PPO epochs x mini-batches of micro-batches (`micro_batches`). Each rank's loss is its
    tokens' (or rows') sum over the mini-batch's count on all ranks, times the number of ranks:
    Accelerate's gradient mean over ranks then gives one process's token-mean (or
    seq-mean-token-mean) over the whole mini-batch. Returns per-micro-batch stats, the gradient
    norms and losses (over all ranks) of the applied optimizer steps, and how many were skipped for
    a non-finite loss or norm (never applied; every rank decides alike)."""
    model.train()
    stats, grad_norms, losses = [], [], []
    for _ in range(args.ppo_epochs):
        for mb in minis:
            total = sum(
                b["mask"].sum().item()
                if args.loss_agg == "token-mean"
                else (b["mask"].sum(-1) > 0).sum().item()
                for b in mb
            )
            total = accelerator.reduce(
                torch.tensor(float(total), device=accelerator.device), "sum"
            ).item()
            loss_sum = 0.0
            for b in mb:
                logp, entropy = token_logprobs(model, b["ids"], b["attn"], entropy=True)
                loss, s = ppo_loss(
                    logp,
                    b["old_logp"],
                    b["ref_logp"],
                    b["rollout_logp"],
                    b["adv"],
                    b["mask"],
                    args,
                    max(total, 1.0) / accelerator.num_processes,
                )
                s["entropy"] = entropy[b["mask"].bool()].detach()
                accelerator.backward(loss)
                loss_sum += loss.item()
                stats.append(s)
            norm = accelerator.clip_grad_norm_(model.parameters(), args.grad_clip)
            # the mini-batch's loss: the mean of the ranks' (float64: one process's sum, unrounded)
            loss_sum = accelerator.reduce(
                torch.tensor(loss_sum, dtype=torch.float64, device=accelerator.device), "mean"
            ).item()
            # else NaN/inf: skipped
            if math.isfinite(loss_sum) and torch.isfinite(torch.as_tensor(norm)).all():
                optimizer.step()
                scheduler.step()
                grad_norms.append(float(norm))
                losses.append(loss_sum)
            optimizer.zero_grad()  # a skipped mini-batch's gradients are dropped, never applied
    return stats, grad_norms, losses, args.ppo_epochs * len(minis) - len(grad_norms)


# --------------------------------------------------------------------------------------------------
# Evaluation


def run_eval(step: int, eval_agent: rollout.Agent, test_rows, accelerator) -> dict:
    """Evaluate on the test questions, each rank its share (eval.evaluate); rank 0 prints a line;
    every rank returns the eval/ metrics row."""
    m = evaluate(eval_agent, test_rows, processes=accelerator)
    hops = " ".join(f"{k[3:]} {v:.2f}" for k, v in m.items() if k.startswith("em_hop"))
    accelerator.print(
        f"step {step}: eval EM {m['em']:.3f} F1 {m['f1']:.3f} on {m['n']} questions"
        + (f" (by hops: {hops})" if hops else "")
        + (f" ({m['env_errors']} more lost to retrieval errors)" if m["env_errors"] else "")
    )
    return {"step": step, **{f"eval/{k}": v for k, v in m.items() if isinstance(v, (int, float))}}


# --------------------------------------------------------------------------------------------------


def main(
    args: Args,
    rollout_cfg: RolloutConfig,
    credit_cfg: CreditConfig,
    agent_cfg: AgentConfig,
    retriever_cfg: RetrieverConfig,
    warm: WarmConfig,
):
    # ---- config: checked, derived values, logged whole
    t_start, seconds = time.perf_counter(), {}  # seconds: wall time per stage, printed at the end
    validate(args, rollout_cfg, credit_cfg, agent_cfg, retriever_cfg, warm)
    run_dir = os.path.join(
        args.out_dir, "runs", args.run_name or f"{rollout_cfg.algo}-seed{args.seed}"
    )
    world = os.path.join(args.out_dir, "world") if not (args.data and args.corpus) else ""
    # the embedded default's warm start
    model_path = args.model or os.path.join(args.out_dir, "warmstart")
    accelerator = Accelerator(log_with=args.log_with or None, project_dir=run_dir)
    main_proc, rank, ranks = (
        accelerator.is_main_process,
        accelerator.process_index,
        accelerator.num_processes,
    )
    # the processes, the seed; rank 0 locks run_dir, writes config.json, starts the trackers
    run_lock = run.start(  # noqa: F841 (open, so locked, while main runs)
        accelerator, run_dir, args, (args, rollout_cfg, credit_cfg, agent_cfg, retriever_cfg), warm
    )

    # ---- init: data, retriever, policy, reference, engine, agent
    # one rank writes the world (and below, the warm start); the others wait for it
    if world and main_proc:
        data.ensure_world(world)
    accelerator.wait_for_everyone()
    seconds["world"] = time.perf_counter() - t_start
    train_rows = data.load_rows(args.data or world, "train")
    test_rows = (
        data.spread(data.load_rows(args.test_data or args.data or world, "test"), args.eval_n)
        if args.eval_every
        else []
    )  # validate() made sure this is a real test split, never the training rows
    # files first: a bad corpus or a dead server stops the run before any model loads. Every rank
    # searches with its own client; rank 0 connects first (it writes --index_dir, the others read
    # it), the others say nothing that rank 0 said
    with accelerator.main_process_first(), run.quiet(not main_proc):
        search, where = retriever.connect(
            retriever_cfg, args.corpus or os.path.join(world, "corpus.jsonl")
        )
    # the embedded default: warm-start once, in this run's agent format, and cache it
    if not args.model:
        t0 = time.perf_counter()
        if main_proc:
            # one BM25 index per run
            warmstart.ensure(
                model_path, world, warm, agent_cfg, args.seed, rollout, evaluate, search
            )
        accelerator.wait_for_everyone()
        seconds["warm start"] = time.perf_counter() - t0
    model, tok = engines.load_policy(model_path, args.gguf_file or None)
    ref_model, _ = engines.load_policy(model_path, args.gguf_file or None)  # frozen: the KL anchor
    ref_model.requires_grad_(False).eval().to(accelerator.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = get_constant_schedule_with_warmup(optimizer, args.warmup_steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    # every rank rolls out with its own engine (vLLM: one per GPU, in the launcher's process group)
    # and its own sampling stream: seed + RANK_SEED x rank (rank 0: the run's seed, as one process)
    with run.quiet(not main_proc):
        engine = engines.make_engine(
            args.engine,
            accelerator.unwrap_model(model),
            tok,
            model_path,
            dtype=args.vllm_dtype,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            **({"distributed_executor_backend": "external_launcher"} if ranks > 1 else {}),
        )
    rank_seed = args.seed + run.RANK_SEED * rank
    agent = rollout.Agent(engine, search, tok, agent_cfg, rank_seed)
    eval_agent = rollout.Agent(engine, search, tok, protocol.for_eval(agent_cfg), rank_seed)
    # are the engine's log-probs pi_old (tis-old-policy)? Only the HF engine's in a float32 run
    old_from_engine = engine.exact_logprobs and accelerator.mixed_precision == "no"
    source = "the HF engine's log-probs" if old_from_engine else "the trainer's forward"
    accelerator.print(
        f"pi_old: {source} ({type(engine).__name__}, mixed precision "
        f"{accelerator.mixed_precision})"
        + (f"; {ranks} processes, each rolling out its share of every step" if ranks > 1 else ""),
        flush=True,
    )
    rng = random.Random(rank_seed)  # strategies' random choices
    order = list(range(len(train_rows)))
    random.Random(args.seed).shuffle(order)

    # ---- resume: the checkpoint's state, and the metrics logged up to it
    start, history, skipped = run.resume(
        accelerator, run_dir, args.resume, rng, agent.counters, engine, model
    )
    if start == 0 and args.eval_every and args.eval_start:
        t0 = time.perf_counter()
        run.log(
            run_eval(0, eval_agent, test_rows, accelerator), history, run_dir, accelerator, args
        )
        seconds["eval"] = time.perf_counter() - t0

    # ---- loop (SIGTERM, Ctrl-C: the step finishes, a checkpoint is saved, the run exits)
    asked, stopped = run.stop_on_signals(), None
    bar = flags.progress(
        range(start, args.steps),
        desc=rollout_cfg.algo,
        disable=not main_proc,
        initial=start,
        total=args.steps,
    )
    for step in bar:
        t0 = time.perf_counter()
        # each rank rolls out and credits its contiguous share of the step's prompts (all the trees
        # of a prompt on one rank: every group statistic is computed where its leaves are)
        share = args.prompts_per_step // ranks
        at = step * args.prompts_per_step + rank * share
        batch = [train_rows[order[(at + i) % len(order)]] for i in range(share)]
        algo = rollout.ALGOS[rollout_cfg.algo]  # the paper: its strategy and credit function
        with torch.no_grad():  # 1. grow the trees (rollout.py)
            prompts = algo.grow(agent, batch, rng, **algo.grow_knobs(rollout_cfg))
        # ---- EDIT HERE: the credit, one function per paper (advantages.py) ---------------------
        # 2. credit
        knobs = algo.credit_knobs(rollout_cfg, credit_cfg)
        trajectories = [t for trees in prompts for t in algo.credit(trees, **knobs)]
        samples = to_samples(trajectories)  # 3. training samples: token ids, mask, advantages
        counts = gather_object([len(samples)])  # every rank's, in rank order (waits for the last)
        t1 = time.perf_counter()
        minis = micro_batches(
            samples, counts, accelerator, model, ref_model, args, tok.pad_token_id, old_from_engine
        )  # 4. log-probs of pi_old and pi_ref
        t2 = time.perf_counter()
        # ---- EDIT HERE: the loss (ppo_loss above) ----------------------------------------------
        stats, grad_norms, losses, n_skipped = update(
            minis, accelerator, model, optimizer, scheduler, args
        )  # 5. the PPO update
        skipped += n_skipped
        t3 = time.perf_counter()
        # 6. weight sync: each rank's engine samples from the new weights from the next step on
        engine.load_weights(accelerator.unwrap_model(model))
        # 7. the step's metrics, over every rank's trees, samples and tokens (in rank order)
        on_cpu = [{k: v.cpu() for k, v in s.items()} for s in stats]
        every = gather_object([(prompts, sample_metrics(trajectories, samples), on_cpu)])
        metrics = {
            **rollout.metrics([trees for r in every for trees in r[0]]),
            **{k: sum(r[1][k] for r in every) for k in every[0][1]},
            **health.train_metrics([s for r in every for s in r[2]], grad_norms, losses, args),
            **{
                "train/skipped_steps": skipped,
                "train/lr": scheduler.get_last_lr()[0],
                "train/time_rollout": t1 - t0,
                "train/time_logprob": t2 - t1,
                "train/time_update": t3 - t2,
            },
        }
        for k in ("rollout", "logprob", "update"):
            seconds[f"RL {k}"] = seconds.get(f"RL {k}", 0.0) + metrics[f"train/time_{k}"]
        run.log({"step": step + 1, **metrics}, history, run_dir, accelerator, args)
        degraded = run.check_env_errors(history, args, where)  # a retrieval outage's step
        health.check_finite(accelerator.unwrap_model(model), step + 1, len(grad_norms), n_skipped)
        bar.set_postfix(
            reward=f"{metrics['rollout/reward']:.3f}",
            em=f"{metrics['rollout/em']:.2f}",
            kl=f"{metrics['train/kl']:.4f}",
            refresh=False,
        )
        if args.eval_every and ((step + 1) % args.eval_every == 0 or step + 1 == args.steps):
            t0 = time.perf_counter()
            row = run_eval(step + 1, eval_agent, test_rows, accelerator)
            run.log(row, history, run_dir, accelerator, args)
            seconds["eval"] = seconds.get("eval", 0.0) + time.perf_counter() - t0
        stop = step + 1 < args.steps and run.stop_asked(accelerator, asked)  # on every rank alike
        save = args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and not degraded
        if stop or save:
            run.checkpoint(accelerator, run_dir, step + 1, skipped, rng, agent.counters)
        if stop:
            stopped = asked.get("signal", signal.SIGTERM)  # SIGTERM: it reached another rank only
            bar.n = step + 1  # the steps done (tqdm counts them lazily, at each redraw)
            bar.close()
            break
    if main_proc and stopped:
        print(run.stopped_message(run_dir, stopped, step + 1, args.steps))
    elif main_proc:
        rundir.save_final(accelerator.unwrap_model(model), tok, run_dir)  # whole or not at all
        print(run.summary(history, seconds, time.perf_counter() - t_start, run_dir))
    run.end(accelerator, engine, stopped)  # the engine closed, every process ended together


if __name__ == "__main__":
    # the warm start alone (infra/warmstart.py), given the agent and its eval
    if sys.argv[1:2] == ["warmstart"]:
        warmstart.main(sys.argv[2:], rollout, evaluate)
    else:
        main(
            *flags.parse(
                Args, RolloutConfig, CreditConfig, AgentConfig, RetrieverConfig, WarmConfig
            )
        )
