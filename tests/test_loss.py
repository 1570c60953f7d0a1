"""train.py's loss and log-probs: the PPO loss on hand-made tensors (clipping on both sides, dual
clip, k3, TIS cap, masks, aggregation, bounded log-ratios), the padded batch it reads, the chunked
log-probs against the full log-softmax, and the HF engine's log-probs as the trainer's pi_old."""

import math

import pytest
import torch

import advantages
import rollout
from advantages import CreditConfig
from infra.warmstart import WarmConfig
from retriever import RetrieverConfig
from rollout import AgentConfig, RolloutConfig
from train import Args, collate, ppo_loss
from tree import Sample

ARGS = Args(clip_low=0.2, clip_high=0.2, kl_coef=0.0, tis_cap=0.0)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def loss_of(logp, old, adv, args=ARGS, ref=None, rollout=None, mask=None):
    ref = logp if ref is None else ref
    rollout = old if rollout is None else rollout
    mask = torch.ones_like(logp) if mask is None else mask
    return ppo_loss(
        logp=logp,
        old_logp=old,
        ref_logp=ref,
        rollout_logp=rollout,
        adv=adv,
        mask=mask,
        args=args,
        denom=mask.sum().item(),
    )


def test_ppo_loss_clips_the_ratio_on_both_sides_and_stops_the_gradient_there():
    old = t([0.0, 0.0, 0.0, 0.0])
    # ratios 1.5, 1.5, 0.5, 0.5
    logp = t([math.log(1.5), math.log(1.5), math.log(0.5), math.log(0.5)])
    adv = t([1.0, -1.0, 1.0, -1.0])
    loss, s = loss_of(logp, old, adv)
    # per token max(-A r, -A clip(r, 0.8, 1.2)):
    #   A=+1, r=1.5: max(-1.5, -1.2) = -1.2 (clipped: no incentive past 1.2)
    #   A=-1, r=1.5: max(+1.5, +1.2) = +1.5 (pessimistic side: not clipped)
    #   A=+1, r=0.5: max(-0.5, -0.8) = -0.5 (not clipped)
    #   A=-1, r=0.5: max(+0.5, +0.8) = +0.8 (clipped)
    assert loss.item() == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8) / 4)
    # where the clipped branch wins (no gradient)
    assert s["clipped"].tolist() == [True, False, False, True]
    # gradient flows only through the unclipped tokens
    lp = logp.clone().requires_grad_()
    loss_of(lp, old, adv)[0].backward()
    # d/dlogp of -A r = -A r: token 2 -> +1.5/4 (A=-1, r=1.5), token 3 -> -0.5/4 (A=+1, r=0.5)
    assert lp.grad[0].tolist() == pytest.approx([0.0, 1.5 / 4, -0.5 / 4, 0.0])


def test_k3_kl_on_hand_computed_log_probs():
    # logp = log 0.5, ref = log 0.25: log(ref/p) = log 0.5; k3 = 0.5 - log 0.5 - 1 = 0.5 + 0.693147
    # - 1 = 0.193147
    args = Args(kl_coef=1.0, tis_cap=0.0)
    logp = t([math.log(0.5)])
    loss, s = loss_of(logp, logp, t([0.0]), args, ref=t([math.log(0.25)]))
    assert s["kl"].item() == pytest.approx(0.5 - math.log(0.5) - 1)
    assert loss.item() == pytest.approx(0.193147, abs=1e-6)
    # same policy: k3 = 0
    assert loss_of(logp, logp, t([0.0]), args, ref=logp)[1]["kl"].item() == 0.0


def test_tis_weight_is_capped_and_not_differentiated():
    # ratio 1 (logp = old), A = 1: surrogate -1; TIS weight = min(exp(old - rollout), C)
    args = Args(tis_cap=2.0, kl_coef=0.0)
    logp = t([0.0, 0.0])
    rollout = t([-math.log(3.0), -math.log(1.5)])  # pi_old / pi_rollout = 3 (capped to 2) and 1.5
    loss, s = loss_of(logp, logp, t([1.0, 1.0]), args, rollout=rollout)
    assert loss.item() == pytest.approx((-2.0 - 1.5) / 2)
    assert s["tis"].tolist() == pytest.approx([3.0, 1.5])
    no_tis = Args(tis_cap=0.0, kl_coef=0.0)
    assert loss_of(logp, logp, t([1.0, 1.0]), no_tis, rollout=rollout)[0].item() == pytest.approx(
        -1.0
    )


