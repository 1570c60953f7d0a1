"""Supervised warm start of the embedded default's tiny Llama, before RL (as BranPO's cold start,
App. A.2).

    python train.py warmstart --out out/warmstart --world out/world   # alone

So it runs alone, its agent format set by AgentConfig's flags; train.py runs it (`ensure`) before
RL when there is no --model, with the run's --seed. Its driver (training with rollout.py's agent as
the demonstrator and eval.py's `evaluate` as the validation, the cache, the command line) is
scripts/warmstart.py; this file holds the model, the tokenizer, the data and the fitting.

The model is a 3-layer, d = 128 Llama; its tokenizer's pieces are the world's syllables, syllable
pairs and words, so it can copy a name it never saw in a training question from a passage into its
next query. Two stages:
1. copy: random pieces, a gap, the same pieces twice more, loss on the repeats, until the loss shows
   the induction heads (find the earlier occurrence of the current token, copy what followed) that
   a real base model arrives with and that every later step needs: copying a name, or the
   question's wording into a thought.
2. trajectories: the world's gold chains in the agent's exact token format (`trajectory`), loss on
   the model's tokens only. A share carries one mistake (MISTAKES), and the demonstrator answers
   most questions of more than --search_budget hops after that many searches, so the warm-started
   policy answers early: the error RL is to fix.

Deviations from the papers, each cited by its name (argued in docs/paper_code.md):
- gold-cold-start: the warm start learns the world's gold chains, not the model's zero-RL run
- lowercase-tokenizer: the tokenizer lowercases and splits on whitespace and punctuation
"""

import json
import math
import os
import re
import shutil
from dataclasses import asdict, dataclass

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from infra import data, flags, protocol

MISTAKES = ("early", "wrong", "repeat")

TAGS = [
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<information>",
    "</information>",
]
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def world_tokenizer() -> PreTrainedTokenizerFast:
    """WordPiece over the world's syllables and syllable pairs (word-initial and '##' pieces; why
    pairs: docs/embedded_default.md), its words, the agent's words (infra/protocol.py),
    digits, punctuation, single letters; agent tags whole."""
    agent_text = " ".join(
        [
            protocol.INSTRUCTION,
            protocol.SHORT_INSTRUCTION,
            protocol.RETRY,
            "Doc 1(Title: x) 0123456789",
        ]
    )
    words = set(data.TEMPLATE_WORDS) | {w.lower() for w in re.findall(r"[A-Za-z]+", agent_text)}
    symbols = set(data.PUNCTUATION) | set(re.findall(r"[^\sA-Za-z]", agent_text)) - set("<>/")
    # fallback: any lowercase word can be spelled, none is [UNK]
    letters = set("abcdefghijklmnopqrstuvwxyz")
    # 1 and 2 syllables
    syllables = set(data.SYLLABLES) | {a + b for a in data.SYLLABLES for b in data.SYLLABLES}
    starts = sorted(syllables | words | letters)
    pieces = SPECIAL + starts + sorted(symbols) + ["##" + s for s in sorted(syllables | letters)]
    tok = Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()  # lowercase-tokenizer
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Punctuation(),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.add_tokens([AddedToken(t, normalized=False, single_word=False) for t in TAGS])
    tok.add_special_tokens(SPECIAL)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        bos_token="[BOS]",
        eos_token="[EOS]",
    )


def tiny_llama(tokenizer, hidden=128, layers=3, heads=4, max_len=2048, seed=0) -> LlamaForCausalLM:
    """A freshly initialised small Llama for the embedded default (3 layers, d = 128)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(cfg)


@dataclass
class WarmConfig:
    """The warm start's stages and optimisation (the trajectories' format is the RL run's
    infra/protocol.py's AgentConfig)."""

    copy_steps: int = 2000
    """Cap on the copy task's steps (stage 1; 0 = none); it ends sooner, once its loss is below
    copy_loss."""
    copy_loss: float = 0.5
    """The copy task ends when its loss (mean of the last 50 steps) is below this: the induction
    heads formed."""
    copy_length: int = 16
    """Most pieces per copy sequence (each sequence: 4..copy_length pieces, a gap, the same pieces
    twice more)."""
    sft_steps: int = 400
    """Optimizer steps on trajectories (stage 2) before the first validation, and per further
    round."""
    sft_max_steps: int = 1200
    """Cap on trajectory steps: below target_em, train sft_steps more at half the lr up to this,
    then fail."""
    target_em: float = 0.6
    """Greedy EM on val_n dev questions the warm start must reach (0 = no validation)."""
    val_n: int = 200
    """Dev questions (spread over the hops) for the validation."""
    warm_batch_size: int = 16
    """Sequences per step, every stage."""
    warm_lr: float = 1e-3
    """AdamW peak learning rate of both stages (constant for copy, cosine decay to 10% for
    trajectories)."""
    mistake_rate: float = 0.3
    """Share of trajectories that carry one mistake (early, wrong or repeat, at a random hop)."""
    search_budget: int = 3
    """The demonstrator's habit: on longer questions, it answers after this many searches (wrong; 0
    = never)."""
    budget_rate: float = 0.7
    """Share of the demonstrations of questions longer than search_budget hops that stop at the
    budget."""


