"""Token log-probs from logits without a float32 copy of the vocabulary: the custom autograd
function behind train.py's `token_logprobs`, LOGP_CHUNK logits at a time forward and backward.
"""

import torch

LOGP_CHUNK = 2**24  # logits per chunk: 64 MiB of float32, 110 Qwen positions


class TokenLogp(torch.autograd.Function):
    """log_softmax(logits)[target] per row (and the entropy, asked), LOGP_CHUNK logits at a time:
    (N, V) logits of any float dtype in, (N,) float32 out. Backward recomputes each chunk's
    log-softmax, so only the logits themselves are kept, never a float32 copy of the vocabulary;
    values and gradients are bit for bit those of one log_softmax over all rows. The entropy has no
    gradient (it is only logged)."""

    @staticmethod
    def forward(ctx, logits, targets, with_entropy: bool):  # (N, V), (N,)
        rows = max(1, LOGP_CHUNK // logits.shape[1])
        logp = torch.empty(len(logits), device=logits.device)  # (N,)
        entropy = torch.empty(len(logits) if with_entropy else 0, device=logits.device)  # (N,)|(0,)
        for s in range(0, len(logits), rows):
            logp_all = logits[s : s + rows].float().log_softmax(-1)  # (c, V)
            logp[s : s + rows] = logp_all.gather(1, targets[s : s + rows, None])[:, 0]  # (c,)
            if with_entropy:
                entropy[s : s + rows] = -(logp_all.exp() * logp_all).sum(-1)  # (c,)
        ctx.save_for_backward(logits, targets)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad, _):  # (N,): d loss / d logp
        logits, targets = ctx.saved_tensors  # (N, V), (N,)
        rows = max(1, LOGP_CHUNK // logits.shape[1])
        out = torch.empty_like(logits)  # (N, V)
        for s in range(0, len(logits), rows):
            with torch.enable_grad():  # the chunk's forward again, differentiated on its own
                x = logits[s : s + rows].detach().requires_grad_()  # (c, V)
                logp = (
                    x.float().log_softmax(-1).gather(1, targets[s : s + rows, None])[:, 0]
                )  # (c,)
                (out[s : s + rows],) = torch.autograd.grad(logp, x, grad[s : s + rows])  # (c, V)
        return out, None, None


def collate(samples, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of tree.Sample into (B, T) tensors: train.py's micro-batches."""
    T = max(len(s.input_ids) for s in samples)
    pad = lambda xs, v: [x + [v] * (T - len(x)) for x in xs]
    return {
        "ids": torch.tensor(pad([s.input_ids for s in samples], pad_id)),  # (B, T)
        "attn": torch.tensor(pad([[1] * len(s.input_ids) for s in samples], 0)),  # (B, T)
        # (B, T)
        "mask": torch.tensor(pad([s.loss_mask for s in samples], 0), dtype=torch.float),
        "adv": torch.tensor(pad([s.advantages for s in samples], 0.0)),  # (B, T)
        "rollout_logp": torch.tensor(pad([s.logprobs for s in samples], 0.0)),
    }  # (B, T)
