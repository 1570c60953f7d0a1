"""--pack_trees: a micro-batch's rows laid out once as the prefix tree of their token ids, so that a
prefix shared by n rows (a tree's trunk, a prompt) is run once in each forward and backward, not n
times (the idea of Tree Training, arXiv 2511.00413, and of verl's RFC #7561; our own layout).

Every row is a root-to-leaf path of a tree, its ids exactly as generated (TITO), so two rows share
their ids up to the node where their paths part. The rows' ids are inserted into a trie, one node
per distinct (prefix, token); the trie's nodes in insertion order are a depth-first (pre-order) walk
of it, every node after its parent. The packed sequence is that walk: node i sits at position id
depth(i) (its position in any row through it, so RoPE sees the path form's positions), and sees
itself and its ancestors only (a (1, 1, N, N) attention mask). Its log-prob is read from its
parent's logits, as a row's token t from token t - 1's.

The loss is the path form's exactly: `token_logprobs` gathers the N node log-probs back into the
micro-batch's (B, T) row layout, and `train.ppo_loss` runs on that unchanged, so a token that n rows
share gives each row's clipped term with that row's own advantage, TIS weight and KL, under the
one ratio, and the token-mean or sequence-mean denominators are the path form's. The gather's
backward adds the n rows' gradients at the shared node, which is what the path form's n separate
forwards add in the parameters (docs/loss.md, "Packed trees", derives it). Only rounding differs:
the attention over N positions sums in another order.

Deviations, each cited by its name:
- pack-per-micro-batch: the trie holds one micro-batch's rows, not a whole prompt group's tree, so
  the mini-batches, their order and the gradient accumulation stay the path form's; a tree whose
  rows fall in two micro-batches is laid out once in each. --micro_batch_size sets how much a trie
  can share.
- sdpa-or-eager: the mask is a dense boolean (SDPA) or additive (eager) 4-D mask; a model on another
  attention implementation (flash attention takes no 4-D mask) is refused with a message.
"""

from dataclasses import dataclass

import torch

MASKABLE = ("sdpa", "eager")  # attention implementations that read a 4-D mask (sdpa-or-eager)


@dataclass
class Packed:
    """A micro-batch's rows as one prefix-tree sequence of N nodes."""

    ids: torch.Tensor  # (N,): node i's token
    depth: torch.Tensor  # (N,): its position in every row through it (the position id)
    parent: torch.Tensor  # (N,): its parent's index, -1 for a row's first token
    where: torch.Tensor  # (B, T): the node at each row position (padding: its row's last node)
    sees: torch.Tensor  # (N, N) bool: node j is node i's ancestor or i itself

    path_tokens: int  # the rows' tokens: what the path form runs (path_tokens / N: the sharing)


def pack(ids: torch.Tensor, attn: torch.Tensor) -> Packed:
    """The trie of a right-padded micro-batch's rows (`ids`, `attn` (B, T): 1 on real tokens), on
    their device."""
    rows = [row[: int(n)].tolist() for row, n in zip(ids, attn.sum(-1))]
    node: dict[tuple[int, int], int] = {}  # (parent node, token) -> node index
    tokens, depth, parent = [], [], []
    where = []  # per row, the node at each position
    for row in rows:
        up, at = -1, []
        for t, token in enumerate(row):
            if (up, token) not in node:
                node[up, token] = len(tokens)
                tokens.append(token)
                depth.append(t)
                parent.append(up)
            up = node[up, token]
            at.append(up)
        where.append(at + [up] * (ids.shape[1] - len(row)))  # padding: the row's last node
    n = len(tokens)
    sees = torch.zeros(n, n, dtype=torch.bool)  # (N, N)
    for i, p in enumerate(parent):  # a parent's row is complete before its children's (pre-order)
        if p >= 0:
            sees[i] = sees[p]
        sees[i, i] = True
    long = lambda x: torch.tensor(x, dtype=torch.long)
    moved = [long(x).to(ids.device) for x in (tokens, depth, parent, where)] + [sees.to(ids.device)]
    return Packed(*moved, sum(map(len, rows)))


def mask_for(model, sees: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The (1, 1, N, N) attention mask `model`'s attention implementation reads (sdpa-or-eager):
    True where attended (SDPA), or 0 there and dtype's lowest value elsewhere (eager, added to the
    scores)."""
    config = getattr(model, "module", model).config  # DDP wraps the model in .module
    kind = getattr(config, "_attn_implementation", "eager")
    if kind not in MASKABLE:
        raise ValueError(
            f"--pack_trees: the model runs attention {kind!r}, which takes no 4-D mask; load it "
            f"with attn_implementation one of {MASKABLE}, or drop --pack_trees"
        )
    if kind == "sdpa":
        return sees[None, None]
    additive = torch.zeros(sees.shape, dtype=dtype, device=sees.device)  # (N, N)
    return additive.masked_fill(~sees, torch.finfo(dtype).min)[None, None]


def token_logprobs(model, packed: Packed, logp_of, entropy: bool = False):
    """`train.token_logprobs` of the packed rows: one forward over the N nodes, each node's log-prob
    (and entropy) from its parent's logits by `logp_of` (train.TokenLogp.apply), gathered back into
    the rows' (B, T) layout. A row's first token gets 0, as in the path form."""
    dtype = next(model.parameters()).dtype
    mask = mask_for(model, packed.sees, dtype)
    position = packed.depth[None]  # (1, N)
    logits = model(
        input_ids=packed.ids[None], attention_mask=mask, position_ids=position, use_cache=False
    ).logits[0]  # (N, V)
    first = packed.parent < 0  # (N,)
    logp, ent = logp_of(logits[packed.parent.clamp(min=0)], packed.ids, entropy)  # (N,), (N,)|(0,)
    logp = logp.masked_fill(first, 0.0)
    rows = lambda x: x[packed.where]  # (N,) -> (B, T)
    return rows(logp), rows(ent.masked_fill(first, 0.0)) if entropy else None
