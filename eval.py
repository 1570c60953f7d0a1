"""Evaluation: roll out test questions with the agent and score them (`evaluate`: per-dataset
report, pass@k, optional LLM judge), with the metrics beyond rollout.py's EM/F1 reward: cover EM,
answer extraction, the format check.

    python eval.py --model out/runs/tree_grpo-seed0/final --n 400  # scripts/eval_cli.py: flags

Deviations from the papers' code, each cited by its name (argued in docs/paper_code.md):
- cover-em-tokens: cover EM matches whole tokens (Search-R1 tests substrings)
- last-answer: `extract_answer` takes the response's last <answer> (Search-R1: None for one)
- think-optional: the format check (FORMAT_RULES) does not require <think> blocks
"""

import random
import re
import runpy
from collections import Counter
from dataclasses import dataclass

from accelerate.utils import gather_object

from infra import engines
from infra.protocol import user_turn_ids
from infra.squad import normalize_answer, normalized_golds
from rollout import RolloutConfig, chain
from tree import path

# --------------------------------------------------------------------------------------------------
# The response: final answer and format, and cover EM (beyond the reward's EM and F1)

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
TAG_RE = re.compile(r"<(/?)(think|search|information|answer)>")

FORMAT_RULES = {
    "unbalanced_tag": (
        "every <think>, <search>, <information>, <answer> is closed, and no tag opens inside "
        "another"
    ),
    "text_outside_tags": "only whitespace between blocks",
    "search_without_information": "each <search> block is followed by an <information> block",
    "information_without_search": "each <information> block follows a <search> block",
    "empty_block": "search queries and answers are not empty",
    "no_answer": "the response contains an <answer> block",
    "answer_not_last": "the <answer> block is the last block, and the only one",
}


def cover_exact_match(prediction, golden_answers):
    """1.0 if any golden answer appears, as whole tokens, inside the normalised prediction
    (cover-em-tokens); a gold that normalises to empty matches nothing (`normalized_golds`)."""
    golds = normalized_golds(golden_answers)
    if prediction is None:
        return 0.0
    padded = f" {normalize_answer(prediction)} "
    return float(any(f" {g} " in padded for g in golds))


def extract_answer(response):
    """Text of the last <answer>...</answer> in the response (stripped), or None if there is none
    (last-answer)."""
    matches = ANSWER_RE.findall(response)
    return matches[-1].strip() if matches else None


@dataclass
class FormatCheck:
    """Result of `check_format`."""

    ok: bool  # every rule in FORMAT_RULES holds
    rule: str  # the first rule that failed (a key of FORMAT_RULES); empty when ok
    detail: str  # where and how it failed, for logs; empty when ok


def check_format(response):
    """Check a whole response (model turns + <information> observations) against FORMAT_RULES."""
    blocks, open_tag, open_at, pos = [], None, 0, 0  # blocks: (tag, body)
    for m in TAG_RE.finditer(response):
        closing, tag, at = m.group(1) == "/", m.group(2), m.start()
        if open_tag is None:
            if closing:
                return FormatCheck(False, "unbalanced_tag", f"</{tag}> at char {at} closes nothing")
            if response[pos:at].strip():
                return FormatCheck(
                    False,
                    "text_outside_tags",
                    f"{response[pos:at].strip()[:50]!r} before char {at}",
                )
            open_tag, open_at = tag, m.end()
        elif closing and tag == open_tag:
            blocks.append((tag, response[open_at:at]))
            open_tag, pos = None, m.end()
        else:
            return FormatCheck(
                False, "unbalanced_tag", f"{m.group(0)} at char {at} inside <{open_tag}>"
            )
    if open_tag is not None:
        return FormatCheck(
            False, "unbalanced_tag", f"<{open_tag}> opened before char {open_at} is never closed"
        )
    if response[pos:].strip():
        return FormatCheck(
            False, "text_outside_tags", f"{response[pos:].strip()[:50]!r} after the last block"
        )
    for i, (tag, body) in enumerate(blocks):
        if tag == "search" and (i + 1 == len(blocks) or blocks[i + 1][0] != "information"):
            return FormatCheck(
                False,
                "search_without_information",
                f"block {i}, <search>{body[:50]}</search>, is not followed by <information>",
            )
        if tag == "information" and (i == 0 or blocks[i - 1][0] != "search"):
            before = "nothing" if i == 0 else f"<{blocks[i - 1][0]}>"
            return FormatCheck(
                False, "information_without_search", f"block {i} is <information> after {before}"
            )
        if tag in ("search", "answer") and not body.strip():
            return FormatCheck(False, "empty_block", f"block {i} is an empty <{tag}>")
    answers = [i for i, (tag, _) in enumerate(blocks) if tag == "answer"]
    if not answers:
        return FormatCheck(False, "no_answer", f"{len(blocks)} blocks, none of them <answer>")
    if answers != [len(blocks) - 1]:
        return FormatCheck(
            False, "answer_not_last", f"<answer> at block(s) {answers} of {len(blocks)}"
        )
    return FormatCheck(True, "", "")


# --------------------------------------------------------------------------------------------------
# Evaluation: roll out test questions with the agent and score them

JUDGE_PROMPT = (  # BranPO Table 7
    "You are an evaluation assistant. Please determine if the predicted answer is equivalent to "
    "any of the labeled answers.\n\nQuestion: {question}\n\nLabeled Answers: "
    "{answers}\n\nPredicted Answer: {prediction}\n\nDid the model give an answer **equivalent** "
    'to any of the labeled answers? Respond with "Correct" if equivalent to at least one, '
    'otherwise "Incorrect".\n\nOutput in JSON format:\n```json\n{{\n  "rationale": "your '
    'rationale",\n  "judgement": "Correct" or "Incorrect"\n}}\n```'
)


