"""Peak GPU memory of one real update step at a Qwen2.5 shape, split into its terms, and a per-GPU
memory plan for docs/gpu.md's recipes built from measured figures.

    python benchmarks/gpu_memory.py                            # a GPU: 3B, micro-batch 2 x 4,096
    python benchmarks/gpu_memory.py --gradient_checkpointing --ref_dtype float32 --json m.json
    python benchmarks/gpu_memory.py --fsdp --gradient_checkpointing   # 1-rank FSDP2
    python benchmarks/gpu_memory.py --shape tiny               # CPU: the same code path, tiny
    python benchmarks/gpu_memory.py --plan_only --figures m.json      # the plan alone
    python benchmarks/gpu_memory.py --rollout --length 4000   # the HF engine: 32 x 3,500 + 500
    python benchmarks/gpu_memory.py --grad_sync --fsdp --gradient_checkpointing  # sync off / on

The step: a policy built from benchmarks/shapes/SHAPE/config.json (random init, float32 as
policy.load_policy loads it), the frozen reference in --ref_dtype ("compute": the accelerator's
mixed-precision dtype), AdamW, optional gradient checkpointing (as train.py enables it), optional
1-rank FSDP2 (torch's fully_shard per decoder layer and on the root, with accelerate's bf16 policy;
--offload: CPUOffloadPolicy), an Accelerator with --mixed_precision; then --micro_batches rows of
--micro_batch x --length random token ids (the first quarter the prompt, the rest trained, random
advantages, rollout log-probs near a random policy's) through train.micro_batches,
train.add_old_and_ref_logprobs (pi_old by the trainer's forward, as under vLLM or mixed precision,
and pi_ref) and train.update, twice. Reported:
memory_allocated between the steps, the second step's max_memory_allocated (reset before it), and
its terms: parameters, gradients (at the optimizer step), AdamW states and the reference, each
counted from the tensors, and the remainder (activations, logits, temporaries, autocast's bf16
copies of the weights), with max_memory_reserved beside the peak (the allocator's segments:
reserved less allocated is its fragmentation; --micro_batches 8 shows how it grows). Without CUDA
the peak is the process's peak RSS rise (ru_maxrss) since before the models were built, labelled
so: only the counted terms mean the same there.

--rollout measures the HF engine's generate instead, as train.py's one-GPU recipe rolls out: the
float32 policy under the Accelerator's autocast, --hf_sequences prompts of --length less
--hf_new_tokens random ids, --hf_new_tokens sampled at temperature 1: memory_allocated before it
(resident), its peak above that beside the plan's (the KV cache, the prefill's transients, a
step's logits), max_memory_reserved, and its seconds. --grad_sync measures, under one-rank FSDP2
with train.py's policy (bf16 compute, float32 reduction), what a micro-batch's backward leaves
allocated with gradient sync on (each rank's float32 shard) and off (the whole gradients, which
FSDP2 keeps until a synchronised backward), in bytes a parameter: one rank's shard is the whole,
so on N ranks "on" is that over N, "off" is not divided.

The plan (benchmarks/memory_plan.py) lists, per GPU and recipe, each term of the update's, the
weight sync's and the rollout phase's memory, marked measured (the activation remainder of a GPU
figure: this run's, those of --figures, else the committed H100 table
benchmarks/shapes/h100_measured.json) or derived (arithmetic from the shape and what the code
holds). Asserts nothing.
"""

import json
import math
import os
import resource
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import torch
import torch.distributed as dist
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, get_constant_schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from memory_plan import (  # noqa: F401 (the tests' names)
    GIB,
    RECIPES,
    SHAPES,
    Recipe,
    config,
    hf_terms,
    largest_tensor,
    layer_sizes,
    parameter_count,
    plan,
    print_plan,
    remainder_gib,
)

import train
from infra import files, flags
from infra.engines import HFEngine, Sampling
from rollout import rollout_logprob
from tree import Sample

TABLE = SHAPES / "h100_measured.json"  # the committed figures, with their provenance


