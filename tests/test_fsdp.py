"""train.py under FSDP2 in two CPU processes (gloo): the policy's parameters are DTensor shards, and
the functions train.py uses for them (infra/shard.py: the gather for the engine's weight sync and
for final/, the sharded checkpoint, the once-per-mini-batch gradient reduction) run for real.

On a GPU, Accelerate's FSDP2 plugin shards the policy in `accelerator.prepare` (torch's
`fully_shard` on every decoder layer, then on the whole model). On CPU, accelerate 1.15 silently
turns an FSDP plugin into DDP, so this file's probe (run as a script under the launcher) makes
`Accelerator.prepare` do what the plugin does: `fully_shard` per decoder layer and on the root, the
optimizer pointed at the new parameters. Everything else is train.py's own code."""

import faulthandler
import gc
import math
import os
import pickle
import re
import subprocess
import sys
import traceback
import weakref
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # as a script (accelerate launch), for train, rollout, ...
sys.path.insert(0, str(ROOT / "tests"))

from test_multiprocess import CPU, WATCHDOG, check_lr, launch_train, metrics, strip  # noqa: E402

STEPS = "--eval_every 2 --eval_n 8 --prompts_per_step 4 --checkpoint_every 1".split()


def launch(env, records: Path, *args) -> subprocess.CompletedProcess:
    """train.py with the tests' fast flags and `args`, in two CPU processes, its policy sharded
    (this file's probe, recording into `records`)."""
    records.mkdir(parents=True, exist_ok=True)
    return launch_train(env, *STEPS, *args, script=Path(__file__), before=("train", records))


@pytest.fixture(scope="module")
def straight(env, tmp_path_factory):
    """Two steps in one go: (run directory, both ranks' records, the launcher's output)."""
    records = tmp_path_factory.mktemp("fsdp_straight")
    out = launch(env, records, "--algo", "tree_grpo", "--steps", "2", "--run_name", "fsdp_a")
    assert out.returncode == 0, out.stderr[-4000:]
    ranks = [pickle.loads((records / f"rank{r}.pkl").read_bytes()) for r in (0, 1)]
    return env / "out" / "runs" / "fsdp_a", ranks, out