def judge(engine, tokenizer, items):
    """LLM-as-judge (BranPO Table 7) with a local model: 1.0 where its judgement says "Correct".
    `items` are (question, golden answers, prediction); a missing prediction is judged incorrect
    without asking."""
    asks = [i for i, (_, _, p) in enumerate(items) if p]
    prompts = [
        user_turn_ids(
            tokenizer, JUDGE_PROMPT.format(question=q, answers="; ".join(golds), prediction=p)
        )
        for q, golds, p in items
        if p
    ]
    outs = (
        engine.generate(prompts, engines.Sampling(temperature=0.0, max_tokens=256))
        if prompts
        else []
    )
    scores = [0.0] * len(items)
    for i, out in zip(asks, outs):
        verdict = re.search(
            r'"judgement"\s*:\s*"(\w+)"', tokenizer.decode(out.token_ids, skip_special_tokens=True)
        )
        scores[i] = float(verdict is not None and verdict.group(1).lower() == "correct")
    return scores


def means(metrics, keys, lost):
    """n, env_errors and the mean of each of `keys` over `metrics` (one dict per scored question;
    0.0 if none)."""
    return {
        "n": len(metrics),
        "env_errors": lost,
        **{key: sum(m[key] for m in metrics) / len(metrics) if metrics else 0.0 for key in keys},
    }


def evaluate(agent, rows, k=1, seed=0, judge_fn=None, processes=None):
    """Roll out every question k times (independent chains) and score the first sample: em and f1
    (the reward's; no answer scores 0), cover_em, format (passes check_format), turns, searches,
    judge (with `judge_fn`); and pass@k (any of the k samples has EM 1). Means over all questions,
    per data_source ("by_source"), EM per hop count where rows know it (em_hop{h}: the embedded
    world), and each question's id, answer and EM ("questions": train.py writes them to
    RUN_DIR/eval_stepN.jsonl). A sample whose retrieval failed (env_error) is the environment's
    fault: left out; a question left with none counts in env_errors, not n; losing all raises.

    `processes` (train.py's Accelerator, every rank calling): each rank rolls out a contiguous
    share of `rows` with its own agent, the scores are gathered in row order, and every rank
    returns the report over all rows: the numbers of one process, since greedy decoding
    (--eval_temperature 0) gives each question the same answer whoever rolls it out."""
    ranks, rank = (processes.num_processes, processes.process_index) if processes else (1, 0)
    share = rows[len(rows) * rank // ranks : len(rows) * (rank + 1) // ranks]
    tree_groups = chain(agent, share, random.Random(seed), RolloutConfig(grpo_G=k))  # per prompt
    results = []  # per question of the share: (its first sample's answer, its metrics) or None
    for row, trees in zip(share, tree_groups):
        samples = [t.leaves()[0] for t in trees if t.leaves()[0].scored]
        if not samples:
            results.append(None)
            continue
        first, steps = samples[0], path(samples[0])
        results.append(
            (
                first.answer,
                {
                    "em": first.em or 0.0,
                    "f1": first.f1 or 0.0,
                    "cover_em": cover_exact_match(first.answer, row.golden_answers),
                    f"pass@{k}": max(s.em or 0.0 for s in samples),
                    "format": float(check_format("".join(s.text + s.obs_text for s in steps)).ok),
                    "turns": float(len(steps)),
                    "searches": float(sum(s.action == "search" for s in steps)),
                },
            )
        )
    if judge_fn is not None:
        scored = [(row, r) for row, r in zip(share, results) if r is not None]
        verdicts = judge_fn(
            [(row.question, row.golden_answers, answer) for row, (answer, _) in scored]
        )
        for (_, (_, metrics)), verdict in zip(scored, verdicts):
            metrics["judge"] = verdict
    if ranks > 1:  # every rank's results, in rank order: the rows' order
        results = gather_object(results)
    scored, lost = [], Counter()  # scored: (row, its first sample's answer, its metrics)
    for row, result in zip(rows, results):
        if result is None:
            lost[row.data_source] += 1
        else:
            scored.append((row, *result))
    if not scored:
        raise RuntimeError(
            f"all {len(rows)} evaluation questions were lost to retrieval errors (env_error); "
            f"the retriever is down or overloaded: check it, then evaluate again"
        )
    by_source, by_hops = {src: [] for src in lost}, {}
    for row, _, metrics in scored:
        by_source.setdefault(row.data_source, []).append(metrics)
        if row.hops:  # the embedded world's rows know their hop count
            by_hops.setdefault(row.hops, []).append(metrics["em"])
    keys = list(scored[0][2])
    return {
        **means([metrics for _, _, metrics in scored], keys, sum(lost.values())),
        **{f"em_hop{h}": sum(ems) / len(ems) for h, ems in sorted(by_hops.items())},
        "by_source": {src: means(ms, keys, lost[src]) for src, ms in sorted(by_source.items())},
        "questions": [  # per question, in row order; None: lost to retrieval errors
            {"id": row.id, "prediction": r and r[0], "em": r and r[1]["em"]}
            for row, r in zip(rows, results)
        ],
    }


if __name__ == "__main__":  # the command line, scripts/eval_cli.py, run by name
    runpy.run_module("scripts.eval_cli", run_name="__main__", alter_sys=True)
