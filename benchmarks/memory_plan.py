"""The per-GPU memory plan of docs/gpu.md's recipes, which benchmarks/gpu_memory.py prints: one line
per term, each marked measured (the remainder of an update step measured on a GPU: that run's,
--figures', else the committed H100 table benchmarks/shapes/h100_measured.json) or derived
(arithmetic from the shape's config and what the code holds), with the moments it is live at:

    B  the update's backward (activations, FSDP2's buffers, the gradients)
    S  the update's optimizer step (AdamW's foreach temporaries; the activations are freed)
    W  the weight sync (under FSDP2 the whole tensors streamed to the engine, two at a time)
    P  the rollout's prefill, and D its last generated token (the HF engine's KV cache and logits)

The update's peak is the larger of B and S, the rollout phase's of P and D; a recipe fits when every
moment, plus --reserve_gib, fits --gpu_gib. Gradients and foreach temporaries are gone between steps
(zero_grad sets them to None), so the rollout sees the weights, AdamW, the reference and the engine.
No moment has been measured over several GPUs, nor the rollout's on any.
"""

import functools
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

GIB = 2**30
SHAPES = Path(__file__).resolve().parent / "shapes"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ALL = "BSWPD"  # the moments, in the docstring's order


@functools.cache
def config(shape: str):
    """The shape's transformers config (benchmarks/shapes/SHAPE/config.json)."""
    return AutoConfig.from_pretrained(SHAPES / shape)


@functools.cache
def parameter_count(shape: str) -> int:
    """Parameters of a shape, from its config (a model on the meta device: no memory, no init)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config(shape), dtype=torch.float32)
    return sum(p.numel() for p in model.parameters())


@functools.cache
def largest_tensor(shape: str) -> int:
    """Elements of a shape's largest parameter (the embedding, at every Qwen2.5 shape)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config(shape), dtype=torch.float32)
    return max(p.numel() for p in model.parameters())


