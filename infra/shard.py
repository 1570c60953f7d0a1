"""The policy's weights over processes: the one place that knows whether they are sharded (FSDP2:
parameters are DTensors, each rank holding a shard) or whole (one process, or DDP's replicas).

Sharding itself is Accelerate's (`accelerate launch` with an FSDP2 config, benchmarks/fsdp2.yaml:
torch's `fully_shard` per decoder layer); this module only reads and writes what it made:
- `Weights`: the full weights, one tensor at a time, once a step, for the engine's weight sync;
  `gather`: the full state dict, for `final/`;
- `accumulate`: under DDP gradients reduced once per mini-batch, not per micro-batch (`no_sync`);
  under FSDP2 at every micro-batch, so that they stay sharded;
- `deal`: each rank's rows of a step's mini-batches (train.py's partition), padded so that every
  rank makes as many backward passes; `total` and `mean`: a number summed or averaged over ranks;
- `save_state` / `load_state`: a checkpoint of the sharded policy and its optimizer (every rank
  writes its own shards: torch.distributed.checkpoint), the scheduler and the RNG states; a whole
  policy goes through `accelerator.save_state` as before. Each checkpoint records its layout
  (sharded or whole, over how many processes), checked on every rank before any rank loads.

Under FSDP2 every rank still rolls out its own share of a step, as under DDP: a sharded forward
needs every rank in lockstep (each layer's all-gather), while the agents' generate loops stop at
different times on different ranks. So each rank's HF engine samples from a full copy of the
policy (`rollout_model`), refreshed tensor by tensor from `Weights` after each update; a vLLM
engine loads the same stream. The copy costs the policy's size once more per rank (4 B a parameter
in float32); `benchmarks/gpu_memory.py` counts it.
"""

import contextlib
import json
import math
import os
import pickle
import random

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from accelerate.utils import FullyShardedDataParallelPlugin
from torch.distributed.checkpoint.state_dict import (
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def fsdp_plugin():
    """Under `accelerate launch` with an FSDP2 config and mixed precision (its environment says),
    the plugin for train.py's Accelerator: the launch's own, but for the mixed-precision policy,
    whose gradients reduce in float32 (Accelerate's bf16 policy reduces in bf16; verl keeps
    float32), parameters and outputs in the compute dtype as Accelerate's; None otherwise (the
    launch's settings as they are)."""
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}
    dtype = compute.get(os.environ.get("ACCELERATE_MIXED_PRECISION", "no"))
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not (fsdp and os.environ.get("FSDP_VERSION") == "2" and dtype):
        return None
    policy = {"param_dtype": dtype, "reduce_dtype": torch.float32, "output_dtype": dtype}
    return FullyShardedDataParallelPlugin(mixed_precision_policy=policy)


def sharded(model: torch.nn.Module) -> bool:
    """Whether `model` (prepared or not) holds FSDP2 shards rather than whole parameters."""
    return isinstance(model, FSDPModule) or any(isinstance(p, DTensor) for p in model.parameters())


class Weights:
    """The policy's full weights for the engine's weight sync, one step's: (name, tensor) pairs in
    state-dict order, HF names, each whole tensor made as the engine takes it. Iterate once, on
    every rank alike (sharded, each tensor is an all-gather: a collective). Whole weights: the
    unwrapped model's own tensors (references, no copy). Sharded (FSDP2): each parameter gathered
    alone, in its dtype, and dropped once the engine has it (copied into the HF engine's copy; cast
    to the vLLM engine's dtype and loaded), so that at most two whole tensors live, the one gathered
    and the one the engine still holds (the largest, the embedding: 1.16 GiB at 3 B in float32),
    where a full state dict is the whole policy (11.5 GiB); a tied one (the embedding and the head)
    is gathered once for each of its names. As they pass, each is checked: `nonfinite` names those
    that hold a NaN or an inf, once all have passed."""

    def __init__(self, accelerator, model: torch.nn.Module):
        self.model = accelerator.unwrap_model(model)
        self.names, self.bad, self.passed = 0, [], 0  # names: how many the state dict has

    def __iter__(self):
        if self.names:
            raise RuntimeError("shard.Weights is iterated once a weight sync; make a new one")
        named = self.model.state_dict(keep_vars=True)
        self.names = len(named)
        with torch.no_grad():
            for name, p in named.items():
                tensor = full(p.detach())  # sharded: gathered (a collective); else the same one
                if not torch.isfinite(tensor).all():
                    self.bad.append(name)
                self.passed += 1
                yield name, tensor
                del tensor  # before the next one is gathered

    @property
    def nonfinite(self) -> list[str]:
        """The names of the tensors that hold a NaN or an inf."""
        if not self.names or self.passed < self.names:
            raise RuntimeError(
                f"the engine took {self.passed} of the policy's {self.names or 'unknown number of'}"
                " tensors from shard.Weights; its load_weights must take them all (under FSDP2 "
                "each is a collective every rank makes)"
            )
        return self.bad