def test_masked_tokens_count_for_nothing_in_token_mean_and_seq_mean_token_mean():
    # two rows: [A=1 x 3 tokens] and [A=-1 x 1 token + 2 masked]; ratio 1 everywhere
    logp = torch.zeros(2, 3, dtype=torch.float64)
    adv = t([1.0, 1.0, 1.0], [-1.0, 5.0, 5.0])
    mask = t([1, 1, 1], [1, 0, 0])
    same = dict(logp=logp, old_logp=logp, ref_logp=logp, rollout_logp=logp, adv=adv, mask=mask)
    loss, s = ppo_loss(**same, args=ARGS, denom=4)
    # token-mean: masked tokens (A=5) contribute nothing
    assert loss.item() == pytest.approx((-3 + 1) / 4)
    seq = Args(loss_agg="seq-mean-token-mean", tis_cap=0.0, kl_coef=0.0)
    loss, _ = ppo_loss(**same, args=seq, denom=2)
    assert loss.item() == pytest.approx((-1 + 1) / 2)  # row means -1 and +1, averaged over 2 rows
    assert s["ratio"].numel() == 4


def test_dual_clip_caps_the_loss_of_a_negative_advantage():
    # A = -1, log ratio 1.5: ratio e^1.5 = 4.4817; max(-A r, -A clip(r, 0.8, 1.2))
    # = max(4.4817, 1.2) = 4.4817, gradient d(-A r)/dlogp = -A r = 4.4817. With --dual_clip 3
    # (verl's clip_ratio_c): min(4.4817, -A c = 3) = 3, a constant: gradient 0
    logp, old, adv = t([1.5]), t([0.0]), t([-1.0])
    dual = Args(kl_coef=0.0, tis_cap=0.0, dual_clip=3.0)
    for args, loss, grad in ((ARGS, math.exp(1.5), math.exp(1.5)), (dual, 3.0, 0.0)):
        lp = logp.clone().requires_grad_()
        value, s = loss_of(lp, old, adv, args)
        value.backward()
        assert value.item() == pytest.approx(loss) and lp.grad.item() == pytest.approx(grad)
    assert s["dual_clipped"].tolist() == [True]
    # A = +1 is never capped: ratio 1.5 -> clipped at 1.2 as without dual-clip, loss -1.2
    assert loss_of(logp, old, t([1.0]), dual)[0].item() == pytest.approx(-1.2)
    from train import validate

    with pytest.raises(SystemExit, match=r"--dual_clip 0.5: must be 0 \(off\) or > 1"):
        validate(
            Args(dual_clip=0.5),
            RolloutConfig(),
            CreditConfig(),
            AgentConfig(),
            RetrieverConfig(),
            WarmConfig(),
        )


