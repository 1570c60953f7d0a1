"""Generation engines: token-id prompts in, completions with per-token log-probs out.

rollout.py talks to the `Engine` protocol; `VLLMEngine` (offline `vllm.LLM`, prefix caching,
in-process weight update) and `HFEngine` (batched `model.generate`, the CPU / no-vLLM fallback)
implement it, and `make_engine` picks one and says which and why. Completions are the exact sampled
ids: a context is extended, never re-tokenized. Which log-prob a sampled token gets is the caller's
rule (`Sampling.logprob`: rollout.py's pi_rollout); vLLM's engine computes the same one itself.
"""

import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import (
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
)

from infra import shard

# --------------------------------------------------------------------------------------------------
# the protocol


@dataclass
class Sampling:
    """How to sample one batch of completions."""

    max_tokens: int  # most generated tokens per completion (the agent's: --max_step_tokens)
    temperature: float = 1.0  # softmax temperature; 0 = greedy
    # nucleus mass in (0, 1]; 1 keeps the whole distribution; ignored when greedy
    top_p: float = 1.0
    # Stop strings, matched on the decoded completion alone (prompt excluded), across tokens, as
    # vLLM does; the token that completes one is kept.
    stop: list[str] = field(default_factory=list)
    # seed for this call (None: the engine's running RNG); vLLM seeds row i apart (`row_seeds`)
    seed: int | None = None
    # The caller's rule for a sampled token's log-prob: (B, V) raw float32 logits, (B,) ids -> (B,)
    # (rollout.rollout_logprob); HF calls it as it samples (None: no log-probs). vLLM runs no Python
    # per token: its log-probs are its raw ones (logprobs_mode), which is rollout_logprob's rule.
    logprob: Callable | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(
                f"Sampling.temperature must be >= 0 (0 = greedy), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"Sampling.max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str) or any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError(
                f"Sampling.stop must be a list of non-empty strings, got {self.stop!r}"
            )


@dataclass
class Completion:
    """One generated continuation of one prompt."""

    # the sampled ids, up to and including the one that completed a stop string or the EOS
    token_ids: list[int]
    logprobs: list[float]  # each token's Sampling.logprob (HF; empty without one), vLLM's raw one
    # "stop" (a stop string completed), "eos" (an EOS was sampled) or "length" (max_tokens)
    finish_reason: str


NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


def _pairs(weights: NamedTensors) -> Iterable[tuple[str, torch.Tensor]]:
    return weights.items() if isinstance(weights, Mapping) else weights


class Engine(Protocol):
    """What rollout.py needs from a generation engine."""

    # one per prompt
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]: ...
    # sample from an unwrapped HF LM's current weights: a full state dict, or its (name, tensor)
    # pairs one at a time (infra/shard.py's Weights)
    def load_weights(self, weights: NamedTensors) -> None: ...

    def sleep(self) -> None:
        """Give the engine's memory back until its next call (vLLM's sleep mode), or nothing."""

    # release what it holds (vLLM: engine core, distributed state); no generate after
    def close(self) -> None: ...


def _check_prompts(prompts: list[list[int]]) -> None:
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token id")


# --------------------------------------------------------------------------------------------------
# Hugging Face engine


class _StopOnText(StoppingCriteria):
    """Stops a row once its decoded completion (prompt excluded) contains a stop string; remembers
    where. transformers' own `stop_strings` also match across the prompt/completion boundary, unlike
    vLLM's: hence this criterion, the same in both engines."""

    def __init__(self, tokenizer, stop: list[str], prompt_len: int):
        self.tokenizer, self.stop, self.prompt_len = tokenizer, stop, prompt_len
        # Decode only the last `window` tokens: a stop string of c characters spans at most c tokens
        # when every token decodes to >= 1 character; the slack covers tokens that decode to nothing
        # (special tokens).
        self.window = max(len(s) for s in stop) + 8
        # row -> number of generated tokens when its first stop string completed
        self.ends: dict[int, int] = {}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        # (B, <= window)
        tails = input_ids[:, max(self.prompt_len, input_ids.shape[1] - self.window) :]
        texts = self.tokenizer.batch_decode(tails.tolist(), skip_special_tokens=True)
        for row, text in enumerate(texts):
            if row not in self.ends and any(s in text for s in self.stop):
                self.ends[row] = input_ids.shape[1] - self.prompt_len
        # (B,)
        return torch.tensor(
            [row in self.ends for row in range(len(texts))], device=input_ids.device
        )


