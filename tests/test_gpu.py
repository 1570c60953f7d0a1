"""What only a GPU can show, skipped without CUDA (benchmarks/gpu_check.sh runs this file first):
activation checkpointing's gradients under bf16 kernels, --pack_trees on the GPU recipe's model
class (Qwen2) under bf16, bf16's first step, train.py under
Accelerate's own FSDP2 plugin (benchmarks/fsdp2.yaml), trained, saved and resumed, and the HF
engine's log-probs, kept as generate goes, equal to the bit to output_logits' under bf16."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_loss import checkpointing_gradients
from test_pack_trees import packed_against_path, tiny_qwen2
from test_train import metrics, train_command

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ROOT = Path(__file__).resolve().parents[1]


def launch(env, config: list[str], *args) -> subprocess.CompletedProcess:
    """train.py (the tests' fast flags and `args`) under `accelerate launch` with `config`."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", *config]
    return subprocess.run(
        [*launcher, *train_command(env, *args)[1:]],
        cwd=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_gradient_checkpointing_gives_the_same_gradients_on_the_gpu():
    # bf16 autocast on CUDA: the recomputation may take other kernels than the first forward, so
    # the gradients agree to bf16's rounding, not to the bit as on CPU
    off, on = checkpointing_gradients("cuda", torch.bfloat16)
    for name in off:
        torch.testing.assert_close(on[name], off[name], rtol=2e-2, atol=1e-4)


def test_packed_trees_on_the_gpu_recipes_model_class_under_bf16():
    # --pack_trees on CUDA: SDPA given the 4-D mask leaves the flash kernel for the memory-efficient
    # one, and bf16 sums the attention in another order than the path form's; bf16's rounding
    errors = packed_against_path(tiny_qwen2().cuda().train(), "cuda", torch.bfloat16)
    assert max(errors.values()) <= 2e-2, errors


@pytest.mark.parametrize("ref_dtype", ["float32", "compute"])
def test_bf16_step_one_has_ratio_one_and_the_stated_kl(env, ref_dtype):
    # step 1 updates nothing before its statistics (the warmup's first learning rate is 0): the
    # ratio is 1; the KL is 0 with a float32 reference, and the bf16 rounding of its weights with
    # the default bf16 one (9.8e-8 on CPU for this tiny policy; below 1e-5)
    config = "--num_processes 1 --mixed_precision bf16 --dynamo_backend no".split()
    run = f"gpu_bf16_{ref_dtype}"
    out = launch(
        env,
        config,
        *f"--algo tree_grpo --steps 1 --eval_every 0 --ref_dtype {ref_dtype}".split(),
        *["--run_name", run],
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = metrics(env, run)
    assert abs(row["train/ratio_p5"] - 1) < 2e-6 and abs(row["train/ratio_p95"] - 1) < 2e-6, row
    assert row["train/kl"] < (1e-9 if ref_dtype == "float32" else 1e-5), row


def test_fsdp2_through_accelerate_trains_saves_and_resumes(env):
    # Accelerate's FSDP2 plugin (benchmarks/fsdp2.yaml, one process): two steps with a sharded
    # checkpoint each, then --resume to a third; final/ loads with from_pretrained
    from transformers import AutoModelForCausalLM

    config = ["--config_file", str(ROOT / "benchmarks" / "fsdp2.yaml")]
    steps = "--algo tree_grpo --eval_every 0 --checkpoint_every 1 --run_name gpu_fsdp2".split()
    out = launch(env, config, *steps, "--steps", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    run = env / "out" / "runs" / "gpu_fsdp2"
    assert (run / "checkpoint-2" / ".metadata").exists()  # sharded: torch.distributed.checkpoint
    out = launch(env, config, *steps, "--steps", "3", "--resume")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stdout
    rows = [r for r in metrics(env, "gpu_fsdp2") if "train/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    AutoModelForCausalLM.from_pretrained(run / "final")
    state = json.loads((run / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["step"] == 3 and os.path.exists(run / "checkpoint-3" / "rank0.pkl")


def test_hf_engine_logprobs_are_output_logits_ones_on_the_gpu_under_bf16():
    # the HF engine keeps each sampled token's log-prob as generate goes (a forward hook on one
    # step's raw logits) instead of every step's float32 logits: on CUDA under bf16 autocast too,
    # the same samples and log-probs equal to the bit to what output_logits gave
    from test_engines import check_against_output_logits

    from infra import warmstart
    from infra.engines import HFEngine, Sampling
    from rollout import rollout_logprob

    tok = warmstart.world_tokenizer()
    model = warmstart.tiny_llama(tok, hidden=64, layers=2, heads=2).cuda().eval()
    model.forward = torch.autocast("cuda", dtype=torch.bfloat16)(model.forward)
    questions = ["who wrote the book", "where was the author of the book born", "what", "when"]
    prompts = [tok.encode(q) for q in questions]
    sampling = Sampling(temperature=0.7, top_p=0.9, max_tokens=24, stop=["</search>"], seed=0)
    sampling.logprob = rollout_logprob  # pi_rollout, as the agent scores its tokens
    out = check_against_output_logits(HFEngine(model, tok, max_batch_size=3), prompts, sampling)
    assert [len(c.token_ids) for c in out] and all(c.logprobs for c in out)