@functools.cache
def layer_sizes(shape: str) -> tuple[int, int]:
    """(parameters of one decoder layer, parameters outside the layers) of a shape."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config(shape), dtype=torch.float32)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    return layer, sum(p.numel() for p in model.parameters()) - layer * len(model.model.layers)


def remainder_gib(row: dict) -> tuple[float, bool]:
    """(activations + logits + temporaries at the peak, whether a lower bound: the row ran out of
    memory): the peak less parameters, gradients, AdamW states and reference. A table row has no
    counted terms: they are its shape's, float32 (4 + 4 + 8 B a parameter) and the reference's."""
    if "counted_bytes" in row:
        counted = sum(row["counted_bytes"].values()) / GIB
    else:
        n = parameter_count(row["shape"])
        counted = n * (16 + DTYPES[row["ref_dtype"]].itemsize) / GIB
    if row["peak_gib"] is not None:
        return row["peak_gib"] - counted, False
    return row["oom_at_gib"] - counted, True


@dataclass(frozen=True)
class Recipe:
    """One way to run the job; the plan adds up its memory on each GPU."""

    name: str
    speed: str  # what it costs against the first recipe, and whether that was measured
    gpus: int = 1
    ranks: int = 1  # FSDP2 ranks the policy's float32 state is sharded over; 1 = whole per GPU
    fsdp: str = "none"  # "none" | "fsdp2" | "fsdp2+offload" (parameters, grads, Adam on the CPU)
    checkpointing: bool = True
    ref_dtype: str = "bfloat16"  # or "float32"; never sharded here
    micro_batch: int = 2
    length: int = 4096
    engine: str = "vllm"  # "vllm" (--vllm_utilization) | "vllm-small" | "hf"
    shape: str = "3B"


RECIPES = [
    Recipe(
        "8 x 80 GB DDP (the old recipe)",
        "the reference point",
        gpus=8,
        checkpointing=False,
    ),
    Recipe(
        "8 x 80 GB, FSDP2 over 8 ranks",
        "checkpointing: a second forward in the update (about +1/3 of its compute; not measured "
        "here); FSDP2: per-layer all-gather and reduce-scatter, overlapped with compute",
        gpus=8,
        ranks=8,
        fsdp="fsdp2",
    ),
    Recipe(
        "1 x 80 GB, checkpointing, micro-batch 2, HF engine (docs/gpu.md's command)",
        "HF generate has no paged KV cache or continuous batching: rollout several times slower "
        "than vLLM (not measured at 3B); 2.2 s an update step at 2 x 4,096 (measured)",
        engine="hf",
    ),
    Recipe(
        "1 x 80 GB, checkpointing, micro-batch 1, small vLLM",
        "vLLM with a small KV cache decodes fewer sequences at once: rollout in waves (not "
        "measured); micro-batch 1: 1.4 s a step at 1 x 4,096 (measured), twice the passes",
        micro_batch=1,
        engine="vllm-small",
    ),
    Recipe(
        "1 x 80 GB, FSDP2 CPU offload, checkpointing",
        "every layer's weights cross PCIe in each forward and backward, gradients come back, "
        "AdamW steps on the CPU (16 B a parameter of host memory): update several times slower "
        "(not measured)",
        fsdp="fsdp2+offload",
    ),
]


def activation(recipe: Recipe, rows: list[dict]) -> tuple[float, bool, str]:
    """(GiB, lower bound?, where from) of the recipe's activations at its tokens: the remainder
    (peak less the counted state) of figures of its shape and checkpointing under bf16 autocast
    measured without FSDP2 (the plan derives FSDP2's buffers apart), measured rows before the
    table's, the largest at each token count (micro-batch x length); at two or more counts a line
    through them, at one a proportion."""
    tokens = recipe.micro_batch * recipe.length
    usable = lambda r: r["peak_gib"] is not None or r["oom_at_gib"] is not None
    key = (recipe.shape, recipe.checkpointing, "bf16")
    same = lambda r, fsdp: (
        (r["shape"], r["checkpointing"], r["mixed_precision"]) == key and (r["fsdp"] == fsdp)
    )
    for origin in ("measured", "table"):
        match = [r for r in rows if r["source"] == origin and usable(r) and same(r, "none")]
        if not match:
            continue
        exact = [r for r in match if r["peak_gib"] is not None]
        by_tokens = {}  # tokens -> the largest remainder measured there
        for r in exact or match:
            t = r["micro_batch"] * r["length"]
            by_tokens[t] = max(by_tokens.get(t, -math.inf), remainder_gib(r)[0])
        where = f"{origin} figures at {'/'.join(f'{t:,}' for t in sorted(by_tokens))} tokens"
        note = "" if exact else ", out of memory: at least"
        if tokens in by_tokens:  # measured at the recipe's tokens
            value, how = by_tokens[tokens], f"the largest at {tokens:,}"
        elif len(by_tokens) == 1:
            ((t, gib),) = by_tokens.items()
            value, how = gib * tokens / t, f"x{tokens / t:g} in tokens"
        else:  # least squares: gib = c + s * tokens
            xs, ys = list(by_tokens), list(by_tokens.values())
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            s = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
            s /= sum((x - mx) ** 2 for x in xs)
            value, how = my + s * (tokens - mx), "a line through them"
        at = lambda r: r["micro_batch"] * r["length"] == tokens and r["peak_gib"] is not None
        fs = [remainder_gib(r)[0] for r in rows if at(r) and same(r, "fsdp2")]
        if recipe.fsdp != "none" and fs:  # to compare: one process, its gathered layers in it
            note += f"; one-process FSDP2 there: {max(fs):.2f}, its gathered layers in it"
        return value, not exact, f"peak less counted state ({where}; {how}){note}"
    return math.nan, False, "no figure"


def plan(recipe: Recipe, rows: list[dict], a) -> dict:
    """The recipe's memory per GPU: its terms (GiB, measured or derived, the moments each is live
    at), each moment's sum, and whether every moment fits a.gpu_gib less a.reserve_gib."""
    n, cfg = parameter_count(recipe.shape), config(recipe.shape)
    r, offload = recipe.ranks, recipe.fsdp == "fsdp2+offload"
    sharded, f32 = recipe.fsdp != "none", (0.0 if offload else 4 * n / r / GIB)  # 4 B, on the GPU
    per = f" / {r} ranks" if r > 1 else ""
    cpu = "; on the CPU under offload: 0 here" if offload else ""
    terms = []

    def add(key, term, gib, how, at, kind="derived"):
        terms.append({"key": key, "term": term, "gib": gib, "kind": kind, "how": how, "at": at})

    add("weights", f"float32 weights{per}", f32, f"4 B x {n:,}{cpu}", ALL)
    how = "reduce-scattered at every micro-batch (shard.accumulate): never whole" if sharded else ""
    how = how or "whole, accumulated over the mini-batch; freed by zero_grad"
    add("gradients", f"float32 gradients{per}", f32, how + cpu, "BS")
    if recipe.gpus > 1 and not sharded:
        how = "a second float32 copy of the gradients (gradient_as_bucket_view off, the default)"
        add("ddp_buckets", "DDP's gradient buckets", 4 * n / GIB, how, ALL)
    add("adamw", f"AdamW exp_avg + exp_avg_sq{per}", 2 * f32, "8 B a parameter" + cpu, ALL)
    how = "foreach AdamW's sqrt(exp_avg_sq) of every tensor at once, 4 B a parameter" + cpu
    add("adamw_temporaries", f"AdamW's foreach temporaries{per}", f32, how, "S")
    size = DTYPES[recipe.ref_dtype].itemsize
    how = f"{size} B x {n:,}, never sharded"
    add("reference", f"the reference ({recipe.ref_dtype})", n * size / GIB, how, ALL)
    act, lower, source = activation(recipe, rows)
    tokens = f"{recipe.micro_batch} x {recipe.length:,} = {recipe.micro_batch * recipe.length:,}"
    term = f"activations at {tokens} tokens, logits and their gradient"
    add("activations", term, act, source, "B", "measured" if act == act else "no figure")
    layer, root = layer_sizes(recipe.shape)
    buffers, how = 0.0, "no FSDP2"
    if sharded:  # bf16 gathered: the root (not resharded) and 2 layers; grads: bf16 + float32
        buffers = ((root + 2 * layer) * 2 + (root + layer) * (2 + 4)) / GIB
        how = "bf16: root + 2 layers gathered; root's and a layer's grads, bf16 + float32 to reduce"
    add("fsdp_buffers", "FSDP2's all-gather / reduce-scatter buffers", buffers, how, "B")
    if recipe.engine == "hf":
        terms += hf_terms(recipe, a, n, cfg, sharded)
    else:
        u = a.vllm_utilization if recipe.engine == "vllm" else a.small_vllm_utilization
        how = f"{u:g} x {a.gpu_gib:g} GiB: its bf16 weights, KV cache, activations; no --vllm_sleep"
        term = f"vLLM's share at --vllm_gpu_memory_utilization {u:g}"
        add("engine", term, u * a.gpu_gib, how, ALL)
    if sharded and not offload:  # shard.Weights: the whole tensor gathered and the engine's last
        big = largest_tensor(recipe.shape)
        how = f"2 x the largest, {big:,} x 4 B, and its isfinite mask (1 B an element)"
        add("state_dict", "whole tensors streamed to the engine (float32)", 9 * big / GIB, how, "W")
    else:
        how = "on the CPU" if offload else "whole weights: the policy's own tensors, no copy"
        add("state_dict", "whole tensors streamed to the engine", 0.0, how, "W")
    moments = {m: sum(t["gib"] for t in terms if m in t["at"]) for m in ALL}
    peak = max(moments.values())
    fits = "unknown (a lower bound)" if lower else "yes"
    fits = "no" if peak + a.reserve_gib > a.gpu_gib else fits
    return {
        "recipe": asdict(recipe),
        "parameters": n,
        "terms": terms,
        "terms_gib": {t["key"]: t["gib"] for t in terms},
        "moments_gib": moments,
        "update_peak_gib": max(moments["B"], moments["S"]),
        "rollout_peak_gib": max(moments["P"], moments["D"]),
        "sync_gib": moments["W"],
        "total_gib": peak,
        "lower_bound": lower,
        "fits": "?" if math.isnan(peak) else fits,
        "activation_source": source,
        "host_gib": 16 * n / GIB if offload else 0.0,
    }


