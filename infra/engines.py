"""Generation engines: token-id prompts in, completions with per-token log-probs out.

rollout.py talks to the `Engine` protocol; `HFEngine` (batched `model.generate`, the CPU / no-vLLM
fallback) and infra/vllm_engine.py's `VLLMEngine` (offline `vllm.LLM`, prefix caching, in-process
weight update) implement it, and `make_engine` picks one and says which and why. Completions are
the exact sampled ids: a context is extended, never re-tokenized. Which log-prob a sampled token
gets is the caller's rule (`Sampling.logprob`: rollout.py's pi_rollout); vLLM's engine computes the
same one itself. `score` teacher-forces given continuations (IGPO's gold answer), by the same rule.
"""

import importlib.util
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
    # teacher forcing: each continuation token's log-prob after its prompt (IGPO's gold answer)
    def score(
        self, prompts: list[list[int]], continuations: list[list[int]]
    ) -> list[list[float]]: ...
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

    def score(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[list[float]]:
        """Each continuation token's log-prob after its prompt and the tokens before it: the raw
        logits' log_softmax (raw-logprobs), one forward per chunk of max_batch_size rows, left
        padded, the logits of the continuations' positions only."""
        _check_prompts(prompts)
        was_training, out = self.model.training, []
        self.model.eval()
        try:
            for at in range(0, len(prompts), self.max_batch_size):
                rows = [p + c for p, c in zip(prompts, continuations)][
                    at : at + self.max_batch_size
                ]
                ends = [len(c) for c in continuations[at : at + self.max_batch_size]]
                L, K = max(map(len, rows)), max(ends) + 1
                ids = torch.tensor([[self.pad_id] * (L - len(r)) + r for r in rows])  # (B, L)
                attn = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows])  # (B, L)
                with torch.no_grad():
                    logits = self.model(  # (B, K, V): the last K positions predict the last K - 1
                        input_ids=ids.to(self.model.device),
                        attention_mask=attn.to(self.model.device),
                        position_ids=(attn.cumsum(-1) - 1).clamp(min=0).to(self.model.device),
                        logits_to_keep=K,
                    ).logits.float()
                logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, L - K + 1 :, None])[..., 0]
                out += [logp[b, K - 1 - n :].tolist() for b, n in enumerate(ends)]
            return out
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
    from infra.vllm_engine import VLLMEngine

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