@dataclass
class Args:
    """What to measure, and the GPU the plan is for."""

    shape: Literal["auto", "tiny", "0.5B", "1.5B", "3B", "7B"] = "auto"
    """Model shape (benchmarks/shapes/); auto = 3B with CUDA, tiny without."""
    micro_batch: int = 2
    """Rows per forward/backward pass (train.py --micro_batch_size)."""
    micro_batches: int = 2
    """Micro-batches in the one mini-batch of each step (gradient accumulation)."""
    length: int = 0
    """Tokens per row; 0 = 4,096 with CUDA (docs/gpu.md's --max_traj_tokens), 64 without."""
    mixed_precision: Literal["auto", "no", "bf16"] = "auto"
    """The Accelerator's; auto = bf16 with CUDA, no without (CPU autocast is slow)."""
    gradient_checkpointing: bool = False
    """Activation checkpointing, as train.py --gradient_checkpointing enables it."""
    ref_dtype: Literal["compute", "float32"] = "compute"
    """The frozen reference's dtype: the mixed-precision dtype (compute) or float32."""
    fsdp: bool = False
    """Shard the policy with FSDP2 (fully_shard per decoder layer and on the root), one rank."""
    offload: bool = False
    """With --fsdp: FSDP2 CPU offload of parameters, gradients and AdamW states."""
    seed: int = 0
    """Seed of the random weights and token rows."""
    plan_only: bool = False
    """Measure nothing: print the plan from the committed table and --figures."""
    figures: tuple[str, ...] = ()
    """Earlier runs' --json files whose measurements join the plan's."""
    json: str = ""
    """Write every figure (measurement, plan) to this JSON file."""
    gpu_gib: float = 79.2
    """The plan's GPU memory per device (torch's total of an H100 80GB, measured: 79.2 GiB)."""
    reserve_gib: float = 3.0
    """Kept free by the plan for what memory_allocated does not count (CUDA context, NCCL,
    allocator fragmentation); not measured here."""
    vllm_utilization: float = 0.3
    """vLLM's share of --gpu_gib beside the update (train.py --vllm_gpu_memory_utilization)."""
    small_vllm_utilization: float = 0.125
    """vLLM squeezed beside a one-GPU update (3B weights in bf16, 5.8 GiB, and the rest for KV
    cache)."""
    hf_sequences: int = 32
    """Sequences the HF engine decodes at once (infra/engines.py's hf_max_batch_size)."""
    hf_new_tokens: int = 500
    """Tokens the HF engine generates per call (the recipe's --max_step_tokens)."""
    rollout: bool = False
    """Measure the HF engine's rollout (--hf_sequences x --hf_new_tokens) instead of an update."""
    grad_sync: bool = False
    """With --fsdp: measure what a backward leaves with gradient sync on and off, not an update."""


RULES = [
    ("micro_batch micro_batches", "at least 1", lambda v: v >= 1),
    ("length", "0 (auto) or at least 8", lambda v: v == 0 or v >= 8),
    ("gpu_gib hf_sequences hf_new_tokens", "positive", lambda v: v > 0),
    ("reserve_gib", "at least 0", lambda v: v >= 0),
    ("vllm_utilization small_vllm_utilization", "between 0 and 1", lambda v: 0 <= v <= 1),
]


# --------------------------------------------------------------------------------------------------
# The measurement


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (FSDP2), else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(tensors, device: torch.device) -> int:
    """Bytes of the tensors (their local shards) that sit on `device`'s kind (cuda / cpu)."""
    return sum(
        local(t).numel() * local(t).element_size()
        for t in tensors
        if local(t).device.type == device.type
    )


def build(shape: str, dtype: torch.dtype, device: torch.device):
    """A randomly initialised model of the shape, made on `device` directly (a 3B float32 init on
    the CPU takes minutes; on the GPU, seconds)."""
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config(shape), dtype=dtype)