def hf_terms(recipe: Recipe, a, n: int, cfg, sharded: bool) -> list[dict]:
    """The HF engine's terms: the weights it samples from, its KV cache and the logits of a step,
    at a.hf_sequences rows (infra/engines.py's chunk) of recipe.length tokens, a.hf_new_tokens of
    them generated. Under bf16 autocast the keys are float32 (RoPE in the float32 residual's dtype)
    and the values bf16: 6 B a K/V element. Of the logits it keeps one step's, and each sampled
    token's log-prob (it kept every step's float32 logits: 9.06 GiB at 32 x 500 at 3 B)."""
    b, new, length = a.hf_sequences, a.hf_new_tokens, recipe.length
    prompt, i, h = max(length - new, 0), cfg.intermediate_size, cfg.hidden_size
    head = h // cfg.num_attention_heads
    kv = cfg.num_hidden_layers * cfg.num_key_value_heads * head * (4 + 2)  # bytes a token
    kv_how = f"{kv:,} B a token: keys float32, values bf16"
    mlp = f"one MLP's 3 bf16 ({b}, {prompt:,}, {i:,}) tensors and 2 float32 hidden states"
    v = cfg.vocab_size
    logits = (
        f"6 ({b}, {v:,}) float32 tensors (the model's output, generate's copy, the warped scores, "
        f"the probabilities, the log-prob hook's copy, its log_softmax) + {b} x {new} log-probs"
    )
    copy = "shard.rollout_model: a whole float32 copy" if sharded else "the policy's own: no copy"
    rows = [  # (key, term, bytes, how, at)
        ("rollout_weights", "the weights the HF engine samples from", 4 * n * sharded, copy, ALL),
        ("kv_prefill", f"KV cache, {b} x {prompt:,} prompt tokens", b * prompt * kv, kv_how, "P"),
        ("prefill_transients", "the prefill's transient", b * prompt * (6 * i + 8 * h), mlp, "P"),
        ("kv_cache", f"KV cache, {b} x {length:,} tokens", b * length * kv, kv_how, "D"),
        ("logits", "a step's float32 logits", (6 * b * v + b * new) * 4, logits, "PD"),
    ]
    return [
        {"key": k, "term": t, "gib": x / GIB, "kind": "derived", "how": how, "at": at}
        for k, t, x, how, at in rows
    ]


