"""RL for multi-turn search agents: every paper's rollout and credit assignment, one PPO loss, under
Accelerate.

    python train.py --algo tree_grpo             # --algo: grpo, tree_grpo, branpo, carl, treeps,
                                                 # gigpo, at2po, arpo, vineppo, igpo, mtgrpo
                                                 # (rollout.ALGOS)
    accelerate launch train.py --algo tree_grpo  # under your `accelerate config` (DDP, ...)
    python train.py warmstart --out DIR --world DIR  # only the embedded default's warm start,
                                                     # retrained into DIR

With no --model it runs the embedded default: the generated world (infra/data.py), BM25 and a tiny
Llama warm-started on gold trajectories (infra/warmstart.py); CPU only, no downloads.

Deviations from the papers, each cited by its name (argued in docs/paper_code.md):
- loss-form: per-token PPO clip, token-mean over the mini-batch, k3 KL as a loss term, not a reward
- tis-old-policy: pi_old is the engine's on a float32 HF run, else the trainer's; no IS batch norm
- dual-clip: `--dual_clip c` caps a token with A < 0 at -A c (verl: always 3); off by default
- log-ratio-bound: every log ratio is clamped to [-20, 20] before its exp, as verl does
- k3-unclamped: k3 is not clamped to [-10, 10] as verl's low_var_kl does
- filter-run-questions: the data filter rolls out only the run's questions, not the whole pool
- constant-groups-kept: the data filter drops only all-0 and all-1 groups; other constant ones stay
"""

import math
import os
import random
import sys
from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from accelerate.utils import gather_object
from transformers import get_constant_schedule_with_warmup

import retriever
import rollout
from advantages import CreditConfig
from eval import evaluate
from infra import flags, pack, policy, protocol, run, rundir, shard, startup
from infra.bookkeeping import Book
from infra.warmstart import WarmConfig
from retriever import RetrieverConfig
from rollout import AgentConfig, RolloutConfig
from scripts import warmstart
from tree import Sample, depth_rule, to_samples


@dataclass
class PPOConfig:
    """The update: PPO-clip, KL, TIS, over mini-batches of micro-batches (the run's flags: Args)."""

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
    """TIS cap C on pi_old / pi_rollout (BranPO Table 5: 2.0); 0 disables TIS."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    """How per-token losses are averaged."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    pack_trees: bool = False
    """Lay each micro-batch's rows out once as their prefix tree: a shared prefix is computed
    once, the loss the same up to rounding (infra/pack.py; off: the main job's bits are the path
    form's)."""


@dataclass
class Args(PPOConfig):
    """The run, and its update (PPOConfig); with RolloutConfig, CreditConfig, AgentConfig,
    RetrieverConfig and WarmConfig, every flag of `train.py --help`."""

    model: str = ""
    """Policy: HF hub name or local directory; empty = the embedded default (warm-started tiny
    Llama)."""
    gguf_file: str = ""
    """A GGUF file inside --model's directory to load (transformers dequantizes it)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (same gradients, ~1/3 more compute; what a 3 B policy needs to fit an 80 GB GPU)."""
    ref_dtype: Literal["compute", "float32"] = "compute"
    """The frozen reference's weights: the mixed-precision dtype (bf16 under --mixed_precision
    bf16: half the memory; float32 without mixed precision), or float32 always."""
    data: str = ""
    """Train questions: .parquet / .jsonl / a directory with train.* / a datasets name OWNER/NAME;
    empty = the embedded world."""
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
    vllm_sleep: bool = False
    """vLLM's sleep mode (CUDA only): its weights go to CPU memory and its KV cache is dropped
    while the trainer updates, and come back for the weight sync: the update gets that memory."""
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
    """An accelerate tracker to log to as well (pip install it: docs/metrics.md); empty = none."""
    filter_rollouts: int = 0
    """Cut the Bill §3's data filter: before RL, roll each question the run would train on out this
    many times (chains, the starting policy), keep those whose rewards differ (paper 8); 0 = off."""


def validate(args: Args, *configs):
    """Every flag against its module's RULES, and the rules that tie flags together (infra/run.py's
    validate, given the top level's); one message lists all broken."""
    rollout_cfg, agent = (
        next(c for c in configs if isinstance(c, cls)) for cls in (RolloutConfig, AgentConfig)
    )
    depth = depth_rule(rollout_cfg, agent)
    run.validate(args, configs, rollout.RULES + retriever.RULES, depth)