class _SampledLogprobs(StoppingCriteria):
    """Each sampled token's log-prob, kept as generate goes. The mechanics are the engine's: a
    forward hook on the model keeps the last position's raw logits of one step, in float32 (the
    copy generate makes before its logits processors: `output_logits` returned the same tensors,
    every step's kept to the end: 32 x 500 x 151,936 x 4 B = 9.06 GiB at 3 B); generate calls this
    criterion once the token it sampled from them is appended. Which log-prob that token gets is
    the caller's rule, `score` (Sampling.logprob: rollout.py's pi_rollout, which TIS reads), so that
    the paper's rule stands on the step's path and this capture stays reusable. It never stops a
    row. Use it as a context manager (the hook is removed on leaving)."""

    def __init__(self, model: torch.nn.Module, score: Callable):
        self.model, self.score, self.steps, self.last = model, score, [], None  # steps: N x (B,)

    def __enter__(self):
        self.handle = self.model.register_forward_hook(self.keep)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def keep(self, module, args, output) -> None:
        # transformers 5's _sample: outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
        self.last = output.logits[:, -1].to(copy=True, dtype=torch.float32)  # (B, V)

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if self.last is None:
            raise RuntimeError(
                "generate sampled a token without a forward pass that the log-prob hook saw "
                "(a compiled or hook-less forward?); infra/engines.py cannot take its log-prob"
            )
        logits, self.last = self.last.to(input_ids.device), None  # (B, V)
        # (B,): finished rows' pad ids, as `sequences` holds them
        self.steps.append(self.score(logits, input_ids[:, -1]))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)  # (B,)


