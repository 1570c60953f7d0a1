"""--pack_trees (infra/pack.py): the prefix trie of a micro-batch's rows on a hand-built batch, and
the packed loss and every parameter's gradient against the path form's on real trees grown by
each method's own rollout (its untrained children, truncated and discarded leaves as they come),
then a whole update (KL, TIS, both aggregations, an empty micro-batch) with and without packing."""

import copy
import random

import pytest
import torch

import rollout
from advantages import CreditConfig
from infra import loaders, pack, protocol, warmstart
from infra.engines import HFEngine
from infra.policy import load_policy
from infra.search import BM25Retriever, load_corpus
from rollout import RolloutConfig
from train import Args, collate, ppo_loss, token_logprobs
from tree import Sample, to_samples

RTOL = 1e-5  # float32: packed against path form, relative to the largest magnitude compared


def test_the_trie_of_three_rows_lays_each_shared_prefix_out_once():
    # rows 5 6 7 | 5 6 8 9 | 5 10 (right-padded with 0): the trie's nodes in insertion order,
    # a pre-order walk: 0:5 (depth 0) 1:6 (1, parent 0) 2:7 (2, parent 1) 3:8 (2, parent 1)
    # 4:9 (3, parent 3) 5:10 (1, parent 0); 3 + 4 + 2 = 9 row tokens in 6 nodes
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 8, 9], [5, 10, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    p = pack.pack(ids, attn)
    assert p.ids.tolist() == [5, 6, 7, 8, 9, 10]
    assert p.depth.tolist() == [0, 1, 2, 2, 3, 1]
    assert p.parent.tolist() == [-1, 0, 1, 1, 3, 0]
    assert p.path_tokens == 9 and len(p.ids) == 6
    # each row position's node; padding reads the row's last node
    assert p.where.tolist() == [[0, 1, 2, 2], [0, 1, 3, 4], [0, 5, 5, 5]]
    # node 4 (token 9) sees 5 6 8 9, not 7 (a sibling's branch) nor 10
    assert p.sees[4].tolist() == [True, True, False, True, True, False]
    assert p.sees[5].tolist() == [True, False, False, False, False, True]
    assert torch.equal(p.sees, p.sees.tril())  # ancestors come first: a causal subset


def test_an_attention_implementation_without_a_4d_mask_is_refused():
    tok = warmstart.world_tokenizer()
    model = warmstart.tiny_llama(tok, hidden=32, layers=1, heads=2)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(
        ValueError, match="--pack_trees: the model runs attention 'flash_attention_2'"
    ):
        pack.mask_for(model, torch.ones(2, 2, dtype=torch.bool), torch.float32)


def grown_samples(env, algo: str, seed: int = 3) -> list[Sample]:
    """The training rows of 3 prompts' trees grown by `algo`'s own rollout at its default knobs
    (on the tiny random policy: short, mostly abnormal steps) and credited by its own function."""
    world = env / "out" / "world"
    model, tok = load_policy(str(env / "tiny"))
    agent = rollout.Agent(
        HFEngine(model, tok),
        BM25Retriever(load_corpus(f"{world}/corpus.jsonl")),
        tok,
        protocol.AgentConfig(instruction="short", max_step_tokens=12, max_turns=2),
        seed=seed,
    )
    rows = loaders.load_rows(str(world), "train")[:3]
    method = rollout.ALGOS[algo]
    prompts = method.grow(agent, rows, random.Random(seed), RolloutConfig(algo=algo))
    return to_samples([t for trees in prompts for t in method.credit(trees, CreditConfig())])


def loss_and_gradients(model, b: dict, packed, args: Args, inputs: dict):
    model.zero_grad()
    logp, entropy = token_logprobs(model, b["ids"], b["attn"], entropy=True, packed=packed)
    loss, _ = ppo_loss(logp=logp, **inputs, args=args, denom=inputs["mask"].sum().item())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.item(), logp.detach(), entropy, grads


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str):
    scale = want.abs().max().item() or 1.0
    err = (got - want).abs().max().item() / scale
    assert err <= RTOL, f"{what}: relative error {err:.2e} > {RTOL}"


