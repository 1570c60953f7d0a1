"""benchmarks/gpu_memory.py on CPU at the tiny shape: its counted terms are the byte counts worked
out by hand from the tiny config; the plan's arithmetic on hand-made figures; and
benchmarks/precision.py's --help and its copy of the tests' small flags. No timing is asserted."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
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


def row(checkpointing, micro_batch, peak=None, oom=None, fsdp="none"):
    """A hand-made figure at 3B, 4,096 tokens a row, bf16 autocast, float32 reference."""
    return {
        "source": "measured",
        "shape": "3B",
        "micro_batch": micro_batch,
        "length": 4096,
        "mixed_precision": "bf16",
        "fsdp": fsdp,
        "checkpointing": checkpointing,
        "ref_dtype": "float32",
        "peak_gib": peak,
        "oom_at_gib": oom,
    }


def test_the_plan_adds_its_terms_by_hand():
    a = gpu_memory.Args()  # an 80 GiB GPU, 3 kept free, vLLM 24 GiB
    # counted at 3B, float32 reference: (4 + 4 + 8 + 4) B x P3B = 57.48 GiB; a peak of 69.1 leaves
    # 69.1 - 57.48 = 11.62 GiB of activations at 2 x 4,096 tokens
    counted = 20 * P3B / GIB
    rows = [row(True, 2, peak=69.1)]
    fsdp8 = Recipe("8 GPUs", "", gpus=8, ranks=8, fsdp="fsdp2")
    p = gpu_memory.plan(fsdp8, rows, a)
    t = p["terms_gib"]
    assert t["state"] == 3_085_938_688 * 16 / 8 / 2**30  # 5.748 GiB (46.0 / 8)
    assert abs(t["state"] - 5.748) < 1e-3
    assert t["reference"] == 3_085_938_688 * 2 / 2**30  # bf16: 5.748 GiB, not sharded
    assert math.isclose(t["activations"], 69.1 - counted)  # the same tokens: x1
    assert t["engine"] == 24.0
    # no FSDP2 figure: its buffers estimated, the root (311,166,976) and 2 layers (2 x 77,076,992)
    # gathered in bf16, the root's and a layer's bf16 gradients
    assert t["fsdp_buffers"] == ((ROOT_3B + 2 * LAYER_3B) * 2 + (ROOT_3B + LAYER_3B) * 2) / GIB
    assert p["total_gib"] == sum(t.values()) and p["fits"] == "yes"  # 49 + 3 <= 80
    # one GPU, micro-batch 1: the state whole (46.0 GiB) and half the tokens: x0.5
    one = Recipe("1 GPU", "", ref_dtype="float32", micro_batch=1)
    p = gpu_memory.plan(one, rows, a)
    assert p["terms_gib"]["state"] == 16 * P3B / GIB and p["terms_gib"]["fsdp_buffers"] == 0
    assert p["terms_gib"]["reference"] == 4 * P3B / GIB
    assert math.isclose(p["terms_gib"]["activations"], (69.1 - counted) / 2)
    # 46.0 + 11.5 + 5.8 + 24 = 87.3 > 80 - 3
    assert p["total_gib"] > 77 and p["fits"] == "no"
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
    # the HF engine: 16 rows x 4,096 tokens of float32 K and V, 36 layers x 2 KV heads x 128
    assert p["terms_gib"]["engine"] == 16 * 4096 * 36 * 2 * 2 * 128 * 4 / GIB  # 4.5 GiB
    # 46.0 + 11.5 + >= 19.5 + 4.5 = >= 81.5: over 80 whatever the rest
    assert p["fits"] == "no"
    a.gpu_gib = 200.0
    assert gpu_memory.plan(off, rows, a)["fits"] == "unknown (a lower bound)"


def test_a_figure_measured_under_fsdp2_holds_its_buffers():
    rows = [row(True, 2, peak=69.1), row(True, 2, peak=70.0, fsdp="fsdp2")]
    fsdp8 = Recipe("8 GPUs", "", gpus=8, ranks=8, fsdp="fsdp2")
    p = gpu_memory.plan(fsdp8, rows, gpu_memory.Args())
    assert p["terms_gib"]["fsdp_buffers"] == 0
    assert math.isclose(p["terms_gib"]["activations"], 70.0 - 20 * P3B / GIB)


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
        [sys.executable, str(ROOT / "benchmarks" / "precision.py"), "--help"],
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