def test_k3_is_not_clamped_and_every_log_ratio_is_bounded():
    # kl_coef 1, ref - logp = 3: k3 = e^3 - 3 - 1 = 20.0855 - 4 = 16.0855,
    # d k3/d logp = -(e^3 - 1) = -19.0855 (verl's low_var_kl clamps k3 to 10 here, gradient 0:
    # train.py's k3-unclamped says why we do not)
    lp = torch.zeros(1, requires_grad=True)
    loss, _ = loss_of(
        lp, torch.zeros(1), torch.zeros(1), Args(kl_coef=1.0, tis_cap=0.0), ref=torch.tensor([3.0])
    )
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(3) - 4)
    assert lp.grad.item() == pytest.approx(-(math.exp(3) - 1))
    # A = 1, log ratio 100 (float32): exp(100) = inf gave a finite loss but a NaN gradient (inf x 0
    # in the branch max() did not take). Bounded to 20: ratio e^20 = 4.85e8 -> the clipped branch,
    # loss -1.2, gradient 0
    lp = torch.tensor([100.0], requires_grad=True)
    loss, s = loss_of(
        lp,
        torch.zeros(1),
        torch.ones(1),
        Args(kl_coef=0.001, tis_cap=2.0),
        ref=torch.tensor([100.0]),
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and lp.grad.item() == 0.0
    assert s["ratio"].item() == pytest.approx(math.exp(20), rel=1e-6)


def test_masked_positions_contribute_exactly_zero_whatever_they_hold():
    # float32; token 0 masked (prompt or observation), token 1 trained with A = 1, ratio 1,
    # ref = logp: loss -A r = -1 over 1 token; gradient [0, -1]. Before: the masked token's
    # ref - logp = 100 gave exp(100) = inf, inf x 0 = NaN, and the whole micro-batch's loss and
    # gradient were NaN.
    inf, nan = float("inf"), float("nan")
    mask, args = torch.tensor([0.0, 1.0]), Args(kl_coef=0.001, tis_cap=2.0)
    for ref, old, rollout_logp, adv, logp in (
        ([100.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]),
        ([inf, 0.0], [-inf, 0.0], [nan, 0.0], [nan, 1.0], [nan, 0.0]),
    ):
        lp = torch.tensor(logp, requires_grad=True)
        ref, old, rollout_logp, adv = (torch.tensor(x) for x in (ref, old, rollout_logp, adv))
        logps = dict(logp=lp, old_logp=old, ref_logp=ref, rollout_logp=rollout_logp)
        loss, s = ppo_loss(**logps, adv=adv, mask=mask, args=args, denom=1.0)
        loss.backward()
        assert loss.item() == -1.0 and lp.grad.tolist() == [0.0, -1.0]
        assert s["kl"].tolist() == [0.0] and s["ratio"].tolist() == [1.0]  # trained tokens only


def test_token_logprobs_equal_the_full_log_softmax(env, monkeypatch):
    # chunk by chunk, with the backward recomputing each chunk, against the formula it replaced
    # (log_softmax over all positions at once, entropy from it): log-probs, entropy and the gradient
    # reaching the weights are bit for bit the same, so default runs do not move
    import train
    from infra.policy import load_policy

    model, _ = load_policy(str(env / "tiny"))
    V = model.config.vocab_size
    monkeypatch.setattr(train, "LOGP_CHUNK", 3 * V)  # 3 positions a chunk: many, a short last one
    torch.manual_seed(0)
    ids = torch.randint(0, V, (2, 11))  # (B, T)
    attn, weights = torch.ones_like(ids), torch.linspace(-1, 1, 22).view(2, 11)  # (B, T), (B, T)
    logp, entropy = train.token_logprobs(model, ids, attn, entropy=True)  # (B, T), (B, T)
    (logp * weights).sum().backward()
    new_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # (B, T-1, V)
    logp_all = logits.log_softmax(-1)  # (B, T-1, V)
    pad = torch.nn.functional.pad
    old = pad(logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1), (1, 0))  # (B, T)
    old_entropy = pad(-(logp_all.exp() * logp_all).sum(-1), (1, 0))  # (B, T)
    (old * weights).sum().backward()
    assert torch.equal(logp, old) and torch.equal(entropy, old_entropy)
    assert all(torch.equal(new, p.grad) for new, p in zip(new_grads, model.parameters()))
    assert logp[:, 0].tolist() == [0.0, 0.0] and not entropy.requires_grad
    assert train.token_logprobs(model, ids, attn)[1] is None  # no entropy unless asked


