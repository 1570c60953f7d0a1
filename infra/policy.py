"""Loading a policy: (model, tokenizer) from a hub name, a model directory or a GGUF file in it, and
what a directory lacks, judged from its file names before anything heavy loads."""

import fnmatch
import os
import re

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "*.tiktoken",
)  # what AutoTokenizer reads (or a GGUF)


def model_problem(name_or_dir: str, gguf_file: str = "") -> str:
    """Why `load_policy` could not load `name_or_dir` (with `gguf_file`), judged from file names
    alone, so that a script says it before anything heavy loads; empty when it may load. A name that
    is no local path but has a hub name's form (NAME or ORG/NAME, ORG no local directory) is left to
    transformers."""
    path = name_or_dir
    if not os.path.isdir(path):
        hub = re.fullmatch(r"[\w-][\w.-]*(/[\w.-]+)?", path)
        if hub and not os.path.isdir(path.split("/")[0]) and not os.path.exists(path):
            return ""
        if not os.path.isfile(path):
            return f"no model at {path}: no such directory"
        gguf = " (a GGUF file: pass its directory as --model, its name as --gguf_file)"
        return f"no model at {path}: a file, not a directory" + gguf * path.endswith(".gguf")
    files = os.listdir(path)
    if gguf_file:  # the GGUF file holds config, weights and tokenizer
        return "" if gguf_file in files else f"no model at {path}: no {gguf_file} in it"
    if "config.json" not in files:
        return (
            f"no model at {path}: it has no config.json (a model directory holds config.json, "
            f"weights and tokenizer files, as save_pretrained writes them); files there: "
            f"{', '.join(sorted(files)) or 'none'}"
        )
    has = lambda *globs: any(fnmatch.fnmatch(f, g) for f in files for g in globs)
    missing = []
    if not has(*TOKENIZER_FILES):
        missing.append(
            f"tokenizer files (none of {', '.join(TOKENIZER_FILES)}: save the model's "
            f"tokenizer there too)"
        )
    if not has("*.safetensors", "*.bin"):
        missing.append("weights (*.safetensors, *.bin)")
    return f"{path} has no {' and no '.join(missing)}" if missing else ""


def load_policy(name_or_dir: str, gguf_file: str | None = None, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a hub name, a local directory, or a GGUF file in it (transformers
    dequantizes it)."""
    # cuDNN's attention builds an execution plan for every new (batch, length) shape the first time
    # it sees it (~10 ms on an H100); torch 2.11 tries it first for bf16 with a padding mask on
    # Hopper, and an agent's batches keep changing shape: bf16 steps ran 8x slower than float32
    # (which never takes cuDNN). Flash / memory-efficient attention need no plan. Process-wide.
    torch.backends.cuda.enable_cudnn_sdp(False)
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(name_or_dir, **kw)
    model = AutoModelForCausalLM.from_pretrained(name_or_dir, dtype=dtype, **kw)
    if gguf_file:
        # transformers dequantizes GGUF into ordinary tensors but keeps the model marked
        # "quantized", which would block save_pretrained; what we train and save is plain weights
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