def gather(accelerator, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's full state dict, HF names, on every rank (for final/; the weight sync streams
    them: `Weights`). Whole weights: the unwrapped model's own tensors (references, no copy).
    Sharded: every rank all-gathers every parameter once, tied ones (the embedding and the head)
    once for both names, so the peak rises by one full copy of the weights in their dtype (11.5 GiB
    for 3 B parameters in float32) until the caller drops the dict; call it on every rank alike
    (each all-gather is a collective)."""
    unwrapped = accelerator.unwrap_model(model)
    if not sharded(unwrapped):
        return unwrapped.state_dict()
    full_dict, gathered = {}, {}  # id of a parameter (tied ones are one) -> its whole tensor
    with torch.no_grad():
        for name, p in unwrapped.state_dict(keep_vars=True).items():
            if id(p) not in gathered:
                gathered[id(p)] = p.full_tensor() if isinstance(p, DTensor) else p.detach()
            full_dict[name] = gathered[id(p)]
    return full_dict


def full(x):
    """A DTensor (FSDP2's gradient norm, a parameter) as the whole tensor; anything else as it
    is."""
    return x.full_tensor() if isinstance(x, DTensor) else x


def rollout_model(accelerator, model: torch.nn.Module, load, engine: str) -> torch.nn.Module:
    """The module the rollout engine (`engine`: "hf" or "vllm") is given: the trainer's own
    (unwrapped) policy, except for the HF engine under FSDP2, which samples from a full copy
    (`load()`: a fresh policy from the run's model path, its weights those of the policy before
    any update) on this rank's device, refreshed by `HFEngine.load_weights` after each update."""
    unwrapped = accelerator.unwrap_model(model)
    if engine == "vllm" or not sharded(unwrapped):
        return unwrapped
    return load().requires_grad_(False).to(accelerator.device)


@contextlib.contextmanager
def accumulate(accelerator, model: torch.nn.Module, sync: bool):
    """A micro-batch's backward pass. Whole weights (DDP): its gradients accumulate on this rank
    and are reduced over ranks once, with `sync` (the mini-batch's last micro-batch). Sharded
    (FSDP2): reduce-scattered at every micro-batch, as verl does, so each rank only ever holds its
    shard, accumulated in float32 (whole gradients in bf16 would cost memory and precision:
    docs/gpu.md). One process: nothing to do."""
    if sync or accelerator.num_processes == 1 or sharded(model):
        yield
    else:
        with accelerator.no_sync(model):
            yield


def deal(minis: list[list[int]], counts: list[int], rank: int, size: int) -> list[list[list[int]]]:
    """`rank`'s rows of each of a step's mini-batches (`minis`: the step's sample indices; `counts`:
    every rank's samples, rank r holding the r-th contiguous share), `size` at a time, with as many
    micro-batches as the rank with the most (DDP needs as many backward passes on every rank): an
    empty one is the caller's zero-weight padding row. One process: the mini-batches, in order."""
    starts = [sum(counts[:r]) for r in range(len(counts))]
    # the step's samples g of mini-batch j that rank r holds
    held = lambda j, r: [g for g in minis[j] if starts[r] <= g < starts[r] + counts[r]]
    dealt = []
    for j in range(len(minis)):
        mine = [g - starts[rank] for g in held(j, rank)]
        most = max(math.ceil(len(held(j, r)) / size) for r in range(len(counts)))
        dealt.append([mine[i : i + size] for i in range(0, most * size, size)])
    return dealt


def total(accelerator, x: float) -> float:
    """`x` summed over ranks (float32, as a count of tokens or rows; itself with one process)."""
    return accelerator.reduce(torch.tensor(float(x), device=accelerator.device), "sum").item()


def mean(accelerator, x: float) -> float:
    """`x` averaged over ranks, in float64 (itself with one process)."""
    t = torch.tensor(x, dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(t, "mean").item()


def _optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper, or torch's own


LAYOUT = "layout.json"  # in each checkpoint: how its policy was held (`layout`)


def layout(accelerator, model) -> dict:
    """How this launch holds the policy: sharded (FSDP2) or whole, over how many processes."""
    return {"sharded": sharded(model), "processes": accelerator.num_processes}


def saved_layout(path: str) -> dict:
    """The layout the checkpoint `path` was saved under; a checkpoint from before layouts were
    recorded is read from its files (`.metadata`: sharded, one `rank{R}.pkl` a process; whole: its
    process count unknown, None)."""
    if os.path.exists(os.path.join(path, LAYOUT)):
        with open(os.path.join(path, LAYOUT)) as f:
            return json.load(f)
    names = os.listdir(path)
    pickles = sum(n.startswith("rank") and n.endswith(".pkl") for n in names)
    return {"sharded": ".metadata" in names, "processes": pickles if ".metadata" in names else None}


def check_layout(accelerator, model, path: str):
    """Refuse, on every rank alike and before any rank loads (a sharded load is a collective), a
    checkpoint saved under another sharding or process count than this launch holds the policy
    with: one message says what the checkpoint holds and what this launch is."""
    saved, now = saved_layout(path), layout(accelerator, model)
    if saved["sharded"] == now["sharded"] and saved["processes"] in (None, now["processes"]):
        return
    count = lambda n: (
        "an unrecorded number of processes" if n is None else f"{n} process" + "es" * (n != 1)
    )
    held = lambda x: (
        f"{'a policy sharded by FSDP2' if x['sharded'] else 'whole weights (one process or DDP)'}"
        f" over {count(x['processes'])}"
    )
    raise SystemExit(
        f"resume: {path} holds {held(saved)}, and this launch holds {held(now)}: a checkpoint "
        "loads only under the layout it was saved with. Launch as it was made (`accelerate "
        f"launch --num_processes {saved['processes'] or 'N'}`, "
        f"{'with' if saved['sharded'] else 'without'} the FSDP2 config), or start over with "
        "--overwrite"
    )


def _dcp(call, state: dict, path: str):
    """torch.distributed.checkpoint's `call` (save, load) of `state` at `path`. torch raises its
    failures (a full disk, an unwritable or unreadable path) as CheckpointException, a
    BaseException that no `except Exception` sees: here a RuntimeError naming the path, which the
    run's checkpoint handlers catch, as they catch torch's own full-disk RuntimeError."""
    try:
        call(state, checkpoint_id=path)
    except dcp.CheckpointException as e:  # its failures: rank -> (exception, stack)
        failed = "; ".join(f"rank {r}: {type(x).__name__}: {x}" for r, (x, _) in e.failures.items())
        raise RuntimeError(
            f"torch.distributed.checkpoint's {call.__name__} at {path}: {failed}"
        ) from e


def save_state(accelerator, model, optimizer, scheduler, path: str):
    """Write a checkpoint into `path`, and its LAYOUT (rank 0). Sharded: every rank writes its
    shards of the policy and of AdamW's state (torch.distributed.checkpoint: `.metadata` and one
    `__R_0.distcp` a rank) and its `rank{R}.pkl` (the scheduler, the torch / CUDA / numpy / Python
    RNG states). Whole: `accelerator.save_state`. (Accelerate wraps no FSDP2 model: `model` is the
    sharded module.)"""
    if not sharded(model):
        accelerator.save_state(path)
    else:
        weights, adam = get_state_dict(model, _optimizer(optimizer))
        _dcp(dcp.save, {"model": weights, "optimizer": adam}, path)
        _save_rank_state(accelerator, scheduler, path)
    if accelerator.is_main_process:  # once the state is whole
        with open(os.path.join(path, LAYOUT), "w") as f:
            json.dump(layout(accelerator, model), f)


def _save_rank_state(accelerator, scheduler, path: str):
    """A sharded checkpoint's `rank{R}.pkl`: this rank's scheduler and RNG states."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    local = {
        "scheduler": scheduler.state_dict(),
        "rng": (torch.get_rng_state(), cuda, np.random.get_state(), random.getstate()),
    }
    with open(os.path.join(path, f"rank{accelerator.process_index}.pkl"), "wb") as f:
        pickle.dump(local, f)


def load_state(accelerator, model, optimizer, scheduler, path: str):
    """Restore what `save_state` wrote into `path` (raises, as the loaders do, when a file is
    unreadable), once its layout is this launch's (`check_layout`)."""
    check_layout(accelerator, model, path)
    if not sharded(model):
        accelerator.load_state(path)
        return
    weights, adam = get_state_dict(model, _optimizer(optimizer))
    state = {"model": weights, "optimizer": adam}
    _dcp(dcp.load, state, path)  # in place, into this rank's shards
    set_state_dict(
        model,
        _optimizer(optimizer),
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )
    with open(os.path.join(path, f"rank{accelerator.process_index}.pkl"), "rb") as f:
        local = pickle.load(f)
    scheduler.load_state_dict(local["scheduler"])
    cpu, cuda, numpy_state, python_state = local["rng"]
    torch.set_rng_state(cpu)
    if cuda:
        torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(numpy_state)
    random.setstate(python_state)