class HFEngine:
    """Batched `model.generate` on the trainer's own model: left padding, stop strings, log-probs,
    chunking.

    Memory: a chunk of max_batch_size rows decodes at once (its KV cache); of the logits it keeps
    one step's, and each token's log-prob."""

    # It samples from the trainer's own model object: in a float32 run the log-probs it returns are
    # the trainer's log pi_old (tests/test_train.py checks they agree), so the trainer need not
    # recompute them. Under mixed precision its incremental forward rounds unlike the trainer's full
    # one, and train.py recomputes them.
    exact_logprobs = True

    def __init__(self, model: torch.nn.Module, tokenizer, max_batch_size: int = 32):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model, self.tokenizer, self.max_batch_size = model, tokenizer, max_batch_size
        model_eos = model.generation_config.eos_token_id  # None, one id or a list of ids
        eos = {
            tokenizer.eos_token_id,
            *(model_eos if isinstance(model_eos, (list, tuple)) else [model_eos]),
        }
        # EOS ids: the tokenizer's and generation_config's; an EOS that ends a completion is kept
        # (finish_reason "eos").
        self.eos_ids = sorted(i for i in eos if i is not None)
        if not self.eos_ids:
            raise ValueError(
                "neither the tokenizer nor model.generation_config defines an EOS token id; set one"
            )
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        )

    def load_weights(self, weights: NamedTensors) -> None:
        """Copy the policy's full weights (a state dict, or its (name, tensor) pairs one at a time:
        infra/shard.py's Weights) into the model it samples from, each tensor as it comes (cast to
        that model's dtype); nothing to copy where that model is the trainer's own, whose tensors
        they are. Every name of the model's state dict, and no other, must come."""
        own, seen = self.model.state_dict(), set()
        with torch.no_grad():
            for name, tensor in _pairs(weights):
                if name not in own:
                    raise ValueError(
                        f"load_weights got {name!r}, which the HF engine's model does not have; "
                        "pass the unwrapped HF model's full state dict (infra/shard.py's Weights)"
                    )
                if own[name].data_ptr() != tensor.data_ptr():
                    own[name].copy_(tensor)
                seen.add(name)
        if len(seen) < len(own):
            missing = sorted(own.keys() - seen)
            raise ValueError(
                f"load_weights got no {missing[0]!r} ({len(missing)} of {len(own)} tensors "
                "missing); pass the unwrapped HF model's full state dict"
            )

    def sleep(self) -> None:
        """Nothing to release: the model belongs to the trainer."""

    def close(self) -> None:
        """Nothing to release: the model belongs to the trainer."""

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        _check_prompts(prompts)
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; restored below
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        try:
            # A seed makes one call reproducible on this engine: seeded once per call, so the
            # samples depend on max_batch_size (the chunks), and differ from vLLM's.
            with torch.random.fork_rng(devices=devices, enabled=sampling.seed is not None):
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed)
                return [
                    c
                    for start in range(0, len(prompts), self.max_batch_size)
                    for c in self._generate_chunk(
                        prompts[start : start + self.max_batch_size], sampling
                    )
                ]
        finally:
            self.model.train(was_training)

    def _generate_chunk(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        B, P = len(prompts), max(len(p) for p in prompts)
        # (B, P), left padded
        input_ids = torch.tensor([[self.pad_id] * (P - len(p)) + list(p) for p in prompts])
        # (B, P)
        attention_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
        stop = _StopOnText(self.tokenizer, sampling.stop, P) if sampling.stop else None
        greedy = sampling.temperature == 0
        config = GenerationConfig(  # top_k 0 = off (default 50)
            max_new_tokens=sampling.max_tokens,
            do_sample=not greedy,
            top_k=None if greedy else 0,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
        )
        # generate() fills every unset field from model.generation_config (the checkpoint's
        # sampling defaults); swap in an empty one for the call so that only `config` applies, as
        # vLLM ignores them given SamplingParams.
        saved, self.model.generation_config = self.model.generation_config, GenerationConfig()
        kept = _SampledLogprobs(self.model, sampling.logprob) if sampling.logprob else None
        try:
            with kept or nullcontext():
                sequences = self.model.generate(
                    input_ids=input_ids.to(self.model.device),
                    generation_config=config,
                    attention_mask=attention_mask.to(self.model.device),
                    stopping_criteria=StoppingCriteriaList([c for c in (kept, stop) if c]),
                )  # (B, P + N)
        finally:
            self.model.generation_config = saved
        new_ids = sequences[:, P:]  # (B, N)
        # (B, N); a step generate took back (a deferred stop check) is not in `sequences`
        logprobs = torch.stack(kept.steps[: new_ids.shape[1]], dim=1) if kept else None
        completions = []
        for row in range(B):
            ids = new_ids[row].tolist()
            end, reason = (
                (stop.ends[row], "stop")
                if stop is not None and row in stop.ends
                else (len(ids), "length")
            )
            # an EOS ends a row at once
            eos_at = next((t for t, i in enumerate(ids) if i in self.eos_ids), None)
            if eos_at is not None and eos_at + 1 <= end:
                end, reason = eos_at + 1, "eos"
            if reason == "length" and end < sampling.max_tokens:
                raise RuntimeError(
                    f"row {row} stopped after {end} < max_tokens={sampling.max_tokens} tokens "
                    "without a stop string or EOS; a stopping rule outside Sampling is active"
                )
            scores = logprobs[row, :end].tolist() if kept else []
            completions.append(Completion(ids[:end], scores, reason))
        return completions


# --------------------------------------------------------------------------------------------------
# vLLM engine


ROW_SEEDS = 2**20  # vLLM: the most rows one call seeds apart from every other call's (`row_seeds`)


def row_seeds(seed: int, n: int) -> list[int]:
    """vLLM's per-row seeds of a call seeded `seed`: seed x ROW_SEEDS + i for row i, so that two
    calls of different seeds share none (seed + i would: the row i + 1 of seed s is the row i of
    s + 1, and two agents seeded s and s + 1 sampling one prompt drew the same completion)."""
    if n > ROW_SEEDS:
        raise ValueError(f"{n} rows in one vLLM call: at most {ROW_SEEDS} are seeded apart")
    return [seed * ROW_SEEDS + i for i in range(n)]


class VLLMEngine:
    """Offline `vllm.LLM` fed token ids, with prefix caching and an in-process weight update."""

    # its own kernels (and maybe dtype): the trainer recomputes log pi_old (TIS, train.py)
    exact_logprobs = False

    def __init__(
        self,
        model_path: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        sleep: bool = False,
        **llm_kwargs,
    ):
        """`model_path`: an HF model directory or hub name; `gpu_memory_utilization`: vLLM's share
        of GPU memory (leave the trainer room; on CPU, VLLM_CPU_KVCACHE_SPACE in GiB sizes the KV
        cache); `sleep`: vLLM's sleep mode (CUDA only), for `sleep()`; the rest go to
        `vllm.LLM`."""
        # One process: the engine core lives in this process, so load_weights is an in-memory copy
        # (with tensor parallel, the weights go through vLLM's RPC, no NCCL broadcast).
        # Read by vLLM when the engine starts, so it must be set before `LLM(...)`; an explicit
        # value is kept.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not torch.cuda.is_available():
            # vLLM 0.32's CPU start scans every loaded module and crashes on numba's llvmlite:
            # refuse to start, naming it (infra/search.py keeps bm25s off numba: its numba
            # workaround).
            if "llvmlite" in sys.modules:
                loaders = sorted(m for m in ("numba", "bm25s", "llvmlite") if m in sys.modules)
                raise RuntimeError(
                    f"llvmlite is loaded in this process (loaded: {', '.join(loaders)}), and vLLM "
                    "0.32's CPU start crashes on it; import numba only after the vLLM engine "
                    "starts, and build BM25 through infra/search.py (it keeps bm25s off numba)"
                )
            # Chunked prefill off: vLLM 0.32 cannot rewind a seeded request's CPU generator after a
            # partial prefill. Every prompt is prefilled in one step, so it must fit
            # max_num_batched_tokens (default 4,096; raise it with a longer max_model_len).
            llm_kwargs.setdefault("enable_chunked_prefill", False)
        from vllm import LLM

        # prefix caching: tree branches share their prefixes; logprobs_mode: rollout.py's
        # raw-logprobs, the raw logits' log-probs whatever the temperature
        self.llm = LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            seed=seed,
            enable_prefix_caching=True,
            logprobs_mode="raw_logprobs",
            enable_sleep_mode=sleep,
            **llm_kwargs,
        )
        # asleep: what sleeps ("weights", "kv_cache"); reset_due: the prefix cache to drop at wake
        self.sleep_mode, self.asleep, self.reset_due = sleep, set(), False
        # load_weights casts each tensor to it ("auto": leaves them for vLLM to cast)
        self.dtype = getattr(torch, dtype) if dtype != "auto" else None
        self.tensor_parallel_size = tensor_parallel_size
        self.prefill_tokens = 0  # prompt tokens given to generate (HF's engine has no prefix cache)
        # of those, served from the prefix cache instead of recomputed
        self.cached_prefill_tokens = 0

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        _check_prompts(prompts)
        self._wake()
        greedy = sampling.temperature == 0
        # top_k 0: off; logprobs 0: the sampled token's only; include_stop_str: affects .text only
        common = dict(
            temperature=sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0,
            logprobs=0,
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
        )
        # a seed per row, so that a node's identical branch prompts differ; one call is then
        # reproducible on this engine, its samples differ from HF's.
        sampling_params = (
            SamplingParams(**common, seed=None)
            if sampling.seed is None
            else [SamplingParams(**common, seed=s) for s in row_seeds(sampling.seed, len(prompts))]
        )
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            sampling_params,
            use_tqdm=False,
        )
        completions = []
        for i, out in enumerate(outputs):
            self.prefill_tokens += len(out.prompt_token_ids)
            self.cached_prefill_tokens += out.num_cached_tokens or 0
            c = out.outputs[0]
            if c.finish_reason not in ("stop", "length"):
                raise RuntimeError(
                    f"vLLM request {i} finished with {c.finish_reason!r}; expected stop or length"
                )
            ids = list(c.token_ids)
            logprobs = [position[token].logprob for position, token in zip(c.logprobs, ids)]
            # vLLM: finish "stop" with a str stop_reason = stop string; None or an int = an EOS /
            # stop token id.
            reason = (
                "length"
                if c.finish_reason == "length"
                else "stop"
                if isinstance(c.stop_reason, str)
                else "eos"
            )
            completions.append(Completion(ids, logprobs, reason))
        return completions

    def load_weights(self, weights: NamedTensors) -> None:
        """Copy an HF causal LM's full weights (a state dict, or its (name, tensor) pairs one at a
        time: infra/shard.py's Weights) into the running engine (the workers' `reload_weights`),
        each cast to the engine's dtype as it passes, then drop the stale prefix cache. One
        process (tensor parallel 1): the workers take the pairs as they come, so that a stream
        holds one whole tensor at a time, in the policy's dtype and in the engine's; with tensor
        parallel the pairs cross vLLM's RPC as one list, a full copy in the engine's dtype."""
        self._wake(["weights"])  # the KV cache sleeps on until the next generate (see `sleep`)
        pairs = (
            (self._unwrapped(name), tensor.detach().to(self.dtype))  # no copy in its own dtype
            for name, tensor in _pairs(weights)
        )
        if self.tensor_parallel_size > 1:
            pairs = list(pairs)
        try:  # vLLM renames and fuses q/k/v and gate/up itself
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs})
        except (TypeError, NotImplementedError) as e:
            import vllm

            raise RuntimeError(
                f"vLLM {vllm.__version__}: workers' reload_weights(weights_iterator=...) failed "
                f"({e}); infra/engines.py needs a vLLM with in-place layerwise reloading (0.32 is "
                "tested)"
            ) from e
        del pairs  # our references: the caller drops its own before the KV cache wakes
        self.reset_due = True  # its KV was computed with the old weights
        if "kv_cache" not in self.asleep:
            self._reset_prefix_cache()

    @staticmethod
    def _unwrapped(name: str) -> str:
        if name.startswith(("module.", "_orig_mod.")):
            raise ValueError(
                f"load_weights got a wrapped model's weights (parameter {name!r}); pass the "
                "unwrapped HF model's full (not sharded) weights: infra/shard.py's Weights"
            )
        return name

    def _reset_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError(
                "vLLM refused to reset its prefix cache after a weight update (requests running?); "
                "cached KV would be stale, so call load_weights only between generate calls"
            )
        self.reset_due = False

    def sleep(self) -> None:
        """With sleep mode on (--vllm_sleep): offload the weights to CPU memory and drop the KV
        cache, so that the update has the GPU memory vLLM held (level 1). Without: nothing. They
        wake in verl's order: `load_weights` wakes the weights alone and loads the new ones (a
        stream leaves nothing behind; a caller's state dict is dropped); the next `generate`
        wakes the KV cache. Each wake first empties torch's caching allocator, which still holds
        what the update used (vLLM's wake does not empty it)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}

    def _wake(self, tags=("weights", "kv_cache")) -> None:
        """Wake what of `tags` sleeps, into an emptied cache; a prefix cache made stale by a weight
        update while the KV cache slept is dropped then."""
        waking = [tag for tag in tags if tag in self.asleep]
        if waking:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=waking)
            self.asleep -= set(waking)
        if self.reset_due and "kv_cache" not in self.asleep:
            self._reset_prefix_cache()

    def close(self) -> None:
        """Shut the in-process engine core down, with the torch.distributed groups it made: call it
        while the torch.distributed vLLM set up still exists (before Accelerate's end_training).
        Idempotent."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None


# --------------------------------------------------------------------------------------------------
# choosing an engine

RULES = [
    (
        "engine",
        "auto or hf: vllm is not installed (GPU: pip install -r requirements-gpu.txt; CPU: "
        "docs/vllm_cpu.md)",  # flags.check
        lambda v: v != "vllm" or importlib.util.find_spec("vllm") is not None,
    )
]


def make_engine(
    kind: str,
    model: torch.nn.Module,
    tokenizer,
    model_path: str,
    hf_max_batch_size: int = 32,
    dtype: str = "",
    **vllm_kwargs,
) -> Engine:
    """`kind`: "auto" (vLLM when it imports and CUDA is present, else HF), "hf" or "vllm"
    (`choose`); prints the choice once. `model` / `tokenizer`: the policy the HF engine samples
    from. A vLLM engine loads `model_path`, then syncs to `model` at once (unless it is sharded:
    then it starts from `model_path`'s weights, which are the policy's before its first update).
    `dtype`: the vLLM engine's ("float32", ...; empty = `model`'s, so that rounding does not spread
    pi_old / pi_rollout); `vllm_kwargs` go to `VLLMEngine`."""
    kind, reason = choose(kind)
    if vllm_kwargs.get("sleep") and (kind == "hf" or not torch.cuda.is_available()):
        raise ValueError(
            f"--vllm_sleep (vLLM's sleep mode, which frees its GPU memory during the update) needs "
            f"the vLLM engine on a CUDA GPU; here the engine is {kind} and CUDA is "
            f"{'' if torch.cuda.is_available() else 'not '}available: drop --vllm_sleep"
        )
    if kind == "hf":
        print(f"engine: hf ({reason})", flush=True)
        return HFEngine(model, tokenizer, hf_max_batch_size)
    policy_dtype = str(model.dtype).removeprefix("torch.")
    dtype = dtype or policy_dtype
    whose = (
        "the policy's"
        if dtype == policy_dtype
        else f"the policy is {policy_dtype}: TIS corrects the rounding"
    )
    print(f"engine: vllm ({reason}), {dtype} ({whose})", flush=True)
    engine = VLLMEngine(model_path, dtype=dtype, **vllm_kwargs)
    if not shard.sharded(model):
        engine.load_weights(model.state_dict())
    return engine


def choose(kind: str) -> tuple[str, str]:
    """The engine `kind` ("auto", "hf" or "vllm") resolves to, "hf" or "vllm", and why."""
    if kind not in ("auto", "hf", "vllm"):
        raise ValueError(f"engine kind must be 'auto', 'hf' or 'vllm', got {kind!r}")
    try:
        import vllm

        vllm_status = f"vllm {vllm.__version__} importable"
    except ImportError as e:
        vllm, vllm_status = None, f"vllm not importable ({e})"
    if kind == "vllm" and vllm is None:
        raise ImportError(
            f"engine 'vllm' requested but {vllm_status}; pip install vllm, or use engine 'hf'"
        )
    if kind != "auto":
        return kind, "requested" + (f"; {vllm_status}" if kind == "vllm" else "")
    # vLLM where it can run fast; say why not otherwise
    kind = "vllm" if vllm is not None and torch.cuda.is_available() else "hf"
    return kind, vllm_status + (
        ""
        if vllm is None
        else " and CUDA available"
        if kind == "vllm"
        else " but no CUDA device; pass engine 'vllm' to run vLLM on CPU"
    )