def shard(model, mixed_precision: str, offload: bool, reduce: torch.dtype = torch.bfloat16):
    """FSDP2 over one rank: fully_shard each decoder layer, then the root (embeddings, final norm,
    lm_head), with the mixed-precision policy accelerate's FSDP2 uses (bf16 parameters, gradient
    reduction and outputs; `reduce` float32: train.py's, infra/shard.py's fsdp_plugin)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
    bf16 = torch.bfloat16
    policy = MixedPrecisionPolicy(bf16, reduce, bf16)
    kw = {"mp_policy": policy} if mixed_precision == "bf16" else {}
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def token_rows(a: Args, vocab: int) -> list[Sample]:
    """micro_batch x micro_batches rows of `length` random ids: the first quarter the prompt, the
    rest trained, with random advantages and rollout log-probs near a random policy's (-log V)."""
    g = torch.Generator().manual_seed(a.seed)
    rows = []
    for _ in range(a.micro_batch * a.micro_batches):
        ids = torch.randint(vocab, (a.length,), generator=g)  # (T,)
        mask = (torch.arange(a.length) >= a.length // 4).int()  # (T,)
        adv = torch.randn(a.length, generator=g) * mask  # (T,)
        logp = (-math.log(vocab) + 0.1 * torch.randn(a.length, generator=g)) * mask  # (T,)
        rows.append(Sample(ids.tolist(), mask.tolist(), adv.tolist(), logp.tolist(), "bench"))
    return rows


def measure(a: Args) -> dict:
    """One configuration: build, two update steps, the second's peak and its counted terms."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(a.seed)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    accelerator = Accelerator(mixed_precision=a.mixed_precision, cpu=not cuda)
    compute = torch.bfloat16 if a.mixed_precision == "bf16" else torch.float32
    ref_dtype = torch.float32 if a.ref_dtype == "float32" else compute
    t0 = time.perf_counter()
    model = build(a.shape, torch.float32, device)  # the policy: float32, as load_policy loads it
    ref_model = build(a.shape, ref_dtype, device)
    ref_model.load_state_dict(model.state_dict())  # the same weights (cast), as a run starts
    ref_model.requires_grad_(False).eval()
    if a.gradient_checkpointing:  # as train.py: before sharding and prepare
        model.activation_checkpointing_enable({"use_reentrant": False})
    if a.fsdp:
        model = shard(model, a.mixed_precision, a.offload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)  # over the sharded parameters
    scheduler = get_constant_schedule(optimizer)
    # the model is where it belongs already (FSDP2 offload keeps it on the CPU)
    model, optimizer, scheduler = accelerator.prepare(
        model, optimizer, scheduler, device_placement=[False, False, False]
    )
    built = time.perf_counter() - t0
    grads = []  # bytes of gradients on the device at each optimizer step
    params = [p for group in optimizer.param_groups for p in group["params"]]
    hook = lambda *_: grads.append(nbytes([p.grad for p in params if p.grad is not None], device))
    optimizer.optimizer.register_step_pre_hook(hook)
    vocab = config(a.shape).vocab_size
    samples = token_rows(a, vocab)
    targs = train.Args(micro_batch_size=a.micro_batch, ppo_mini_batches=1, lr=1e-6)
    resident, oom = None, None
    t0 = time.perf_counter()
    try:
        for step in flags.progress((1, 2), desc="update steps"):
            if step == 2:
                resident = torch.cuda.memory_allocated(device) if cuda else None
                torch.cuda.reset_peak_memory_stats(device) if cuda else None
            minis = train.micro_batches(samples, [len(samples)], accelerator, targs, 0)
            train.add_old_and_ref_logprobs(minis, accelerator, model, ref_model, False)
            updated = train.update(minis, accelerator, model, optimizer, scheduler, targs)
            del minis
            if updated.skipped or not all(math.isfinite(x) for x in updated.losses):
                raise SystemExit(f"step {step}: the update was skipped (losses {updated.losses})")
    except torch.cuda.OutOfMemoryError as e:  # a result: the peak it reached is a lower bound
        oom = torch.cuda.max_memory_allocated(device)
        print(f"step {step}: out of memory at {oom / GIB:.1f} GiB: {str(e).splitlines()[0]}")
        resident = None
    seconds = (time.perf_counter() - t0) / 2
    if dist.is_initialized():
        dist.destroy_process_group()
    peak = torch.cuda.max_memory_allocated(device) if cuda and oom is None else None
    reserved = torch.cuda.max_memory_reserved(device) if cuda else None
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    state = [
        t for s in optimizer.optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    ]
    counted = {
        "parameters": nbytes(model.parameters(), device),
        # at the optimizer step; before any (out of memory): the parameters' size, an upper bound
        "gradients": grads[-1] if grads else nbytes(model.parameters(), device),
        "optimizer": nbytes(state, device),
        "reference": nbytes(ref_model.parameters(), device),
    }
    on_host = sum(
        nbytes(ts, torch.device("cpu")) for ts in (model.parameters(), state) if cuda
    )  # FSDP2 offload: on the CPU
    name = torch.cuda.get_device_name(device) if cuda else "CPU (no CUDA)"
    total = torch.cuda.get_device_properties(device).total_memory if cuda else None
    return {
        "source": "measured",
        "device": name,
        "device_total_gib": total / GIB if total else None,
        "torch": torch.__version__,
        "shape": a.shape,
        "parameter_count": parameter_count(a.shape),
        "micro_batch": a.micro_batch,
        "micro_batches": a.micro_batches,
        "length": a.length,
        "mixed_precision": a.mixed_precision,
        "fsdp": ("fsdp2+offload" if a.offload else "fsdp2") if a.fsdp else "none",
        "checkpointing": a.gradient_checkpointing,
        "ref_dtype": str(ref_dtype).removeprefix("torch."),
        "counted_bytes": counted,
        "host_bytes": on_host,
        "peak_gib": peak / GIB if peak is not None else None,
        "reserved_gib": reserved / GIB if reserved is not None else None,
        "resident_gib": resident / GIB if cuda else None,
        "oom_at_gib": oom / GIB if oom is not None else None,
        "rss_rise_gib": rss / GIB,
        "seconds_build": built,
        "seconds_per_step": seconds,
    }


def print_measurement(m: dict):
    cuda = m["device_total_gib"] is not None
    mb = "on" if m["checkpointing"] else "off"
    print(
        f"device: {m['device']}"
        + (f" ({m['device_total_gib']:.1f} GiB)" if cuda else "")
        + f", torch {m['torch']}; shape {m['shape']} ({m['parameter_count']:,} parameters); "
        f"{m['micro_batches']} micro-batches of {m['micro_batch']} x {m['length']:,} tokens; "
        f"mixed precision {m['mixed_precision']}; checkpointing {mb}; reference {m['ref_dtype']}; "
        f"FSDP2 {m['fsdp']}; build {m['seconds_build']:.1f} s, {m['seconds_per_step']:.1f} s a step"
    )
    c = {k: v / GIB for k, v in m["counted_bytes"].items()}
    print("| term (second step) | GiB | bytes | how |\n|---|---|---|---|")
    for key, how in (
        ("parameters", "the policy's parameters (float32; a rank's shards), counted"),
        ("gradients", "the policy's gradients at the optimizer step, counted"),
        ("optimizer", "AdamW states (exp_avg, exp_avg_sq, step), counted"),
        ("reference", f"the frozen reference's parameters ({m['ref_dtype']}), counted"),
    ):
        print(f"| {key} | {c[key]:.4g} | {m['counted_bytes'][key]:,} | {how} |")
    if m["host_bytes"]:
        print(f"| (on the CPU: FSDP2 offload) | {m['host_bytes'] / GIB:.4g} | | not in the above |")
    if m["oom_at_gib"] is not None:
        rest, _ = remainder_gib(m)
        print(f"| remainder | >= {rest:.4g} | | out of memory: the peak reached less the above |")
        print(
            f"| **out of memory at** | {m['oom_at_gib']:.4g} | | of {m['device_total_gib']:.1f} |"
        )
    elif cuda:
        rest, _ = remainder_gib(m)
        print(f"| remainder | {rest:.4g} | | activations, logits, temporaries: peak - the above |")
        print(f"| **peak** | {m['peak_gib']:.4g} | | torch.cuda.max_memory_allocated, step 2 |")
        print(
            f"| reserved | {m['reserved_gib']:.4g} | | torch.cuda.max_memory_reserved, step 2 "
            f"(less the peak: {m['reserved_gib'] - m['peak_gib']:.3g}, fragmentation) |"
        )
        print(
            f"| resident | {m['resident_gib']:.4g} | | torch.cuda.memory_allocated between steps |"
        )
    else:
        print(
            f"| process peak RSS rise | {m['rss_rise_gib']:.4g} | | ru_maxrss since before the "
            "models were built: CPU memory, NOT a GPU figure |"
        )


def measure_rollout(a: Args) -> dict:
    """The HF engine's generate at the shape (--rollout): its memory above what was resident
    before it, its reserved peak and seconds, beside the plan's terms for the same call."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(a.seed)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    accelerator = Accelerator(mixed_precision=a.mixed_precision, cpu=not cuda)
    model = build(a.shape, torch.float32, device)  # the policy: float32, as load_policy loads it
    # its forward under the Accelerator's autocast, as train.py's prepared policy samples
    model = accelerator.prepare(model, device_placement=[False])
    cfg, b, new = config(a.shape), a.hf_sequences, a.hf_new_tokens
    prompt = a.length - new
    g = torch.Generator().manual_seed(a.seed)
    prompts = [torch.randint(cfg.vocab_size, (prompt,), generator=g).tolist() for _ in range(b)]
    # no stop strings, so the tokenizer is asked for its EOS and pad ids alone
    tokenizer = SimpleNamespace(eos_token_id=cfg.eos_token_id, pad_token_id=cfg.eos_token_id)
    engine = HFEngine(model, tokenizer, max_batch_size=b)
    # the agent's: each token's log-prob kept by pi_rollout's rule, as a rollout does
    sampling = Sampling(max_tokens=new, temperature=1.0, seed=a.seed, logprob=rollout_logprob)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    resident = torch.cuda.memory_allocated(device) if cuda else None
    t0 = time.perf_counter()
    completions = engine.generate(prompts, sampling)
    torch.cuda.synchronize(device) if cuda else None
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    terms = {
        t["key"]: t
        for t in hf_terms(Recipe("", "", length=a.length, shape=a.shape), a, 0, cfg, False)
    }
    planned = {m: sum(t["gib"] for t in terms.values() if m in t["at"]) for m in "PD"}
    generated = sum(len(c.token_ids) for c in completions)
    return {
        "device": torch.cuda.get_device_name(device) if cuda else "CPU (no CUDA)",
        "shape": a.shape,
        "mixed_precision": a.mixed_precision,
        "sequences": b,
        "prompt_tokens": prompt,
        "new_tokens": new,
        "generated": generated,
        "resident_gib": resident / GIB if cuda else None,
        "peak_above_resident_gib": (peak - resident) / GIB if cuda else None,
        "reserved_gib": torch.cuda.max_memory_reserved(device) / GIB if cuda else None,
        "planned_above_resident_gib": planned,
        "rss_rise_gib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024 / GIB,
        "seconds": seconds,
        "ms_per_new_token": 1e3 * seconds / max(1, max(len(c.token_ids) for c in completions)),
    }


def measure_grad_sync(a: Args) -> dict:
    """What one micro-batch's backward leaves allocated under one-rank FSDP2 (--grad_sync), with
    gradient sync on, then off (off keeps the whole gradients inside FSDP2 until a synchronised
    backward, which zero_grad does not clear: so on first), after a warm-up backward."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(a.seed)
    accelerator = Accelerator(mixed_precision=a.mixed_precision, cpu=not cuda)
    model = build(a.shape, torch.float32, device)
    if a.gradient_checkpointing:  # as train.py: before sharding
        model.activation_checkpointing_enable({"use_reentrant": False})
    model = shard(model, a.mixed_precision, offload=False, reduce=torch.float32)
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(config(a.shape).vocab_size, (a.micro_batch, a.length), generator=g)
    ids = ids.to(device)  # (B, T)
    n, out = parameter_count(a.shape), {}
    for sync in ("warm-up", "on", "off"):
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device) if cuda else 0
        model.set_requires_gradient_sync(sync != "off")
        with accelerator.autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        del loss
        torch.cuda.synchronize(device) if cuda else None
        if cuda:
            left = torch.cuda.memory_allocated(device) - before
            peak = torch.cuda.max_memory_allocated(device) - before
            reserved = torch.cuda.max_memory_reserved(device)
            out[sync] = {
                "left_gib": left / GIB,
                "left_bytes_per_parameter": left / n,
                "peak_above_gib": peak / GIB,
                "reserved_gib": reserved / GIB,
            }
    if dist.is_initialized():
        dist.destroy_process_group()
    out.pop("warm-up", None)
    return {
        "device": torch.cuda.get_device_name(device) if cuda else "CPU (no CUDA)",
        "shape": a.shape,
        "micro_batch": a.micro_batch,
        "length": a.length,
        "checkpointing": a.gradient_checkpointing,
        "mixed_precision": a.mixed_precision,
        "parameters": n,
        "sync": out,  # empty without CUDA: the code ran, nothing was measured
    }


def print_rollout(r: dict):
    print(
        f"HF engine rollout: {r['device']}, shape {r['shape']}, {r['mixed_precision']}; "
        f"{r['sequences']} prompts of {r['prompt_tokens']:,} ids, {r['new_tokens']} new tokens "
        f"({r['generated']:,} generated): {r['seconds']:.1f} s, {r['ms_per_new_token']:.1f} ms a "
        "token of the longest row"
    )
    plan_p, plan_d = r["planned_above_resident_gib"]["P"], r["planned_above_resident_gib"]["D"]
    if r["resident_gib"] is None:
        print(f"| process peak RSS rise | {r['rss_rise_gib']:.4g} | NOT a GPU figure |")
        return
    print(
        f"| rollout | GiB |\n|---|---|\n| resident before it | {r['resident_gib']:.4g} |\n"
        f"| **peak above resident** | {r['peak_above_resident_gib']:.4g} |\n"
        f"| planned above resident (derived): prefill P, last token D | {plan_p:.4g}, "
        f"{plan_d:.4g} |\n| reserved (max_memory_reserved) | {r['reserved_gib']:.4g} |"
    )


def print_grad_sync(s: dict):
    print(
        f"gradient sync under one-rank FSDP2: {s['device']}, shape {s['shape']}, "
        f"{s['micro_batch']} x {s['length']:,} tokens, checkpointing "
        f"{'on' if s['checkpointing'] else 'off'}, {s['mixed_precision']}, reduce float32"
    )
    if not s["sync"]:
        print("no CUDA: nothing measured (the code path ran)")
        return
    print(
        "| sync | left after the backward, GiB | B a parameter | peak above before | reserved |"
        "\n|---|---|---|---|---|"
    )
    for sync, m in s["sync"].items():
        print(
            f"| {sync} | {m['left_gib']:.4g} | {m['left_bytes_per_parameter']:.3g} | "
            f"{m['peak_above_gib']:.4g} | {m['reserved_gib']:.4g} |"
        )


def table_rows() -> tuple[str, list[dict]]:
    with open(TABLE) as f:
        table = json.load(f)
    return table["provenance"], [{**r, "source": "table"} for r in table["rows"]]


def earlier_measurement(path: str) -> dict | None:
    """The measurement of an earlier run's --json file `path` (None: that run measured nothing);
    a file that is not such JSON is named, with what to pass instead."""
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON or not UTF-8
        raise SystemExit(
            f"--figures {path!r} cannot be read as JSON ({type(e).__name__}: {e}); pass a file "
            "that --json wrote"
        ) from None
    if not isinstance(earlier, dict) or "measurement" not in earlier:
        raise SystemExit(
            f'--figures {path!r}: no "measurement" in it, so not a file that --json wrote; pass one'
        )
    return earlier["measurement"]


def main(a: Args):
    cuda = torch.cuda.is_available()
    a.shape = a.shape if a.shape != "auto" else ("3B" if cuda else "tiny")
    a.length = a.length or (4096 if cuda else 64)
    if a.mixed_precision == "auto":
        a.mixed_precision = "bf16" if cuda else "no"
    no_json = a.json and files.unwritable(a.json, "--json")
    flags.check(
        a,
        RULES,
        [
            (a.offload and not a.fsdp, "--offload needs --fsdp"),
            (a.offload and not cuda, "--offload needs CUDA (FSDP2 offloads from a GPU to the CPU)"),
            (a.grad_sync and not a.fsdp, "--grad_sync needs --fsdp (it measures FSDP2's sync)"),
            (a.rollout and a.grad_sync, "--rollout and --grad_sync: one measurement at a time"),
            (
                a.rollout and a.length <= a.hf_new_tokens,
                "--rollout needs --length above "
                f"--hf_new_tokens ({a.hf_new_tokens}): the prompts are --length less it",
            ),
            (no_json, no_json),  # checked before the work, not after it
            *[
                (not os.path.isfile(p), f"--figures {p!r}: no such file; pass an earlier --json")
                for p in a.figures
            ],
        ],
    )
    for flag, measure_it, print_it in (
        ("rollout", measure_rollout, print_rollout),
        ("grad_sync", measure_grad_sync, print_grad_sync),
    ):
        if getattr(a, flag):  # a measurement of its own: no update, no plan
            result = measure_it(a)
            print_it(result)
            if a.json:
                out = {"args": asdict(a), "measurement": None, flag: result}
                files.write_text(a.json, json.dumps(out, indent=1) + "\n")
                print(f"wrote {a.json}")
            return
    provenance, rows = table_rows()
    rows += [m for m in map(earlier_measurement, a.figures) if m]
    measurement = None
    if not a.plan_only:
        measurement = measure(a)
        print_measurement(measurement)
        rows.append(measurement)
    plans = [plan(r, rows, a) for r in RECIPES]
    print_plan(plans, a)
    gpu_rows = [r for r in rows if r["source"] == "measured" and r["peak_gib"] is not None]
    print(
        f"figures: 'measured' = on a GPU by this run or --figures: {len(gpu_rows)} (a CPU run has "
        f"no GPU peak); 'table' = benchmarks/shapes/h100_measured.json: {provenance}."
    )
    if a.json:
        out = {"args": asdict(a), "measurement": measurement, "rows": rows, "plan": plans}
        files.write_text(a.json, json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main(*flags.parse(Args))
