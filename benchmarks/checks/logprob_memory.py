"""Peak extra memory and time of the update's log-prob + loss + backward pass, the old formula
against train.token_logprobs, at a Qwen-sized vocabulary, on CPU.

    python benchmarks/checks/logprob_memory.py  # B = 2, T = 256 / 512 / 1,024, V = 151,936
    python benchmarks/checks/logprob_memory.py --lengths 2048 --batch 1

Each cell runs in a fresh process: it makes random float32 logits (B, T, V) that require a
gradient (what the model's forward hands over), notes the process's peak resident memory
(ru_maxrss), then runs log-probs with entropy, train.ppo_loss and backward, and reports how far the
peak rose above that note: the pass's extra memory beside the logits (their gradient included).
"old" is the formula train.py had before: log_softmax over the whole vocabulary in float32, the
entropy taken from it with gradient. The last line extrapolates linearly in length to docs/gpu.md's
GPU recipe (micro-batch 2, --max_traj_tokens 4096). Asserts nothing; one cell at a time.
"""

import math
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import train
from infra import flags

GIB = 2**30


@dataclass
class Args:
    vocab: int = 151_936
    """Vocabulary size (Qwen2.5's: 151,936)."""
    batch: int = 2
    """Rows per micro-batch (docs/gpu.md's GPU recipe: --micro_batch_size 2)."""
    lengths: str = "256,512,1024"
    """Comma-separated sequence lengths T."""


def old_token_logprobs(model, ids, attn):
    """train.token_logprobs as it was: full float32 log-softmax, entropy with gradient."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # (B, T-1, V)
    logp_all = logits.log_softmax(-1)  # (B, T-1, V)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)  # (B, T-1)
    return F.pad(logp, (1, 0)), F.pad(ent, (1, 0))  # (B, T), (B, T)


def cell(impl: str, B: int, T: int, V: int) -> tuple[float, float]:
    """(peak extra bytes, seconds) of one log-prob + loss + backward pass, in a fresh process."""
    torch.manual_seed(0)
    logits = torch.randn(B, T, V).requires_grad_()  # (B, T, V)
    ids = torch.randint(V, (B, T))  # (B, T)
    mask = (torch.arange(T) >= T // 4).float().expand(B, T)  # (B, T): a quarter is the prompt
    adv = torch.randn(B, T)  # (B, T)
    model = lambda input_ids, attention_mask: SimpleNamespace(logits=logits)
    # pi_old, pi_ref, pi_rollout near the policy's own log-probs (a random policy's are about
    # -log V), made with a gather only: nothing before the pass may rise above the logits, since
    # the peak read below is the process's maximum
    old = logits.detach()[:, :-1].gather(-1, ids[:, 1:, None])[..., 0] - math.log(V)  # (B, T-1)
    old = F.pad(old, (1, 0))  # (B, T)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    t0 = time.perf_counter()
    if impl == "old":
        logp, ent = old_token_logprobs(model, ids, None)
    else:
        logp, ent = train.token_logprobs(model, ids, None, entropy=True)
    loss, _ = train.ppo_loss(
        logp=logp,
        old_logp=old,
        ref_logp=old - 0.01,
        rollout_logp=old + 0.01,
        adv=adv,
        mask=mask,
        args=train.Args(),
        denom=mask.sum().item(),
    )
    loss.backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert math.isfinite(loss.item()) and logits.grad is not None and torch.isfinite(ent).all()
    return (peak - baseline) * 1024, seconds


def main(args: Args):
    lengths = [int(x) for x in args.lengths.split(",")]
    print(
        f"vocabulary {args.vocab:,}, batch {args.batch}, float32 logits, "
        f"torch threads {torch.get_num_threads()}"
    )
    print("| B x T | logits | old: extra peak, time | new: extra peak, time |")
    print("|---|---|---|---|")
    extra = {}
    for T in lengths:
        size = args.batch * T * args.vocab * 4
        row = []
        for impl in ("old", "new"):
            spawn = get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=spawn, max_tasks_per_child=1) as pool:
                extra[impl, T], s = pool.submit(cell, impl, args.batch, T, args.vocab).result()
            row.append(f"{extra[impl, T] / GIB:.2f} GiB ({extra[impl, T] / size:.1f}x), {s:.1f} s")
        print(f"| {args.batch} x {T:,} | {size / GIB:.2f} GiB | {row[0]} | {row[1]} |", flush=True)
    T = lengths[-1]
    scale = 2 * 4096 / (args.batch * T)  # the GPU recipe's tokens per micro-batch over this cell's
    print(
        f"extrapolated to 2 x 4,096 (x{scale:g} of {args.batch} x {T:,}): logits "
        f"{2 * 4096 * args.vocab * 4 / GIB:.1f} GiB, extra peak old "
        f"{extra['old', T] * scale / GIB:.1f} GiB, new {extra['new', T] * scale / GIB:.1f} GiB"
    )


if __name__ == "__main__":
    main(*flags.parse(Args))
