"""benchmarks/gpu_memory.py on CPU at the tiny shape: its counted terms are the byte counts worked
out by hand from the tiny config; the plan's arithmetic on hand-made figures; and
benchmarks/checks/precision.py's --help and its copy of the tests' small flags. No timing is
asserted."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "checks"))
import gpu_memory  # noqa: E402
import precision  # noqa: E402
from gpu_memory import Recipe  # noqa: E402
from test_train import FAST, TINY_WARM  # noqa: E402

GIB = 2**30
# benchmarks/shapes/tiny: hidden 64, intermediate 160, 2 layers, 4 heads of 16, 2 KV heads,
# vocabulary 512, tied embeddings. A layer: q 64 x 64 + 64 = 4,160; k, v 64 x 32 + 32 = 2,080 each;
# o 64 x 64 = 4,096; gate, up, down 3 x 64 x 160 = 30,720; 2 norms 2 x 64 = 128: 43,264. Embeddings
# 512 x 64 = 32,768, final norm 64: 32,768 + 2 x 43,264 + 64 = 119,360 parameters in 1 + 2 x 12 + 1
# = 26 tensors (a layer: q, k, v weights and biases, o, gate, up, down, 2 norms)
TINY_PARAMS, TINY_TENSORS = 119_360, 26
# 3B: embeddings 151,936 x 2,048 = 311,164,928; a layer: q 2,048 x 2,048 + 2,048 = 4,196,352, k and
# v 2,048 x 256 + 256 = 524,544 each, o 4,194,304, MLP 3 x 2,048 x 11,008 = 67,633,152, norms 4,096:
# 77,076,992; x 36 layers = 2,774,771,712; + embeddings + final norm 2,048 = 3,085,938,688
P3B, LAYER_3B, ROOT_3B = 3_085_938_688, 77_076_992, 311_164_928 + 2_048


def run_tiny(tmp_path, *flags):
    out = tmp_path / "m.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_memory.py"), "--shape", "tiny"]
        + ["--length", "32", "--json", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # the CPU path, with a GPU or without
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def test_counted_terms_are_the_tiny_configs_bytes(tmp_path):
    assert gpu_memory.parameter_count("tiny") == TINY_PARAMS
    assert gpu_memory.layer_sizes("3B") == (LAYER_3B, ROOT_3B)
    assert gpu_memory.parameter_count("3B") == P3B
    stdout, figures = run_tiny(tmp_path)
    m = figures["measurement"]
    assert (m["device"], m["shape"], m["mixed_precision"], m["fsdp"]) == (
        "CPU (no CUDA)",
        "tiny",
        "no",
        "none",
    )
    # float32 weights and gradients: 4 B a parameter; AdamW: exp_avg and exp_avg_sq, 4 B each a
    # parameter, and one float32 step count per tensor; the reference in float32 (no autocast)
    assert m["counted_bytes"] == {
        "parameters": 4 * 119_360,
        "gradients": 4 * 119_360,
        "optimizer": 8 * 119_360 + 4 * 26,
        "reference": 4 * 119_360,
    }
    # without CUDA: no GPU peak; the RSS rise is labelled as what it is
    # (ru_maxrss is the process's peak so far: the rise is 0 when the imports peaked higher)
    assert m["peak_gib"] is None and m["resident_gib"] is None and m["rss_rise_gib"] >= 0
    assert "NOT a GPU figure" in stdout and "PLAN, per GPU" in stdout
    assert len(figures["plan"]) == len(gpu_memory.RECIPES)


def test_fsdp2_on_one_rank_with_a_bf16_reference_counts_the_same_shards(tmp_path):
    # one rank: every shard is the whole tensor; under bf16 the reference takes 2 B a parameter
    flags = "--fsdp --gradient_checkpointing --mixed_precision bf16 --micro_batches 1".split()
    _, figures = run_tiny(tmp_path, *flags)
    m = figures["measurement"]
    assert (m["fsdp"], m["checkpointing"], m["ref_dtype"]) == ("fsdp2", True, "bfloat16")
    assert m["counted_bytes"] == {
        "parameters": 4 * TINY_PARAMS,
        "gradients": 4 * TINY_PARAMS,
        "optimizer": 8 * TINY_PARAMS + 4 * TINY_TENSORS,
        "reference": 2 * TINY_PARAMS,
    }


def test_the_rollout_and_gradient_sync_measurements_run_on_the_tiny_shape(tmp_path):
    # the GPU check's HF-engine rollout (at 3 B: 32 prompts of 3,500 ids, 500 new tokens) and
    # FSDP2's gradient sync off / on, on the CPU path: the code runs, the plan's terms for the
    # same call stand beside the (GPU-only) peak, and nothing joins the plan's figures
    a = gpu_memory.Args(shape="tiny", length=32, hf_sequences=3, hf_new_tokens=8)
    stdout, figures = run_tiny(tmp_path, "--rollout", "--hf_sequences", "3", "--hf_new_tokens", "8")
    r = figures["rollout"]
    assert figures["measurement"] is None and "PLAN" not in stdout
    assert (r["sequences"], r["prompt_tokens"], r["new_tokens"]) == (3, 24, 8)
    assert 3 <= r["generated"] <= 24 and r["seconds"] > 0  # an EOS may end a row early
    terms = {
        t["key"]: t["gib"]
        for t in gpu_memory.hf_terms(
            Recipe("", "", length=32, shape="tiny"), a, 0, gpu_memory.config("tiny"), False
        )
    }
    assert r["planned_above_resident_gib"] == {
        "P": terms["kv_prefill"] + terms["prefill_transients"] + terms["logits"],
        "D": terms["kv_cache"] + terms["logits"],
    }
    assert r["peak_above_resident_gib"] is None and "NOT a GPU figure" in stdout  # no CUDA
    assert gpu_memory.earlier_measurement(str(tmp_path / "m.json")) is None  # not a plan figure
    stdout, figures = run_tiny(tmp_path, "--grad_sync", "--fsdp", "--gradient_checkpointing")
    s = figures["grad_sync"]
    assert (s["parameters"], s["checkpointing"], s["sync"]) == (TINY_PARAMS, True, {})
    assert "no CUDA: nothing measured" in stdout
    for flags, said in (
        (["--grad_sync"], "--grad_sync needs --fsdp"),
        (["--rollout", "--grad_sync", "--fsdp"], "one measurement at a time"),
        (["--rollout", "--hf_new_tokens", "32"], "--rollout needs --length above --hf_new_tokens"),
    ):
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "gpu_memory.py"), "--shape", "tiny"]
            + ["--length", "32", *flags],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )
        assert done.returncode != 0 and said in done.stderr, done.stderr[-2000:]


def row(checkpointing, micro_batch, peak=None, oom=None, fsdp="none", shape="3B", length=4096):
    """A hand-made figure (3B, 4,096 tokens a row unless told), bf16 autocast, float32 reference."""
    return {
        "source": "measured",
        "shape": shape,
        "micro_batch": micro_batch,
        "length": length,
        "mixed_precision": "bf16",
        "fsdp": fsdp,
        "checkpointing": checkpointing,
        "ref_dtype": "float32",
        "peak_gib": peak,
        "oom_at_gib": oom,
    }


def test_the_plan_adds_its_terms_by_hand():
    a = gpu_memory.Args()  # a 79.2 GiB GPU, 3 kept free, vLLM at 0.3 of it: 23.76 GiB
    # counted at 3B, float32 reference: (4 + 4 + 8 + 4) B x P3B = 57.48 GiB; a peak of 69.1 leaves
    # 69.1 - 57.48 = 11.62 GiB of activations at 2 x 4,096 tokens
    counted = 20 * P3B / GIB
    rows = [row(True, 2, peak=69.1)]
    fsdp8 = Recipe("8 GPUs", "", gpus=8, ranks=8, fsdp="fsdp2")
    p = gpu_memory.plan(fsdp8, rows, a)
    t = p["terms_gib"]
    # float32 weights, gradients (reduce-scattered: sharded) and AdamW's foreach temporaries: 4 B
    # a parameter over 8 ranks, 1.437 GiB each; AdamW's two states 8 B: 2.874 GiB
    assert t["weights"] == t["gradients"] == t["adamw_temporaries"] == 4 * P3B / 8 / GIB
    assert abs(t["weights"] - 1.437) < 1e-3 and t["adamw"] == 8 * P3B / 8 / GIB
    assert t["reference"] == P3B * 2 / GIB  # bf16: 5.748 GiB, not sharded
    assert math.isclose(t["activations"], 69.1 - counted)  # the same tokens: x1
    assert math.isclose(t["engine"], 0.3 * 79.2)  # 23.76
    # the root (311,166,976) and 2 layers (2 x 77,076,992) gathered in bf16; the root's and a
    # layer's gradients in bf16 and their float32 copy for the reduce-scatter: 3.04 GiB
    buffers = ((ROOT_3B + 2 * LAYER_3B) * 2 + (ROOT_3B + LAYER_3B) * 6) / GIB
    assert t["fsdp_buffers"] == buffers and abs(buffers - 3.04) < 5e-3
    # the weight sync streams whole float32 tensors (shard.Weights): the one gathered and the one
    # the engine still holds, at most the embedding's 311,164,928 x 4 B each, and the isfinite
    # mask, 1 B an element: 9 B x 311,164,928 = 2.61 GiB (a state dict was 11.50)
    assert t["state_dict"] == 9 * 311_164_928 / GIB and round(t["state_dict"], 2) == 2.61
    # the moments: the backward holds the activations and buffers, the step the temporaries, the
    # sync the streamed tensors; gradients are gone at the sync and in the rollout
    resident = t["weights"] + t["adamw"] + t["reference"] + t["engine"]
    m = p["moments_gib"]
    assert math.isclose(m["B"], resident + t["gradients"] + t["activations"] + buffers)
    assert math.isclose(m["S"], resident + t["gradients"] + t["adamw_temporaries"])
    assert math.isclose(m["W"], resident + t["state_dict"])
    assert m["P"] == m["D"] and math.isclose(m["D"], resident)
    assert p["update_peak_gib"] == m["B"] and p["total_gib"] == max(m.values())
    assert p["fits"] == "yes"  # 49.9 + 3 <= 79.2
    # one GPU, micro-batch 1: the state whole and half the tokens: x0.5
    one = Recipe("1 GPU", "", ref_dtype="float32", micro_batch=1)
    p = gpu_memory.plan(one, rows, a)
    t = p["terms_gib"]
    assert t["weights"] == t["gradients"] == 4 * P3B / GIB and t["fsdp_buffers"] == 0
    assert t["reference"] == 4 * P3B / GIB and t["state_dict"] == 0
    assert math.isclose(t["activations"], (69.1 - counted) / 2)
    # the optimizer step now peaks above the backward: S 57.48 + 11.50 (AdamW's temporaries, whole)
    # + 23.76 = 92.74 against B 57.48 + 5.81 + 23.76 = 87.05; over 79.2 - 3
    m = p["moments_gib"]
    assert math.isclose(m["B"], counted + (69.1 - counted) / 2 + 0.3 * 79.2)
    assert math.isclose(p["update_peak_gib"], counted + 4 * P3B / GIB + 0.3 * 79.2)
    assert p["update_peak_gib"] == m["S"] > m["B"] and p["fits"] == "no"
    # a second figure at 1 x 4,096 (peak 65.1: 7.62 GiB): a line through both; at 3 x 4,096 it
    # goes on by the same 4.0 GiB a row: 11.62 + 4.0
    rows.append(row(True, 1, peak=65.1))
    three = Recipe("1 GPU", "", ref_dtype="float32", micro_batch=3)
    assert math.isclose(
        gpu_memory.plan(three, rows, a)["terms_gib"]["activations"], 69.1 - counted + 4.0
    )
    # a figure that ran out of memory is a lower bound: 77.0 - 57.48 = 19.52 GiB at least
    rows.append(row(False, 2, oom=77.0))
    off = Recipe("1 GPU", "", checkpointing=False, ref_dtype="float32", engine="hf")
    p = gpu_memory.plan(off, rows, a)
    assert p["lower_bound"] and math.isclose(p["terms_gib"]["activations"], 77.0 - counted)
    # 57.48 + >= 19.52 = >= 77.0: over 79.2 - 3 whatever the rest
    assert p["fits"] == "no"
    a.gpu_gib = 200.0
    assert gpu_memory.plan(off, rows, a)["fits"] == "unknown (a lower bound)"


def test_the_rollout_phase_at_3b_and_the_readme_recipe():
    # the HF engine: 32 sequences (infra/engines.py), 500 new tokens of 4,096; K float32 (RoPE in
    # the float32 residual) and V bf16: 36 layers x 2 KV heads x 128 x 6 B = 55,296 B a token
    a = gpu_memory.Args()
    hf = next(r for r in gpu_memory.RECIPES if r.engine == "hf")
    assert (hf.micro_batch, hf.length, hf.ref_dtype) == (2, 4096, "bfloat16")  # the README's
    p = gpu_memory.plan(hf, gpu_memory.table_rows()[1], a)
    t = p["terms_gib"]
    # a step's logits, not every step's (output_logits kept 32 x 500 x 151,936 x 4 B = 9.06 GiB):
    # six (32, 151,936) float32 tensors, and 32 x 500 float32 log-probs
    assert t["logits"] == (6 * 32 * 151_936 + 32 * 500) * 4 / GIB and round(t["logits"], 2) == 0.11
    assert t["kv_cache"] == 32 * 4096 * 55_296 / GIB and t["kv_prefill"] == 32 * 3596 * 55_296 / GIB
    assert t["prefill_transients"] == 32 * 3596 * (3 * 11_008 * 2 + 2 * 2048 * 4) / GIB
    assert t["rollout_weights"] == 0  # it samples from the policy's own weights
    # the update: the measured peak at 2 x 4,096 with a bf16 reference, 64.35 GiB, term by term
    assert math.isclose(p["update_peak_gib"], 64.35) and p["fits"] == "yes"
    resident = (4 + 8 + 2) * P3B / GIB  # weights, AdamW, reference: 40.24 (measured 40.4)
    m = p["moments_gib"]
    assert math.isclose(m["D"], resident + t["kv_cache"] + t["logits"])  # 47.09 (was 56.04)
    # the prefill is the rollout phase's peak now: 40.24 + 5.93 + 8.83 + 0.11 = 55.10
    prefill = resident + t["kv_prefill"] + t["prefill_transients"] + t["logits"]
    assert math.isclose(m["P"], prefill) and p["rollout_peak_gib"] == m["P"] > m["D"]
    assert math.isclose(p["sync_gib"], resident)


def test_the_plan_terms_on_the_tiny_shape():
    # tiny: 119,360 parameters; a layer 43,264, the root 32,832; hidden 64, intermediate 160,
    # 2 layers, 4 heads of 16, 2 KV heads, vocabulary 512
    n, layer, root = TINY_PARAMS, 43_264, 32_832
    assert gpu_memory.layer_sizes("tiny") == (layer, root)
    a = gpu_memory.Args(gpu_gib=10.0, reserve_gib=1.0, hf_sequences=4, hf_new_tokens=8)
    # one figure at 2 x 32 tokens, float32 reference: 0.5 GiB above the counted 20 B a parameter
    rows = [row(True, 2, peak=20 * n / GIB + 0.5, shape="tiny", length=32)]
    two = Recipe("2 GPUs", "", gpus=2, ranks=2, fsdp="fsdp2", length=32, shape="tiny")
    p = gpu_memory.plan(two, rows, a)
    t = p["terms_gib"]
    assert t["weights"] == t["gradients"] == t["adamw_temporaries"] == 4 * n / 2 / GIB
    assert t["adamw"] == 8 * n / 2 / GIB and t["reference"] == 2 * n / GIB
    assert math.isclose(t["activations"], 0.5)
    assert t["fsdp_buffers"] == ((root + 2 * layer) * 2 + (root + layer) * 6) / GIB
    # the streamed tensors: twice the largest (the embedding, 512 x 64) and its isfinite mask
    assert gpu_memory.largest_tensor("tiny") == 32_768
    assert t["engine"] == 0.3 * 10.0 and t["state_dict"] == 9 * 32_768 / GIB
    assert "ddp_buckets" not in t
    resident = (4 * n / 2 + 8 * n / 2 + 2 * n) / GIB + 3.0
    assert math.isclose(p["moments_gib"]["W"], resident + 9 * 32_768 / GIB)
    assert math.isclose(p["rollout_peak_gib"], resident)
    # DDP over 2 GPUs: whole state, and its buckets a second copy of the gradients
    ddp = Recipe("2 GPUs DDP", "", gpus=2, length=32, shape="tiny")
    t = gpu_memory.plan(ddp, rows, a)["terms_gib"]
    assert t["ddp_buckets"] == t["gradients"] == 4 * n / GIB and t["state_dict"] == 0
    # the HF engine on one GPU, micro-batch 1: half the figure's tokens (x0.5); 4 sequences of
    # 32 tokens, 8 generated: KV 2 layers x 2 KV heads x 16 x 6 B = 384 B a token
    hf = Recipe("1 GPU", "", micro_batch=1, length=32, engine="hf", shape="tiny")
    p = gpu_memory.plan(hf, rows, a)
    t = p["terms_gib"]
    assert math.isclose(t["activations"], 0.25) and t["rollout_weights"] == 0
    assert t["kv_prefill"] == 4 * 24 * 384 / GIB and t["kv_cache"] == 4 * 32 * 384 / GIB
    assert t["prefill_transients"] == 4 * 24 * (3 * 160 * 2 + 2 * 64 * 4) / GIB
    assert t["logits"] == (6 * 4 * 512 + 4 * 8) * 4 / GIB  # a step's: six (4, 512), 4 x 8 kept
    resident = (4 + 8 + 2) * n / GIB
    m = p["moments_gib"]
    assert math.isclose(m["P"], resident + t["kv_prefill"] + t["prefill_transients"] + t["logits"])
    assert math.isclose(m["D"], resident + t["kv_cache"] + t["logits"])
    assert p["rollout_peak_gib"] == max(m["P"], m["D"])
    assert math.isclose(p["update_peak_gib"], resident + 4 * n / GIB + 0.25)  # B: grads + acts
    # under FSDP2 the HF engine samples from a whole float32 copy, there at every moment
    hf2 = Recipe("2 GPUs", "", gpus=2, ranks=2, fsdp="fsdp2", length=32, engine="hf", shape="tiny")
    assert gpu_memory.plan(hf2, rows, a)["terms_gib"]["rollout_weights"] == 4 * n / GIB
    # each term is labelled: only the activations are measured (a GPU figure's remainder)
    kinds = {t["key"]: t["kind"] for t in p["terms"]}
    assert kinds.pop("activations") == "measured" and set(kinds.values()) == {"derived"}
    assert gpu_memory.plan(hf, [], a)["terms"][5]["kind"] == "no figure"


def test_plan_only_prints_every_term_labelled(capsys):
    gpu_memory.main(gpu_memory.Args(plan_only=True))
    out = capsys.readouterr().out
    blocks = [b for b in out.split("\n\n") if b[:1].isdigit()]  # one block a recipe
    assert len(blocks) == len(gpu_memory.RECIPES)
    for block in blocks:
        lines = block.splitlines()
        end = next(i for i, line in enumerate(lines) if line.startswith("update peak"))
        terms = lines[lines.index("|---|---|---|---|---|") + 1 : end]
        kinds = [line.split(" | ")[2] for line in terms]
        assert terms and set(kinds) <= {"measured", "derived"}, block
        assert "ROLLOUT-PHASE peak" in lines[end]
    eight = next(b for b in blocks if "FSDP2 over 8 ranks" in b.splitlines()[0])
    assert "update peak 50.91 (B 50.91, S 36.69)" in eight and "weight sync 36.43" in eight
    for term in ("weights / 8", "gradients / 8", "AdamW exp_avg", "foreach temporaries / 8"):
        assert f" {term}" in eight
    assert "| 12.62 | measured |" in eight and "| 23.76 | derived |" in eight


def test_the_committed_table_gives_the_h100_remainders():
    _, rows = gpu_memory.table_rows()
    # counted: 20 B x P3B = 57.48 GiB (float32 reference), 18 B x P3B = 51.73 GiB (bf16). Two runs:
    # off, float32: out of memory at 77.0 (2bb8e5d) and 77.3: 19.52, 19.82 at least; off, bf16:
    # at 76.3: 24.57 at least; on: 69.1 - 57.48 = 11.62, 63.3 - 51.73 = 11.57, 70.0 - 57.48 =
    # 12.52, 64.35 - 51.73 = 12.62; FSDP2 (one rank) and micro-batch 1: 63.39 - 51.73 = 11.66
    remainders = [gpu_memory.remainder_gib(r) for r in rows]
    assert [(round(g, 2), lower) for g, lower in remainders] == [
        (19.52, True), (11.62, False), (11.57, False), (19.82, True), (24.57, True),
        (12.52, False), (12.62, False), (11.66, False), (11.66, False),
    ]  # fmt: skip
    # the plan's one-GPU micro-batch-1 recipe: a line through 8,192 tokens (the largest
    # remainder there, 12.62) and 4,096 (11.66) gives 11.66 at 4,096 tokens, not half of 12.62
    one = next(r for r in gpu_memory.RECIPES if r.micro_batch == 1)
    act = gpu_memory.plan(one, rows, gpu_memory.Args())["terms_gib"]["activations"]
    assert round(act, 2) == 11.66


def test_precision_help_and_the_tests_small_flags():
    assert precision.FAST == FAST and precision.TINY_WARM == TINY_WARM
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "checks" / "precision.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "--steps" in done.stdout, done.stderr


def test_its_output_and_figures_paths_are_checked_before_the_work(tmp_path):
    # before: --json into a missing directory failed after the measurement and the plan, and a
    # missing --figures file raised a FileNotFoundError traceback that named no flag
    missing, figures = tmp_path / "missing" / "m.json", tmp_path / "m0.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_memory.py"), "--plan_only"]
        + ["--json", str(missing), "--figures", str(figures)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr and "PLAN" not in done.stdout
    assert f"--json {str(missing)!r}: the directory {missing.parent} does not exist" in done.stderr
    assert f"--figures {str(figures)!r}: no such file; pass an earlier --json" in done.stderr
    # a file that is not an earlier --json: named, with what to pass
    figures.write_text("[1]")
    with pytest.raises(SystemExit, match=r"m0.json': no \"measurement\" in it"):
        gpu_memory.earlier_measurement(str(figures))
    figures.write_text("{")
    with pytest.raises(SystemExit, match=r"m0.json' cannot be read as JSON \(JSONDecodeError"):
        gpu_memory.earlier_measurement(str(figures))