def print_plan(plans: list[dict], a):
    print(
        f"\nPLAN, per GPU, GiB (a {a.gpu_gib:g} GiB GPU, {a.reserve_gib:g} kept free). Moments: B "
        "the update's backward, S its optimizer step, W the weight sync, P the rollout's prefill, "
        "D its last token; a term is 'measured' (a GPU figure's remainder) or 'derived' (from the "
        "shape and the code)"
    )
    print(
        "| recipe | update peak (B, S) | rollout peak (P, D) | weight sync (W) | fits |\n"
        "|---|---|---|---|---|"
    )
    for p in plans:
        ge = "≥" if p["lower_bound"] else ""
        print(
            f"| {p['recipe']['name']} | {ge}{p['update_peak_gib']:.1f} | "
            f"{p['rollout_peak_gib']:.1f} | {p['sync_gib']:.1f} | {p['fits']} |"
        )
    for i, p in enumerate(plans, 1):
        r, m = p["recipe"], p["moments_gib"]
        host = f"; host memory {p['host_gib']:.0f} GiB" if p["host_gib"] else ""
        ckpt = "on" if r["checkpointing"] else "off"
        print(
            f"\n{i}. {r['name']}: {r['shape']} ({p['parameters']:,} parameters), micro-batch "
            f"{r['micro_batch']} x {r['length']:,}, checkpointing {ckpt}, reference "
            f"{r['ref_dtype']}, engine {r['engine']}{host}. Speed: {r['speed']}.\n"
            "| term | GiB | figure | how | live at |\n|---|---|---|---|---|"
        )
        for t in p["terms"]:
            print(f"| {t['term']} | {t['gib']:.2f} | {t['kind']} | {t['how']} | {t['at']} |")
        ge = "≥ " if p["lower_bound"] else ""
        print(
            f"update peak {ge}{p['update_peak_gib']:.2f} (B {ge}{m['B']:.2f}, S {m['S']:.2f}); "
            f"ROLLOUT-PHASE peak {p['rollout_peak_gib']:.2f} (P {m['P']:.2f}, D {m['D']:.2f}); "
            f"weight sync {m['W']:.2f}; fits: {p['fits']}"
        )