# --------------------------------------------------------------------------------------------------
# Loss


LOG_RATIO_BOUND = 20.0  # log-ratio-bound: |log ratio| <= 20 before any exp (verl's); e^20 = 4.9e8
LOGP_CHUNK = 2**24  # logits per chunk in TokenLogp: 64 MiB of float32, 110 Qwen positions
# a micro-batch's tensors that ppo_loss takes, by their names there
LOSS_INPUTS = ("old_logp", "ref_logp", "rollout_logp", "adv", "mask")


class TokenLogp(torch.autograd.Function):
    """log_softmax(logits)[target] per row (and the entropy, asked), LOGP_CHUNK logits at a time:
    (N, V) logits of any float dtype in, (N,) float32 out. Backward recomputes each chunk's
    log-softmax, so only the logits are kept, never a float32 copy of the vocabulary; values and
    gradients are bit for bit one log_softmax's. The entropy has no gradient (it is only logged)."""

    @staticmethod
    def forward(ctx, logits, targets, with_entropy: bool):  # (N, V), (N,)
        rows = max(1, LOGP_CHUNK // logits.shape[1])
        logp = torch.empty(len(logits), device=logits.device)  # (N,)
        entropy = torch.empty(len(logits) if with_entropy else 0, device=logits.device)  # (N,)|(0,)
        for s in range(0, len(logits), rows):
            logp_all = logits[s : s + rows].float().log_softmax(-1)  # (c, V)
            logp[s : s + rows] = logp_all.gather(1, targets[s : s + rows, None])[:, 0]  # (c,)
            if with_entropy:
                entropy[s : s + rows] = -(logp_all.exp() * logp_all).sum(-1)  # (c,)
        ctx.save_for_backward(logits, targets)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad, _):  # (N,): d loss / d logp
        logits, targets = ctx.saved_tensors  # (N, V), (N,)
        rows = max(1, LOGP_CHUNK // logits.shape[1])
        out = torch.empty_like(logits)  # (N, V)
        for s in range(0, len(logits), rows):
            with torch.enable_grad():  # the chunk's forward again, differentiated on its own
                x = logits[s : s + rows].detach().requires_grad_()  # (c, V)
                logp = x.float().log_softmax(-1).gather(1, targets[s : s + rows, None])[:, 0]
                (out[s : s + rows],) = torch.autograd.grad(logp, x, grad[s : s + rows])  # (c, V)
        return out, None, None


def token_logprobs(model, ids: torch.Tensor, attn: torch.Tensor, entropy=False, packed=None):
    """Per-token log pi(token_t | tokens_<t), aligned with `ids` (entry 0 is 0); with `entropy`,
    also the policy's entropy at t (no gradient), else None. Chunk by chunk (TokenLogp); the rows
    `packed` as one prefix tree (--pack_trees), where given."""
    if packed is not None:
        return pack.token_logprobs(model, packed, TokenLogp.apply, entropy)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (B, T, V)
    B, T, V = logits.shape
    targets = ids.roll(-1, 1)  # (B, T): the next token; each row's last is a dummy, dropped below
    logp, ent = TokenLogp.apply(logits.reshape(B * T, V), targets.reshape(B * T), entropy)  # (BT,)
    aligned = lambda x: F.pad(x.view(B, T)[:, :-1], (1, 0))
    return aligned(logp), aligned(ent) if entropy else None  # (B, T), (B, T) or None


def ppo_loss(*, logp, old_logp, ref_logp, rollout_logp, adv, mask, args: PPOConfig, denom: float):
    """Per-token PPO-clip surrogate x TIS weight + kl_coef x k3 KL, summed over masked tokens /
    `denom` (loss-form, tis-old-policy, dual-clip, log-ratio-bound, k3-unclamped).

    Every input by keyword, the tensors (B, T): logp and a micro-batch's LOSS_INPUTS. ratio =
    exp(logp - old_logp); surrogate = max(-A ratio, -A clip(ratio, 1-eps_l, 1+eps_h)), for A < 0
    at most -A c (--dual_clip c); TIS weight w = min(exp(old_logp - rollout_logp), C), no gradient;
    k3 = exp(ref - logp) - (ref - logp) - 1. `denom` is the mini-batch's token count (token-mean)
    or row count (seq-mean-token-mean; rows are then first averaged over their own tokens), so
    micro-batches add up to the mini-batch mean."""
    m = mask.bool()  # (B, T)
    # Untrained positions (prompt, observations, padding) may hold anything, inf or NaN: their log
    # ratios become 0 before any exp and torch.where drops their loss (x mask would make inf x 0 =
    # NaN in the loss or its gradient). log-ratio-bound then clamps each log ratio to +-20.
    bounded = lambda x: torch.where(m, x, 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
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


# --------------------------------------------------------------------------------------------------
# One RL step (the loop in main): grow -> credit -> samples -> log-probs -> PPO update -> sync


def collate(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad tree.Samples into one micro-batch of (B, T) tensors."""
    T = max(len(s.input_ids) for s in samples)
    pad = lambda rows, v: torch.tensor([row + [v] * (T - len(row)) for row in rows])  # (B, T)
    return {
        "ids": pad([s.input_ids for s in samples], pad_id),
        "attn": pad([[1] * len(s.input_ids) for s in samples], 0),
        "mask": pad([s.loss_mask for s in samples], 0).float(),
        "adv": pad([s.advantages for s in samples], 0.0),
        "rollout_logp": pad([s.logprobs for s in samples], 0.0),
    }


def old_from_engine(engine, accelerator, model) -> bool:
    """Whether pi_old is the rollout engine's log-probs (tis-old-policy): only where they are the
    trainer's own, the HF engine's (`exact_logprobs`) sampling from the trainer's model in a
    float32 run (no mixed precision, no FSDP2 copy); else the trainer's forward recomputes them.
    Rank 0 says which, once."""
    precision, ranks = accelerator.mixed_precision, accelerator.num_processes
    exact = engine.exact_logprobs and precision == "no" and not shard.sharded(model)
    source = "the HF engine's log-probs" if exact else "the trainer's forward"
    shares = f"; {ranks} processes, each rolling out its share of every step" if ranks > 1 else ""
    kind = type(engine).__name__
    accelerator.print(f"pi_old: {source} ({kind}, mixed precision {precision}){shares}", flush=True)
    return exact


def mini_batch_partition(n: int, size: int, mini_batches: int) -> list[list[int]]:
    """PPO's mini-batches of a step's n samples (every rank's, in rank order) as index lists: cut in
    order into micro-batches of `size` rows, micro-batch i in mini-batch i mod m, m the asked
    `mini_batches` or, if fewer, the micro-batches' count (`micro_batches` says so). The same in
    every epoch: no reshuffle (docs/loss.md)."""
    m = max(1, min(mini_batches, math.ceil(n / size)))  # no mini-batch without a micro-batch
    return [[g for g in range(n) if g // size % m == j] for j in range(m)]


def micro_batches(samples, counts, accelerator, args: PPOConfig, pad_id) -> list[list[dict]]:
    """The step's samples in mini-batches of micro_batch_size-row micro-batches
    (`mini_batch_partition`; with several processes shard.deal gives each rank its own rows of
    each, padded to the same count), each collated onto this rank's device."""
    padding = Sample([pad_id], [0], [0.0], [0.0], "padding")  # a rank's micro-batch with no row
    size, wanted = args.micro_batch_size, args.ppo_mini_batches
    parts = mini_batch_partition(sum(counts), size, wanted)
    if len(parts) < wanted:  # fewer micro-batches than mini-batches asked for: said, every time
        accelerator.print(
            f"--ppo_mini_batches {wanted}: this step's {sum(counts)} samples fill {len(parts)} "
            f"micro-batches of --micro_batch_size {size}, so {len(parts)} mini-batches of one"
        )
    rows = shard.deal(parts, counts, accelerator.process_index, size)  # this rank's, per mini-batch
    to_device = lambda b: {k: v.to(accelerator.device) for k, v in b.items()}  # (B, T) each
    packed = lambda b: b | {"packed": pack.pack(b["ids"], b["attn"])} if args.pack_trees else b
    return [
        [packed(to_device(collate([samples[i] for i in m] or [padding], pad_id))) for m in mini]
        for mini in rows
    ]


def add_old_and_ref_logprobs(minis, accelerator, model, ref_model, old_from_engine: bool):
    """Add to each micro-batch of `minis` its pi_old log-probs, "old_logp" (the engine's where they
    are the trainer's, tis-old-policy; else the policy's forward), and its pi_ref ones, "ref_logp",
    both by the policy's forward and precision, before the update."""
    model.eval()
    for b in (b for mini in minis for b in mini):
        with torch.no_grad():
            logprobs = partial(token_logprobs, ids=b["ids"], attn=b["attn"], packed=b.get("packed"))
            b["old_logp"] = b["rollout_logp"] if old_from_engine else logprobs(model)[0]
            with accelerator.autocast():  # the prepared policy's forward runs under this
                b["ref_logp"], _ = logprobs(ref_model)


class Update(NamedTuple):
    """What one step's `update` did."""

    stats: list[dict]  # per micro-batch: its trained tokens' clipped, ratio, tis, kl, entropy
    grad_norms: list[float]  # per optimizer step applied: the gradient norm before clipping
    losses: list[float]  # per optimizer step applied: its mini-batch's loss
    skipped: int  # mini-batches whose loss or norm was not finite: no step, gradients dropped


def update(minis, accelerator, model, optimizer, scheduler, args: PPOConfig) -> Update:
    """PPO epochs x mini-batches, the same mini-batches in the same order every epoch (no
    reshuffle): each micro-batch's share of its mini-batch's token-mean (or seq-mean-token-mean)
    loss, backward, one clipped optimizer step per mini-batch (ranks: the count is all ranks', the
    loss scaled by their number, as Accelerate averages gradients). Returns what it did."""
    token_mean = args.loss_agg == "token-mean"
    count = lambda b: b["mask"].sum() if token_mean else (b["mask"].sum(-1) > 0).sum()  # ()
    model.train()
    stats, grad_norms, losses = [], [], []
    for _ in range(args.ppo_epochs):
        for mb in minis:
            n = shard.total(accelerator, sum(count(b).item() for b in mb))  # over all ranks
            denom = max(n, 1.0) / accelerator.num_processes  # Accelerate averages over ranks
            loss_sum = 0.0
            for i, b in enumerate(mb):
                # gradients reduced over ranks once, at the mini-batch's last micro-batch
                with shard.accumulate(accelerator, model, sync=i == len(mb) - 1):
                    logp, entropy = token_logprobs(
                        model, b["ids"], b["attn"], entropy=True, packed=b.get("packed")
                    )
                    inputs = {k: b[k] for k in LOSS_INPUTS}  # (B, T) each, by ppo_loss's names
                    loss, s = ppo_loss(logp=logp, **inputs, args=args, denom=denom)
                    accelerator.backward(loss)
                s["entropy"] = entropy[b["mask"].bool()].detach()
                loss_sum += loss.item()
                stats.append(s)
            norm = shard.full(accelerator.clip_grad_norm_(model.parameters(), args.grad_clip))
            loss_sum = shard.mean(accelerator, loss_sum)  # the ranks' mean: one process's sum
            if math.isfinite(loss_sum) and torch.isfinite(torch.as_tensor(norm)).all():
                optimizer.step()
                scheduler.step()
                grad_norms.append(float(norm))
                losses.append(loss_sum)
            optimizer.zero_grad()  # a skipped mini-batch's gradients are dropped, never applied
    return Update(stats, grad_norms, losses, args.ppo_epochs * len(minis) - len(grad_norms))


def share(rows: list, order: list[int], step: int, prompts_per_step: int, accelerator) -> list:
    """This rank's contiguous share of step `step`'s prompts, taken from `rows` in the run's
    `order` (wrapping around). A prompt's trees are all grown on one rank, so every group
    statistic is computed where its leaves are."""
    n = prompts_per_step // accelerator.num_processes
    at = step * prompts_per_step + accelerator.process_index * n
    return [rows[order[(at + i) % len(order)]] for i in range(n)]


@dataclass
class FilterReport:
    """What `reject_sampling_filter` kept and dropped."""

    total: int  # questions given
    kept: int  # questions whose group is neither all 0 nor all 1 (mixed, or kept_constant)
    # groups with every reward 0: too hard, bad label, or retrieval finds nothing
    dropped_all_zero: int
    dropped_all_one: int  # groups with every reward 1: too easy, no multi-turn search needed
    kept_constant: int  # kept groups of equal rewards, not all 0 or all 1 (constant-groups-kept)


def reject_sampling_filter(rows, rewards):
    """Cut the Bill §3, step 3: drop the questions whose rollout group is all-0 or all-1 (n = 8
    rollouts per question; constant-groups-kept). rewards[i] lists the rewards of question
    rows[i]'s rollouts. Returns (kept rows, FilterReport)."""
    if len(rows) != len(rewards):
        raise ValueError(
            f"{len(rows)} rows but {len(rewards)} reward groups; pass one group per question"
        )
    kept, zero, one, constant = [], 0, 0, 0
    for row, group in zip(rows, rewards):
        group = list(group)
        if not group:
            raise ValueError(
                f"question {row.id!r} has an empty reward group; roll it out at least once"
            )
        if all(r == 0 for r in group):
            zero += 1
        elif all(r == 1 for r in group):
            one += 1
        else:
            constant += all(r == group[0] for r in group)
            kept.append(row)
    return kept, FilterReport(len(rows), len(kept), zero, one, constant)


def reject_sampling(agent, rows: list, order: list[int], accelerator, book: Book):
    """Cut the Bill §3 (`reject_sampling_filter`): the questions the run would train on
    (the first steps x prompts_per_step of `rows` in its `order`), each rolled out
    --filter_rollouts times by `agent` (the starting policy; every rank its contiguous share),
    less those whose scored rewards are all 0 or all 1; one with none scored (retrieval errors)
    stays. Returns the kept rows and their order (as they were); the filter's metrics go to
    `book`, which logs them at step 0."""
    args = book.args
    picked = [rows[i] for i in order[: args.steps * args.prompts_per_step]]
    ranks, rank = accelerator.num_processes, accelerator.process_index
    share = picked[len(picked) * rank // ranks : len(picked) * (rank + 1) // ranks]
    group = RolloutConfig(grpo_G=args.filter_rollouts)
    with torch.no_grad():
        tree_groups = rollout.chain(agent, share, random.Random(args.seed), group)  # per prompt
    rewards = [[x.reward for t in trees for x in t.leaves() if x.scored] for trees in tree_groups]
    rewards = gather_object(rewards) if ranks > 1 else rewards
    judged = [(row, r) for row, r in zip(picked, rewards) if r]
    kept, report = reject_sampling_filter([row for row, _ in judged], [r for _, r in judged])
    kept = set(map(id, kept)) | {id(row) for row, r in zip(picked, rewards) if not r}
    kept_rows = [row for row in picked if id(row) in kept]
    book.first_row = {
        "rollout/filter_questions": len(picked),
        "rollout/filter_kept": len(kept_rows),
        "rollout/filter_dropped_all_zero": report.dropped_all_zero,
        "rollout/filter_dropped_all_one": report.dropped_all_one,
    }
    accelerator.print(f"data filter (Cut the Bill §3): {book.first_row}")
    if not kept_rows:
        raise SystemExit(
            f"the data filter dropped all {len(picked)} questions (every rollout group all 0 or "
            "all 1): nothing is left to train on; train without --filter_rollouts, or start from "
            "a policy that solves some of them"
        )
    return kept_rows, list(range(len(kept_rows)))


# --------------------------------------------------------------------------------------------------


def main(
    args: Args,
    rollout_cfg: RolloutConfig,
    credit_cfg: CreditConfig,
    agent_cfg: AgentConfig,
    retriever_cfg: RetrieverConfig,
    warm: WarmConfig,
):
    # ---- config: checked once, derived values, logged whole
    validate(args, rollout_cfg, credit_cfg, agent_cfg, retriever_cfg, warm)
    name = args.run_name or f"{rollout_cfg.algo}-seed{args.seed}"
    run_dir = os.path.join(args.out_dir, "runs", name)
    world = os.path.join(args.out_dir, "world") if not (args.data and args.corpus) else ""
    model_path = args.model or os.path.join(args.out_dir, "warmstart")  # no --model: the warm start
    accelerator = startup.accelerator(args, run_dir)  # one process, DDP or FSDP2: the launch's
    book = Book(accelerator, run_dir, args, rollout_cfg.algo)  # metrics, eval, checkpoints (infra)
    configs = (args, rollout_cfg, credit_cfg, agent_cfg, retriever_cfg)
    lock = run.start(accelerator, run_dir, args, configs, warm)  # noqa: F841 (held while main runs)
    # ---- init: data, retriever, warm start, policy, reference, engine, agents
    with book.timed("world"):
        train_rows, test_rows = startup.questions(accelerator, args, world)
    # every rank searches with its own client; rank 0 first (it writes --index_dir)
    with accelerator.main_process_first(), run.quiet(not accelerator.is_main_process):
        search, where = retriever.connect(retriever_cfg, args.corpus or f"{world}/corpus.jsonl")
    if not args.model:  # the embedded default: warm-start once (rank 0), in this agent's format
        with book.timed("warm start"):
            cfgs = (world, warm, agent_cfg, args.seed, search)
            startup.on_main(accelerator, warmstart.ensure, model_path, *cfgs)
    load = partial(policy.load_policy, model_path, args.gguf_file or None)  # (dtype): model, tok
    model, ref_model, tok = startup.policies(accelerator, args, load)  # ref: frozen, the KL anchor
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = get_constant_schedule_with_warmup(optimizer, args.warmup_steps)
    # one process, DDP or FSDP2 (accelerate launch's config): infra/shard.py reads what it made
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    engine = startup.engine(accelerator, args, model, tok, model_path, load)
    from_engine = old_from_engine(engine, accelerator, model)  # pi_old: the engine's, or ours
    refiner = retriever.refiner(retriever_cfg, args.engine)  # Cut the Bill §6; None: off
    rank_seed = args.seed + run.RANK_SEED * accelerator.process_index  # this rank's sampling
    agent = rollout.Agent(engine, search, tok, agent_cfg, rank_seed, refiner)
    eval_cfg = protocol.for_eval(agent_cfg)  # its sampling; every budget the same
    eval_agent = rollout.Agent(engine, search, tok, eval_cfg, rank_seed, refiner)
    rng = random.Random(rank_seed)  # strategies' random choices
    order = list(range(len(train_rows)))
    random.Random(args.seed).shuffle(order)
    if args.filter_rollouts:  # Cut the Bill §3, by an agent of its own (the run's stream stays)
        filtering = rollout.Agent(engine, search, tok, agent_cfg, args.seed, refiner)
        train_rows, order = reject_sampling(filtering, train_rows, order, accelerator, book)
    evaluator = partial(evaluate, eval_agent, test_rows, processes=accelerator)
    parts = (model, optimizer, scheduler)  # what a checkpoint holds, with the sampling streams
    book.begin(rng, agent.counters, engine, parts, evaluator, where, refiner)  # --resume, step 0
    algo = rollout.ALGOS[rollout_cfg.algo]  # the paper: its rollout strategy and credit function
    # ---- loop: six phases (SIGTERM, Ctrl-C: the step finishes, a checkpoint is saved, it stops)
    for step in range(book.first_step, args.steps):  # 0, or where a resumed run's checkpoint was
        batch = share(train_rows, order, step, args.prompts_per_step, accelerator)
        with torch.no_grad():  # 1. grow the trees (rollout.py): one list of trees per prompt
            tree_groups = algo.grow(agent, batch, rng, rollout_cfg)
        engine.sleep()  # --vllm_sleep: vLLM's memory goes to the update until the weight sync
        # ---- EDIT HERE: the credit, one function per paper (advantages.py) ---------------------
        # 2. credit: each prompt's trees in, one Trajectory per trained leaf out
        trajectories = [traj for trees in tree_groups for traj in algo.credit(trees, credit_cfg)]
        samples = to_samples(trajectories)  # 3. training samples: token ids, mask, advantages
        counts = gather_object([len(samples)])  # every rank's, in rank order (waits for the last)
        book.lap("rollout")
        minis = micro_batches(samples, counts, accelerator, args, tok.pad_token_id)
        add_old_and_ref_logprobs(minis, accelerator, model, ref_model, from_engine)  # 4. log-probs
        book.lap("logprob")
        # ---- EDIT HERE: the loss (ppo_loss above) ----------------------------------------------
        updated = update(minis, accelerator, model, optimizer, scheduler, args)  # 5. PPO update
        book.lap("update")
        weights = shard.Weights(accelerator, model)  # 6. weight sync: whole tensors, one at a time
        engine.load_weights(weights)  # each rank's engine samples from them from the next step on
        nonfinite = weights.nonfinite  # those the update left NaN or inf, checked as they passed
        book.step_done(step, tree_groups, trajectories, samples, updated, nonfinite)  # log, save
        if book.stopped:  # by a signal, after its checkpoint
            break
    weights = shard.gather(accelerator, model)  # every rank (under FSDP2 a collective)
    if book.finished():  # rank 0, no signal stopped the run: final/, whole or not at all
        rundir.save_final(accelerator.unwrap_model(model), weights, tok, run_dir)
    book.end(engine)  # the run's last word; every process ends together


if __name__ == "__main__":
    if sys.argv[1:2] == ["warmstart"]:  # the warm start alone (scripts/warmstart.py)
        warmstart.main(sys.argv[2:])
    else:
        main(
            *flags.parse(
                Args, RolloutConfig, CreditConfig, AgentConfig, RetrieverConfig, WarmConfig
            )
        )