def test_fsdp2_shards_the_policy_trains_and_syncs_every_rank_engine(straight):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run, ranks, out = straight
    for rank in ranks:
        # every parameter a DTensor shard (rank r holds rows r x n/2 ...), none whole
        assert rank["dtensor"] and rank["shard_rows"] < rank["full_rows"], rank
    assert "pi_old: the trainer's forward" in out.stdout  # the engine samples from a copy
    rows = [r for r in metrics(run) if "train/loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["train/skipped_steps"] == 0 for r in rows)
    check_lr(rows, ranks[0]["steps"])  # the warmup counts optimizer steps, as one process's
    # the weight sync streams the policy (shard.Weights), never a full copy of it: each whole
    # tensor is dropped once the engine's copy has it, so that while one is gathered at most the
    # one before it lives (the engine's loop still holds it); every tensor passes, every step; and
    # nothing of a step's stream lives at the next one's, nor at final/'s gather
    names = len(ranks[0]["engine"])
    for rank in ranks:
        assert rank["passed"] == [names, names] and max(rank["alive_in_sync"]) <= 1, rank
        assert rank["alive_at_sync"] == [0, 0] and rank["alive_at_gather"] == [0], rank
        assert rank["tied_once"]  # final/'s gather: one all-gather for the tied head and input
    # the engine's copy on each rank, after the last sync, holds the weights final/ holds
    final = load_file(run / "final" / "model.safetensors")
    for rank in ranks:
        for name, tensor in final.items():
            assert torch.equal(rank["engine"][name], tensor), name
    assert rank["engine"]["model.embed_tokens.weight"].shape[0] == rank["full_rows"]
    # and final/ is an ordinary model directory that trained (weights moved from the start)
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    start = AutoModelForCausalLM.from_pretrained(run.parents[2] / "tiny")
    moved = max(
        (a - b).abs().max().item()
        for a, b in zip(model.state_dict().values(), start.state_dict().values())
    )
    assert moved > 0
    # TIS compares the engine's log-probs with the sharded trainer's: the same weights, so the
    # ratio is 1 to float rounding on every step (a stale engine would show here)
    assert all(r["train/tis_ratio_max_dev"] < 1e-4 for r in rows), rows


def test_fsdp2_sharded_checkpoint_resumes_exactly(env, straight, tmp_path):
    # one step and its sharded checkpoint (every rank's shards of the policy and of AdamW's state),
    # then --resume to step 2: the same metrics and the same final weights as two steps in one go
    from safetensors.torch import load_file

    run, _, _ = straight
    out = launch(env, tmp_path / "one", "--algo", "tree_grpo", "--steps", "1", "--run_name", "b")
    assert out.returncode == 0, out.stderr[-4000:]
    resumed = env / "out" / "runs" / "b"
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "rank0.pkl", "rank1.pkl"} <= set(
        os.listdir(resumed / "checkpoint-1")
    )
    out = launch(
        env, tmp_path / "two", "--algo", "tree_grpo", "--steps", "2", "--run_name", "b", "--resume"
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "resumed from" in out.stdout
    # (the one-step run evaluated at its end, step 1: the straight run did not)
    rows = [r for r in metrics(resumed) if not ("eval/em" in r and r["step"] == 1)]
    assert strip(rows) == strip(metrics(run))
    a, b = (load_file(r / "final" / "model.safetensors") for r in (run, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_sharded_checkpoint_resumed_under_ddp_is_refused_saying_both_layouts(env, straight):
    # before: DDP's loader looked for Accelerate's files and said "pytorch_model.bin missing... put
    # back the named files" (and a DDP checkpoint under FSDP2 raised a bare CheckpointException)
    import shutil

    run, _, _ = straight
    shutil.copytree(run, run.parent / "fsdp_then_ddp")
    out = launch_train(
        env,
        *STEPS,
        "--algo",
        "tree_grpo",
        "--steps",
        "3",
        "--run_name",
        "fsdp_then_ddp",
        "--resume",
    )  # plain train.py: under two CPU processes, DDP
    assert out.returncode != 0
    said = "holds a policy sharded by FSDP2 over 2 processes, and this launch holds whole weights"
    assert said in out.stderr and "--num_processes 2`, with the FSDP2 config" in out.stderr
    # every rank refuses alike, before loading: no rank's traceback, no loader's advice (the
    # launcher still reports the failed ranks its own way)
    assert out.stderr.count(said) == 2 and "put back" not in out.stderr
    assert "CheckpointException" not in out.stderr and 'train.py", line' not in out.stderr


def test_a_checkpoint_layout_is_checked_before_any_load(tmp_path, monkeypatch):
    # what each checkpoint records (layout.json), what an older one is read as, and the refusal
    from infra import shard

    class Launch:
        num_processes, is_main_process = 3, True

    monkeypatch.setattr(shard, "sharded", lambda model: False)
    old_ddp, old_fsdp, new = (tmp_path / n for n in ("old_ddp", "old_fsdp", "new"))
    old_ddp.mkdir()
    (old_ddp / "model.safetensors").write_bytes(b"")
    old_fsdp.mkdir()
    for name in (".metadata", "__0_0.distcp", "__1_0.distcp", "rank0.pkl", "rank1.pkl"):
        (old_fsdp / name).write_bytes(b"")
    new.mkdir()
    (new / shard.LAYOUT).write_text('{"sharded": false, "processes": 2}')
    assert shard.saved_layout(old_ddp) == {"sharded": False, "processes": None}
    assert shard.saved_layout(old_fsdp) == {"sharded": True, "processes": 2}
    shard.check_layout(Launch(), None, old_ddp)  # whole, count unrecorded: loads
    for path, held in (
        (old_fsdp, "a policy sharded by FSDP2 over 2 processes"),
        (new, "whole weights (one process or DDP) over 2 processes"),  # 2 ranks on 3
    ):
        with pytest.raises(SystemExit, match=re.escape(f"{path} holds {held}, and this launch")):
            shard.check_layout(Launch(), None, path)


def test_a_failed_distributed_checkpoint_is_an_error_the_handlers_catch():
    # torch's CheckpointException is a BaseException: `except Exception` and `except (OSError,
    # RuntimeError)` never saw it, so a full disk under FSDP2 crashed every rank with no message
    import torch.distributed.checkpoint as dcp

    from infra import shard

    def save(state, checkpoint_id):  # as torch reports a rank's failure: (exception, its stack)
        failure = (OSError(28, "No space left on device"), traceback.StackSummary())
        raise dcp.CheckpointException("write failed", {1: failure})

    said = "torch.distributed.checkpoint's save at /ckpt: rank 1: OSError: [Errno 28] No space"
    with pytest.raises(RuntimeError, match=re.escape(said)):
        shard._dcp(save, {}, "/ckpt")


def test_sharded_weights_stream_into_vllm_and_a_failed_checkpoint_is_clear_on_every_rank(
    tmp_path,
):
    # two gloo ranks, a tiny tied policy sharded (this file's sync probe): the weight sync hands
    # the vLLM engine's load_weights (a stand-in for vllm.LLM that takes the pairs one at a time,
    # as its workers do) each whole tensor in bf16, one at a time, and checks them as they pass;
    # a sharded checkpoint written where no directory can be made (under a file: the tests run as
    # root, whom permissions do not stop) raises torch's CheckpointException, a BaseException that
    # no handler saw: on every rank it is the RuntimeError naming the path that the run's
    # checkpoint handlers catch, as is a load from where no checkpoint is
    from test_multiprocess import launch_command

    (tmp_path / "a_file").write_text("not a directory")
    out = subprocess.run(
        launch_command(Path(__file__), "sync", tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
        env=CPU,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    ranks = [pickle.loads((tmp_path / f"sync{r}.pkl").read_bytes()) for r in (0, 1)]
    full = ranks[0]["full"]  # shard.gather's state dict, float32
    for rank in ranks:
        assert rank["dtensor"] and rank["names"] == list(full), rank["names"]
        assert set(rank["dtypes"]) == {torch.bfloat16}
        # the casts before the current one are gone; of the gathered float32 tensors, the current
        # one alone lives (a state dict would hold them all)
        assert rank["alive"] == [0] * len(full) and max(rank["gathered_alive"]) == 1, rank
        for name, tensor in full.items():
            assert torch.equal(rank["values"][name], tensor.to(torch.bfloat16)), name
        # a NaN in rank 1's shard alone: both ranks name the tensor (its whole holds it)
        assert rank["nonfinite"] == [[], ["model.layers.0.mlp.up_proj.weight"]]
        save, load = rank["checkpoint"]
        assert save.startswith(f"torch.distributed.checkpoint's save at {tmp_path / 'a_file'}")
        assert "rank 0: NotADirectoryError" in save and "rank 1: NotADirectoryError" in save
        assert load.startswith("torch.distributed.checkpoint's load at ")
    assert "CheckpointException" not in out.stderr


def sync_probe(out: Path):
    """The sync test's two ranks: each records (out/sync{rank}.pkl) what the stand-in vLLM engine
    took from two weight syncs, and the messages of a failed sharded save and load."""
    import torch.distributed.checkpoint as dcp
    from accelerate import Accelerator
    from test_engines import stand_in_engine
    from torch.distributed.tensor import DTensor
    from transformers import get_constant_schedule

    from infra import run, shard, warmstart
    from infra.vllm_engine import VLLMEngine

    shard_in_prepare()
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = warmstart.tiny_llama(warmstart.world_tokenizer(), hidden=32, layers=2, heads=2)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer, scheduler = accelerator.prepare(
        model, optimizer, get_constant_schedule(optimizer)
    )
    mine = {"dtensor": all(isinstance(p, DTensor) for p in model.parameters())}
    mine["full"] = {k: v.clone() for k, v in shard.gather(accelerator, model).items()}
    gathered, full = [], shard.full

    def recording_full(x):  # the whole float32 tensors the stream gathers
        whole = full(x)
        gathered.append(weakref.ref(whole))
        return whole

    class LLM:  # vllm.LLM's reload_weights in one process: the pairs one at a time, recorded
        def __init__(self):
            self.log = {"alive": [], "gathered_alive": [], "names": [], "dtypes": [], "values": {}}

        def collective_rpc(self, method, kwargs):
            refs = []
            for name, tensor in kwargs["weights_iterator"]:
                self.log["alive"].append(sum(r() is not None for r in refs))
                self.log["gathered_alive"].append(sum(r() is not None for r in gathered))
                refs.append(weakref.ref(tensor))
                self.log["names"].append(name)
                self.log["dtypes"].append(tensor.dtype)
                self.log["values"][name] = tensor.clone()

        def reset_prefix_cache(self):
            return True

    shard.full, nonfinite = recording_full, []
    for sync in range(2):  # the second with a NaN in rank 1's shard of one tensor
        if sync == 1 and accelerator.process_index == 1:
            with torch.no_grad():
                model.get_parameter("model.layers.0.mlp.up_proj.weight").to_local()[0, 0] = math.nan
        engine = stand_in_engine(VLLMEngine, LLM(), dtype=torch.bfloat16)
        weights = shard.Weights(accelerator, model)
        engine.load_weights(weights)
        nonfinite.append(weights.nonfinite)
        if sync == 0:
            mine.update(engine.llm.log)
    shard.full = full
    mine["nonfinite"] = nonfinite
    messages = []
    try:
        shard.save_state(accelerator, model, optimizer, scheduler, str(out / "a_file" / "ckpt"))
    except RuntimeError as e:
        messages.append(str(e))
    weights_state, adam = shard.get_state_dict(model, shard._optimizer(optimizer))
    try:
        shard._dcp(dcp.load, {"model": weights_state, "optimizer": adam}, str(out / "none"))
    except RuntimeError as e:
        messages.append(str(e))
    mine["checkpoint"] = messages
    (out / f"sync{accelerator.process_index}.pkl").write_bytes(pickle.dumps(mine))
    accelerator.wait_for_everyone()
    run.end_processes(accelerator, 0)


def test_fsdp2_update_equals_one_process_on_the_same_samples(env, tmp_path):
    # test_multiprocess's parity run (7 samples split 5 / 2, both loss aggregations, 2 epochs x 2
    # mini-batches) with the policy sharded: the same weights as one process, to float rounding
    # (the reduce-scatter sums in another order)
    from test_multiprocess import parity_command

    for processes, extra in ((1, []), (2, ["fsdp"])):
        out = subprocess.run(
            parity_command(tmp_path, processes, *extra),
            cwd=env,
            capture_output=True,
            text=True,
            timeout=600,
            env=CPU,
        )
        assert out.returncode == 0, out.stderr[-4000:]
    one = torch.load(tmp_path / "parity1.pt")
    two = torch.load(tmp_path / "parity2_fsdp.pt")
    assert two["dtensor"]
    for agg in ("token-mean", "seq-mean-token-mean"):
        moved = 0.0
        for k, w in one[agg]["weights"].items():
            torch.testing.assert_close(two[agg]["weights"][k], w, atol=1e-5, rtol=1e-4)
            moved = max(moved, (w - one["start"][k]).abs().max().item())
        assert moved > 5e-3  # the updates moved the weights (500 times the tolerance)
        # the norms to the weights' rtol: FSDP2 sums the squared gradients shard by shard, one
        # process whole, and float32 rounds the two orders apart (1.13e-5 relative on one
        # machine's CPU, the same before and after the restructure that moved the partition)
        assert two[agg]["norms"] == pytest.approx(one[agg]["norms"], rel=1e-4)


# ---- the probe: this file as a script under the launcher ----------------------------------------


def shard_in_prepare():
    """Make `Accelerator.prepare` shard a policy as Accelerate's FSDP2 plugin does on a GPU:
    `fully_shard` on each decoder layer, then on the model; an optimizer handed over with it is
    pointed at the sharded parameters (same order). Other objects go through as before."""
    from accelerate import Accelerator
    from torch.distributed.fsdp import fully_shard
    from transformers import PreTrainedModel

    prepare = Accelerator.prepare

    def sharding_prepare(self, *objects):
        moved = {}
        for obj in objects:
            if isinstance(obj, PreTrainedModel):
                before = list(obj.parameters())
                for layer in obj.model.layers:
                    fully_shard(layer)
                fully_shard(obj)
                moved.update(zip(map(id, before), obj.parameters()))
        for obj in objects:
            if isinstance(obj, torch.optim.Optimizer):
                for group in obj.param_groups:
                    group["params"] = [moved.get(id(p), p) for p in group["params"]]
        rest = [o for o in objects if not isinstance(o, PreTrainedModel)]
        prepared = iter(prepare(self, *rest) if len(rest) > 1 else [prepare(self, *rest)])
        out = tuple(o if isinstance(o, PreTrainedModel) else next(prepared) for o in objects)
        return out if len(out) > 1 else out[0]

    Accelerator.prepare = sharding_prepare


def train_probe(records: Path, argv: list[str]):
    """train.py with `argv`, its policy sharded; each rank records whether its parameters are
    DTensors (and its shard's rows against the full ones) and, at the end, its engine's weights."""
    from accelerate import Accelerator
    from torch.distributed.tensor import DTensor

    import train
    from advantages import CreditConfig
    from infra import flags, protocol, run, shard
    from infra.warmstart import WarmConfig
    from retriever import RetrieverConfig
    from rollout import RolloutConfig

    shard_in_prepare()
    rank = int(os.environ.get("RANK", "0"))
    mine = {}
    prepare, end, update = Accelerator.prepare, run.end, train.update
    gather = shard.gather

    def recording_prepare(self, *objects):
        out = prepare(self, *objects)
        model = out[0]
        params = list(model.parameters())
        embed = model.model.embed_tokens.weight
        mine.update(
            dtensor=all(isinstance(p, DTensor) for p in params),
            shard_rows=embed.to_local().shape[0],
            full_rows=embed.shape[0],
        )
        return out

    def recording_end(accelerator, engine, stopped):
        weights = engine.model.state_dict()
        mine["engine"] = {k: v.detach().clone() for k, v in weights.items()}
        (records / f"rank{rank}.pkl").write_bytes(pickle.dumps(mine))
        end(accelerator, engine, stopped)

    def recording_update(*args):  # each step's applied optimizer steps (their gradient norms)
        out = update(*args)
        mine.setdefault("steps", []).append({"grad_norms": out[1]})
        return out

    refs = []  # weak references to the whole tensors of the weight syncs and gathers so far
    alive = lambda: sum(r() is not None for r in refs)

    def recording_stream(self):  # how many whole tensors live at once, as the engine takes them
        gc.collect()
        mine.setdefault("alive_at_sync", []).append(alive())
        mine.setdefault("passed", []).append(0)
        for name, tensor in stream(self):
            mine.setdefault("alive_in_sync", []).append(alive())  # those before, with it made
            refs.append(weakref.ref(tensor))
            mine["passed"][-1] += 1
            yield name, tensor
            del tensor

    def recording_gather(accelerator, model):  # final/'s: none of the syncs' tensors lives
        gc.collect()
        mine.setdefault("alive_at_gather", []).append(alive())
        weights = gather(accelerator, model)
        tied = weights.get("lm_head.weight"), weights.get("model.embed_tokens.weight")
        mine["tied_once"] = tied[0] is tied[1] is not None  # one all-gather for both names
        return weights

    Accelerator.prepare, run.end = recording_prepare, recording_end
    train.update, shard.gather = recording_update, recording_gather
    stream, shard.Weights.__iter__ = shard.Weights.__iter__, recording_stream
    sys.argv = [str(ROOT / "train.py"), *argv]
    train.main(
        *flags.parse(
            train.Args,
            RolloutConfig,
            CreditConfig,
            protocol.AgentConfig,
            RetrieverConfig,
            WarmConfig,
        )
    )


if __name__ == "__main__":
    faulthandler.dump_traceback_later(WATCHDOG, exit=True)  # a hang dumps every rank's stacks
    if sys.argv[1] == "sync":
        sync_probe(Path(sys.argv[2]))
    else:
        train_probe(Path(sys.argv[2]), sys.argv[3:])


def test_sharded_gradients_sync_at_every_micro_batch_and_ddp_once(monkeypatch):
    # FSDP2: reduce-scattered at every micro-batch, so each rank keeps only its float32 shard of
    # the gradients (never the whole gradients, in bf16); DDP: reduced once, at the last
    from contextlib import contextmanager

    from infra import shard

    calls = []

    class Recording:
        num_processes = 2

        @contextmanager
        def no_sync(self, model):
            calls.append("no_sync")
            yield

        def set_requires_gradient_sync(self, on):
            calls.append(f"gradient_sync {on}")

    for is_sharded, want in ((True, []), (False, ["no_sync"])):
        monkeypatch.setattr(shard, "sharded", lambda model, s=is_sharded: s)
        calls.clear()
        for sync in (False, False, True):  # a mini-batch of three micro-batches
            with shard.accumulate(Recording(), Recording(), sync=sync):
                pass
        assert calls == want * 2, (is_sharded, calls)


def test_under_fsdp2_with_bf16_the_gradients_reduce_in_float32(monkeypatch):
    # what train.py hands Accelerate under `accelerate launch` with benchmarks/fsdp2.yaml: its
    # FSDP2 plugin, whose mixed-precision policy reduces in float32 and survives Accelerate's own
    # bf16 setting (AcceleratorState calls set_mixed_precision on a given plugin); Accelerate's
    # plugin alone reduces in bf16. (Whether the GPU run honours it: benchmarks/gpu_check.sh.)
    from accelerate.utils import FullyShardedDataParallelPlugin

    from infra import shard

    for name, value in (("ACCELERATE_USE_FSDP", "true"), ("FSDP_VERSION", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert shard.fsdp_plugin() is None  # float32 throughout: nothing to set
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    plugin = shard.fsdp_plugin()
    plugin.set_mixed_precision("bf16")  # as AcceleratorState does
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    theirs = FullyShardedDataParallelPlugin()
    theirs.set_mixed_precision("bf16")
    assert theirs.mixed_precision_policy.reduce_dtype == torch.bfloat16
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")  # DDP: the launch's settings
    assert shard.fsdp_plugin() is None