def test_collate_right_pads_with_zero_mask_advantage_and_log_probs():
    a = Sample([1, 2, 3], [0, 1, 1], [0.0, 0.5, 0.5], [0.0, -1.0, -2.0], "x")
    b = Sample([4], [0], [0.0], [0.0], "y")
    batch = collate([a, b], pad_id=9)
    assert batch["ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["attn"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["mask"].tolist() == [[0, 1, 1], [0, 0, 0]]
    assert batch["adv"].tolist() == [[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]]
    assert batch["rollout_logp"].tolist() == [[0.0, -1.0, -2.0], [0.0, 0.0, 0.0]]


def test_hf_engine_logprobs_are_the_trainers_pi_old(env):
    # why train.py may skip its pi_old pass with the HF engine: on the samples of a real multi-turn
    # rollout (prompt, sampled steps, observations; left-padded generation with a KV cache), the
    # engine's log-probs equal the trainer's right-padded full forward pass on every trained token
    import random

    from infra import loaders, protocol
    from infra.engines import HFEngine
    from infra.policy import load_policy
    from infra.search import BM25Retriever, load_corpus
    from train import token_logprobs
    from tree import to_samples

    world = env / "out" / "world"
    model, tok = load_policy(str(env / "tiny"))
    engine = HFEngine(model, tok)
    assert engine.exact_logprobs
    agent = rollout.Agent(
        engine,
        BM25Retriever(load_corpus(f"{world}/corpus.jsonl")),
        tok,
        protocol.AgentConfig(instruction="short", max_step_tokens=12, max_turns=2),
        seed=3,
    )
    rows = loaders.load_rows(str(world), "train")[:4]
    prompts = rollout.tree_grpo(agent, rows, random.Random(0), RolloutConfig())
    samples = to_samples(
        [t for trees in prompts for t in advantages.tree_grpo(trees, CreditConfig())]
    )
    b = collate(samples, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logprobs(model, b["ids"], b["attn"])  # (B, T)
    m = b["mask"].bool()
    assert m.sum() > 50
    # measured: 4.8e-7 over 280 tokens
    assert (logp[m] - b["rollout_logp"][m]).abs().max().item() < 1e-4


def checkpointing_gradients(device: str, dtype: torch.dtype) -> tuple[dict, dict]:
    """The policy's gradients after token_logprobs + ppo_loss + backward on two padded rows of a
    3-layer tiny Llama (train mode, autocast `dtype` on `device`), without and with activation
    checkpointing (`--gradient_checkpointing`: what train.py enables)."""
    from infra import warmstart
    from train import token_logprobs

    tok = warmstart.world_tokenizer()
    torch.manual_seed(0)
    model = warmstart.tiny_llama(tok, hidden=32, layers=3, heads=2).to(device)
    ids = torch.randint(4, len(tok), (2, 12), device=device)  # (B, T)
    attn = torch.ones_like(ids)
    attn[1, 9:] = 0  # (B, T): the second row is padded
    mask = attn.float()
    mask[:, :4] = 0  # (B, T): the first 4 tokens are the prompt
    adv = torch.randn(2, 12, device=device)  # (B, T)
    grads, calls = [], []
    # inside the checkpointed layer (whose own hooks transformers keeps outside the checkpoint); a
    # pre-hook, as the recomputation stops once it has what the backward needs
    model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    for checkpointing in (False, True):
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": False})
        model.train().zero_grad()
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            logp, _ = token_logprobs(model, ids, attn)
            old = logp.detach() - 0.1  # (B, T): ratio e^0.1, inside the clip
            olds = dict(old_logp=old, ref_logp=old, rollout_logp=old, adv=adv, mask=mask)
            loss, _ = ppo_loss(logp=logp, **olds, args=Args(), denom=mask.sum().item())
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    # the layer's MLP ran once without checkpointing, then twice with it: forward, then in backward
    assert len(calls) == 1 + 2, len(calls)
    return grads[0], grads[1]


def test_gradient_checkpointing_gives_the_same_gradients():
    # --gradient_checkpointing keeps no activations in the forward and recomputes each layer's in
    # the backward: the same operations on the same inputs, so the same gradients to the bit on CPU
    # (GPU kernels may pick other algorithms for the recomputation: tests/test_gpu.py allows float
    # rounding there)
    off, on = checkpointing_gradients("cpu", torch.float32)
    assert off.keys() == on.keys() and any(g.abs().max() > 0 for g in off.values())
    for name in off:
        torch.testing.assert_close(on[name], off[name], rtol=0, atol=0)