RULES = [  # flags.check: (flags, what is allowed, test)
    ("copy_steps search_budget", "an integer >= 0", lambda v: v >= 0),
    ("copy_length sft_steps warm_batch_size val_n", "an integer >= 1", lambda v: v >= 1),
    ("warm_lr copy_loss", "> 0", lambda v: v > 0),
    ("mistake_rate budget_rate target_em", "in [0, 1]", lambda v: 0 <= v <= 1),
]


def steps_rule(cfg: WarmConfig) -> tuple[bool, str]:
    """flags.check's rule that ties --sft_max_steps to --sft_steps: (broken?, message)."""
    return (
        cfg.sft_max_steps < cfg.sft_steps,
        f"--sft_max_steps {cfg.sft_max_steps} must be >= --sft_steps {cfg.sft_steps}",
    )


def open_question(row, hop: int) -> str:
    """The question still open after `hop` hops: the original with its innermost phrase ("the
    employer of kalo mire") replaced by the entity reached ("ravoki"); hop 0 gives the original
    wording."""
    phrase = row.gold_chain[hop]
    for r in row.gold_relations[hop:-1]:
        phrase = data.RELATIONS[r].noun.format(s=phrase)
    return data.RELATIONS[row.gold_relations[-1]].question.format(s=phrase)


def fact(row, hop: int) -> str:
    """The passage sentence that answers hop `hop` ("kalo mire works for ravoki.")."""
    return data.RELATIONS[row.gold_relations[hop]].fact.format(
        s=row.gold_chain[hop], o=row.gold_chain[hop + 1]
    )


def trajectory(agent, row, rng, mistake, others, observations, where=None):
    """(input ids, loss mask) of a demonstration of `row`, with `mistake` (a MISTAKES name or None)
    at hop `where` (random when None; a wrong search queries one of `others`). Each thought quotes
    the fact just read and restates the open question, so every generated token is a local copy of
    the passage, the previous thought or the question: "<think> kalo mire works for ravoki. where is
    ravoki based? </think><search> ravoki </search>"."""
    hops = len(row.gold_queries)
    first = 1 if mistake == "early" else 0  # answering early needs at least one hop done
    if where is None:
        where = rng.randrange(first, hops) if mistake and hops > first else -1
    # steps: (thought, tag, content); read: the fact in the last observation, quoted next
    steps, read = [], ""
    for i, query in enumerate(row.gold_queries):
        # a skipped hop: answer with the entity reached so far
        if i == where and mistake == "early":
            steps.append((f"{read} the answer is {row.gold_chain[i]}", "answer", row.gold_chain[i]))
            return trajectory_ids(agent, row.question, steps, observations)
        # an unrelated search; its passages hold no fact to quote
        if i == where and mistake == "wrong":
            steps.append((f"{read} {open_question(row, i)}".strip(), "search", rng.choice(others)))
            read = ""
        steps.append((f"{read} {open_question(row, i)}".strip(), "search", query))
        # the same query again (the rollout stops it: repeated_query)
        if i == where and mistake == "repeat":
            steps.append((open_question(row, i), "search", query))
        read = fact(row, i)
    steps.append((f"{read} the answer is {row.golden_answers[0]}", "answer", row.golden_answers[0]))
    return trajectory_ids(agent, row.question, steps, observations)


def trajectory_ids(agent, question, steps, observations):
    """(input ids, loss mask): the prompt, then per step "<think> thought </think><tag> content
    </tag>" (trained) and after a search the observation ids the agent would append (not trained;
    `observations`: query -> those ids, for every query the demonstrations make)."""
    think = agent.cfg.think_tag
    ids = agent.prompt_ids(question)
    mask = [0] * len(ids)
    for thought, tag, content in steps:
        action = protocol.encode(
            agent.tok, f"<{think}> {thought} </{think}><{tag}> {content} </{tag}>"
        )
        ids, mask = ids + action, mask + [1] * len(action)
        if tag == "search":
            ids, mask = ids + observations[content], mask + [0] * len(observations[content])
    return ids, mask