@pytest.mark.parametrize("algo", list(rollout.ALGOS))
def test_packed_loss_and_gradients_equal_the_path_forms_on_the_methods_own_trees(env, algo):
    samples = grown_samples(env, algo)
    assert len(samples) >= 4, len(samples)
    model, tok = load_policy(str(env / "tiny"))
    model.train()
    b = collate(samples, tok.pad_token_id)
    packed = pack.pack(b["ids"], b["attn"])
    assert len(packed.ids) < packed.path_tokens  # the rows share their prompt at least
    m = b["mask"].bool()
    g = torch.Generator().manual_seed(0)
    noise = lambda scale: scale * torch.randn(b["ids"].shape, generator=g)  # (B, T)
    with torch.no_grad():
        base, _ = token_logprobs(model, b["ids"], b["attn"])  # (B, T)
    # pi_old off pi_theta enough that some ratios clip; pi_ref for the KL; the rollout's log-probs
    # off pi_old enough that some TIS weights hit the cap
    old = base + noise(0.3)
    inputs = dict(
        old_logp=old, ref_logp=base + noise(0.5), rollout_logp=old + noise(1.0), adv=b["adv"]
    )
    inputs["mask"] = b["mask"]
    for agg in ("token-mean", "seq-mean-token-mean"):
        args = Args(kl_coef=0.1, tis_cap=2.0, dual_clip=3.0, loss_agg=agg)
        path = loss_and_gradients(model, b, None, args, inputs)
        packed_ = loss_and_gradients(model, b, packed, args, inputs)
        assert path[0] != 0.0
        assert_close(torch.tensor(packed_[0]), torch.tensor(path[0]), f"{algo} {agg}: loss")
        assert_close(packed_[1][m], path[1][m], f"{algo}: log-probs")
        assert_close(packed_[2][m], path[2][m], f"{algo}: entropy")
        for name, grad in path[3].items():
            assert_close(packed_[3][name], grad, f"{algo} {agg}: gradient of {name}")


def test_a_whole_update_with_packing_moves_the_weights_as_the_path_form(env):
    # train.micro_batches + add_old_and_ref_logprobs + update, twice from one start: the rows of
    # real Tree-GRPO trees plus one that trains nothing, micro-batches of 4 (some with rows of one
    # prompt, some across two), 2 mini-batches x 2 epochs, KL and TIS on, both aggregations; with
    # --pack_trees every micro-batch carries its trie and the weights end the same
    from accelerate import Accelerator
    from transformers import get_constant_schedule

    import train

    accelerator = Accelerator(cpu=True)
    start, tok = load_policy(str(env / "tiny"))
    samples = grown_samples(env, "tree_grpo")
    dead = samples[0]
    samples.append(
        Sample(
            dead.input_ids, [0] * len(dead.input_ids), *[[0.0] * len(dead.input_ids)] * 2, "none"
        )
    )
    counts = [len(samples)]
    for agg in ("token-mean", "seq-mean-token-mean"):
        ends = []
        for packing in (False, True):
            args = Args(
                micro_batch_size=4,
                ppo_mini_batches=2,
                ppo_epochs=2,
                loss_agg=agg,
                kl_coef=0.1,
                tis_cap=2.0,
                pack_trees=packing,
            )
            model = copy.deepcopy(start)
            ref = copy.deepcopy(start).requires_grad_(False)
            optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
            minis = train.micro_batches(samples, counts, accelerator, args, tok.pad_token_id)
            assert all(("packed" in b) == packing for mini in minis for b in mini)
            train.add_old_and_ref_logprobs(minis, accelerator, model, ref, False)
            done = train.update(
                minis, accelerator, model, optimizer, get_constant_schedule(optimizer), args
            )
            assert done.skipped == 0 and len(done.losses) == 4
            ends.append((done, {k: v.detach().clone() for k, v in model.state_dict().items()}))
        (path, path_w), (packed, packed_w) = ends
        assert_close(torch.tensor(packed.losses), torch.tensor(path.losses), f"{agg}: losses")
        assert_close(
            torch.tensor(packed.grad_norms), torch.tensor(path.grad_norms), f"{agg}: norms"
        )
        for name, w in path_w.items():
            moved = w - start.state_dict()[name]
            assert_close(packed_w[name] - start.state_dict()[name], moved, f"{agg}: {name} moved")


