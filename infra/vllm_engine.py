"""The vLLM engine (infra/engines.py's `Engine` protocol): offline `vllm.LLM` fed token ids, prefix
caching, an in-process weight update, vLLM's sleep mode; `engines.make_engine` starts it. vLLM is
imported only here, and only when an engine starts: the HF path never needs it.
"""

import os
import sys

import torch

from infra.engines import Completion, NamedTensors, Sampling, _check_prompts, _pairs

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

    def score(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[list[float]]:
        """Each continuation token's log-prob after its prompt and the tokens before it: vLLM's
        prompt log-probs of prompt + continuation, one token generated and dropped."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        _check_prompts(prompts)
        self._wake()
        rows = [list(p) + list(c) for p, c in zip(prompts, continuations)]
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False
        )
        return [
            [o.prompt_logprobs[t][r[t]].logprob for t in range(len(p), len(r))]
            for o, r, p in zip(outs, rows, prompts)
        ]

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
                f"({e}); infra/vllm_engine.py needs a vLLM with in-place layerwise reloading "
                "(0.32 is tested)"
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