def demonstration(agent, row, rng, cfg: WarmConfig, others, observations):
    """`trajectory` of `row`: on a question of more than cfg.search_budget hops, the demonstrator
    answers at its budget in cfg.budget_rate of them; otherwise it makes a random mistake in
    cfg.mistake_rate of them."""
    if cfg.search_budget and row.hops > cfg.search_budget and rng.random() < cfg.budget_rate:
        return trajectory(agent, row, rng, "early", others, observations, where=cfg.search_budget)
    mistake = rng.choice(MISTAKES) if rng.random() < cfg.mistake_rate else None
    return trajectory(agent, row, rng, mistake, others, observations)


def copy_batch(rng, pieces, cfg: WarmConfig, bos_id):
    """Stage 1's batch: K pieces, other pieces, the same K pieces twice more (loss on the repeats):
    predictable only by finding an earlier occurrence (an induction head); varied gaps rule out an
    offset."""
    batch = []
    for _ in range(cfg.warm_batch_size):
        K, gap = rng.randint(4, cfg.copy_length), rng.randint(0, cfg.copy_length // 2)
        seq, other = (
            [rng.choice(pieces) for _ in range(K)],
            [rng.choice(pieces) for _ in range(gap)],
        )
        batch.append(([bos_id] + seq + other + seq + seq, [0] * (1 + K + gap) + [1] * 2 * K))
    return batch


def trajectory_batch(agent, rng, by_hops, cfg: WarmConfig, names, observations):
    """Stage 2's batch: demonstrations of questions of one hop count (`by_hops`: similar lengths,
    little padding)."""
    pool = by_hops[rng.choice(sorted(by_hops))]
    return [
        demonstration(agent, rng.choice(pool), rng, cfg, names, observations)
        for _ in range(cfg.warm_batch_size)
    ]


def fit(model, make_batch, steps, lr, pad_id, desc, floor=0.1, until=0.0) -> tuple[float, int]:
    """AdamW on next-token loss where `make_batch()`'s masks say (50 warmup steps, then cosine down
    to floor x lr), for `steps` steps or until the mean loss of the last 50 is below `until`;
    returns the last loss and the steps taken. `model` is a `tiny_llama`, its body and head called
    apart: the head runs only where the loss looks."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            min(1.0, (s + 1) / 50) * (floor + (1 - floor) * (1 + math.cos(math.pi * s / steps)) / 2)
        ),
    )
    model.train()
    bar = flags.progress(range(steps), desc=desc)
    losses = []
    for _ in bar:
        batch = make_batch()
        T = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [pad_id] * (T - len(i)) for i, _ in batch])  # (B, T)
        attn = torch.tensor([[1] * len(i) + [0] * (T - len(i)) for i, _ in batch])  # (B, T)
        mask = torch.tensor([m + [0] * (T - len(m)) for _, m in batch])  # (B, T)
        keep = mask[:, 1:].bool()  # (B, T-1): the positions whose next token the loss covers
        # (B, T-1, d)
        hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
        # (N, V): the vocabulary projection only where the loss looks
        logits = model.lm_head(hidden[keep])
        loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:][keep])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if len(losses) >= 50 and sum(losses[-50:]) / 50 < until:
            bar.n = len(losses)  # the steps done (tqdm counts them lazily, at each redraw)
            bar.close()
            break
    return (losses[-1] if losses else float("nan")), len(losses)


def settings(cfg: WarmConfig, agent_cfg, seed: int) -> dict:
    """What a cached warm start must match: its own settings, the agent format it was trained in and
    its seed."""
    keep = ("think_tag", "topk", "max_obs_tokens")
    return {
        **asdict(cfg),
        **{k: v for k, v in asdict(agent_cfg).items() if k in keep},
        "seed": seed,
        "instruction": protocol.instruction_template(agent_cfg.instruction, world_tokenizer()),
    }


def save(model, tok, record: dict, out_dir: str):
    """Write the warm start into out_dir: the model, its tokenizer, then warmstart.json (`record`:
    the settings it was trained with and how it ended). Callers write it whole or not at all
    (files.write_dir), so that a full disk leaves no half warm start for a later run to read."""
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "warmstart.json"), "w") as f:
        json.dump(record, f, indent=1)


def free_mib(path: str) -> float:
    """MiB free on the disk that holds `path` (or its nearest existing parent)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free / 2**20


def cached_settings(path: str) -> dict | None:
    """The settings a cached warm start's warmstart.json (`path`) records; None when there is none
    or it cannot be read (said, naming the file: a save cut short by an earlier version, or a file
    damaged since), so that the warm start is trained again."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            was = json.load(f)
        if isinstance(was, dict):
            return was
        problem = f"holds a {type(was).__name__}, not the settings"
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        problem = f"cannot be read ({type(e).__name__}: {e})"
    print(
        f"warm start: {path} {problem}: the cached warm start is incomplete (a save cut short, "
        "e.g. by a full disk); training it again"
    )
    return None