def test_the_tree_training_benchmark_prints_its_table_with_a_tiny_budget(env, tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "benchmarks/tree_train.py", "--algos", "grpo", "carl", "--no_bushier"]
        + ["--prompts", "2", "--repeats", "2", "--policy", str(env / "tiny")]
        + ["--out", str(tmp_path), f"--train_flags=--out_dir {env / 'out'} --max_turns 1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "results.md").read_text()
    assert text.startswith("Tree training: --pack_trees against the path form, 2 prompts a row")
    rows = [line for line in text.splitlines() if line.startswith(("| GRPO ", "| CARL "))]
    assert len(rows) == 2, text
    for row in rows:  # path tokens > packed tokens: the rows share their prompt at least
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[2]) > int(cells[3]) and cells[4].endswith("x"), row


def branching_rows(vocab: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Six right-padded rows of a random tree: a 10-token prompt, two first steps of 6, three
    second steps of 5 under each, ids in [4, vocab)."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(4, vocab, (n,), generator=g).tolist()
    prompt, rows = ids(10), []
    for _ in range(2):
        first = ids(6)
        rows += [prompt + first + ids(5 - k) for k in range(3)]  # lengths 21, 20, 19
    T = max(map(len, rows))
    padded = torch.tensor([r + [0] * (T - len(r)) for r in rows], device=device)  # (B, T)
    attn = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows], device=device)
    return padded, attn


def packed_against_path(model, device: str, dtype: torch.dtype) -> dict[str, float]:
    """Relative errors, packed against the path form, of the log-probs and every parameter's
    gradient of a PPO loss on `branching_rows` (autocast `dtype` on `device`)."""
    ids, attn = branching_rows(model.config.vocab_size, device)
    mask = attn.float()
    mask[:, :10] = 0  # (B, T): the prompt is not trained
    adv = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1)).to(device)  # (B, T)
    packed = pack.pack(ids, attn)
    # 2 x (21 + 20 + 19) = 120 row tokens in 10 + 2 x (6 + 5 + 4 + 3) = 46 nodes
    assert (packed.path_tokens, len(packed.ids)) == (120, 46)
    got = []
    for p in (None, packed):
        model.zero_grad()
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            logp, _ = token_logprobs(model, ids, attn, packed=p)  # (B, T)
            old = logp.detach() - 0.1
            olds = dict(old_logp=old, ref_logp=old, rollout_logp=old, adv=adv, mask=mask)
            loss, _ = ppo_loss(logp=logp, **olds, args=Args(), denom=mask.sum().item())
        loss.backward()
        got.append(
            (logp.detach()[mask.bool()], {n: q.grad.clone() for n, q in model.named_parameters()})
        )
    (path_logp, path_g), (packed_logp, packed_g) = got
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()
    return {"log-probs": rel(packed_logp, path_logp)} | {
        n: rel(packed_g[n], g) for n, g in path_g.items()
    }


def tiny_qwen2():
    """A 2-layer Qwen2 (the GPU recipe's model class, Qwen2.5's) with SDPA attention."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config)


def test_packing_runs_on_the_gpu_recipes_model_class_qwen2():
    # Qwen2 (grouped-query attention, its own RoPE and mask code) reads the 4-D mask and the depth
    # position ids as the tiny Llama does: float32, within 1e-5
    errors = packed_against_path(tiny_qwen2().train(), "cpu", torch.float32)
    assert max(errors.values()) <= RTOL, errors


def test_packing_under_eager_attention_adds_the_mask_to_the_scores():
    # eager attention adds the mask to the scores: 0 where a node sees, float32's lowest elsewhere
    tok = warmstart.world_tokenizer()
    torch.manual_seed(0)
    model = warmstart.tiny_llama(tok, hidden=32, layers=2, heads=2)
    model.config._attn_implementation = "eager"
    mask = pack.mask_for(model, torch.tensor([[True, False], [True, True]]), torch.float32)
    assert mask.shape == (1, 1, 2, 2) and mask[0, 0, 1].tolist() == [0.0, 0.0]
    assert mask[0, 0, 0, 1].item() == torch.finfo(torch.float32).min
    errors = packed_against_path(model.train(), "cpu", torch.float32)
    assert max(errors.values()) <= RTOL, errors
