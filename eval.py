"""Scoring the agent: answer metrics (EM, token F1, cover EM), answer extraction and the response format check.

The evaluation itself (`evaluate`, and the script at the end: `python eval.py --model DIR`, per-dataset table,
pass@k, optional LLM judge) samples as the seeds evaluate by default (T = 0.7, top-p 0.8). Metrics follow SQuAD's
official script (normalisation, EM, token F1) and Search-R1's reward code (extract the final <answer>, substring "cover" EM). Every metric takes the list of golden answers and
scores the best-matching one; a prediction of None (no answer given) scores 0.

Deviations from the papers' code:
1. Normalisation also removes Unicode punctuation (categories P*, e.g. "«", "—", "。"), not only ASCII
   string.punctuation, and first applies Unicode NFC so composed and decomposed accents compare equal.
2. Cover EM matches whole tokens: gold "art" is in "modern art" but not in "party" (Search-R1 tests substrings).
3. `extract_answer` takes the last <answer> of the response; Search-R1's returns None when there is at most one
   match, because its text still contains the prompt's example answer. Pass only the response here.
4. The format check does not require <think> blocks (a tiny model may act without them); it checks that tags are
   balanced and not nested, no text sits outside tags, every search is answered by an observation, and the
   response ends with exactly one non-empty answer.
5. Token F1 adds HotpotQA's (and FlashRAG's) rule to SQuAD's: yes / no / noanswer get no partial credit.
"""
import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass

# ----------------------------------------------------------------------------------------------------------------
# Answer metrics


def normalize_answer(s):
    """SQuAD normalisation: lowercase, drop punctuation, drop articles (a, an, the), collapse whitespace."""
    s = unicodedata.normalize("NFC", s).lower()
    s = "".join(ch for ch in s if ch not in string.punctuation and not unicodedata.category(ch).startswith("P"))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _golds(golden_answers):
    golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    if not golds:
        raise ValueError("golden_answers is empty; every question needs at least one accepted answer")
    return [normalize_answer(g) for g in golds]


def exact_match(prediction, golden_answers):
    """1.0 if the normalised prediction equals any normalised golden answer, else 0.0."""
    golds = _golds(golden_answers)
    return float(prediction is not None and normalize_answer(prediction) in golds)


def cover_exact_match(prediction, golden_answers):
    """1.0 if any non-empty golden answer appears, as whole tokens, inside the normalised prediction."""
    golds = _golds(golden_answers)
    if prediction is None:
        return 0.0
    padded = f" {normalize_answer(prediction)} "
    return float(any(g and f" {g} " in padded for g in golds))


def token_f1(prediction, golden_answers):
    """Best token-level F1 (SQuAD) between the prediction and any golden answer."""
    golds = _golds(golden_answers)
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    best = 0.0
    for gold in golds:
        if (pred in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer")) and pred != gold:
            continue  # HotpotQA: a yes/no answer gets no partial credit
        p, g = pred.split(), gold.split()
        if not p or not g:  # SQuAD v2: empty matches only empty
            best = max(best, float(p == g))
            continue
        same = sum((Counter(p) & Counter(g)).values())
        if same:
            precision, recall = same / len(p), same / len(g)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


# ----------------------------------------------------------------------------------------------------------------
# The response: final answer and format

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
TAG_RE = re.compile(r"<(/?)(think|search|information|answer)>")

FORMAT_RULES = {
    "unbalanced_tag": "every <think>, <search>, <information>, <answer> is closed, and no tag opens inside another",
    "text_outside_tags": "only whitespace between blocks",
    "search_without_information": "each <search> block is followed by an <information> block",
    "information_without_search": "each <information> block follows a <search> block",
    "empty_block": "search queries and answers are not empty",
    "no_answer": "the response contains an <answer> block",
    "answer_not_last": "the <answer> block is the last block, and the only one",
}


def extract_answer(response):
    """Text of the last <answer>...</answer> in the response (stripped), or None if there is none."""
    matches = ANSWER_RE.findall(response)
    return matches[-1].strip() if matches else None


@dataclass
class FormatCheck:
    """Result of `check_format`."""
    ok: bool
    """True when every rule in FORMAT_RULES holds."""
    rule: str
    """Name of the first rule that failed (a key of FORMAT_RULES); empty when ok."""
    detail: str
    """Where and how it failed, for logs; empty when ok."""


def check_format(response):
    """Check a whole response (model turns + <information> observations) against FORMAT_RULES."""
    blocks, open_tag, open_at, pos = [], None, 0, 0  # blocks: (tag, body)
    for m in TAG_RE.finditer(response):
        closing, tag, at = m.group(1) == "/", m.group(2), m.start()
        if open_tag is None:
            if closing:
                return FormatCheck(False, "unbalanced_tag", f"</{tag}> at char {at} closes nothing")
            if response[pos:at].strip():
                return FormatCheck(False, "text_outside_tags", f"{response[pos:at].strip()[:50]!r} before char {at}")
            open_tag, open_at = tag, m.end()
        elif closing and tag == open_tag:
            blocks.append((tag, response[open_at:at]))
            open_tag, pos = None, m.end()
        else:
            return FormatCheck(False, "unbalanced_tag", f"{m.group(0)} at char {at} inside <{open_tag}>")
    if open_tag is not None:
        return FormatCheck(False, "unbalanced_tag", f"<{open_tag}> opened before char {open_at} is never closed")
    if response[pos:].strip():
        return FormatCheck(False, "text_outside_tags", f"{response[pos:].strip()[:50]!r} after the last block")
    for i, (tag, body) in enumerate(blocks):
        if tag == "search" and (i + 1 == len(blocks) or blocks[i + 1][0] != "information"):
            return FormatCheck(False, "search_without_information", f"block {i}, <search>{body[:50]}</search>, "
                                                                    f"is not followed by <information>")
        if tag == "information" and (i == 0 or blocks[i - 1][0] != "search"):
            before = "nothing" if i == 0 else f"<{blocks[i - 1][0]}>"
            return FormatCheck(False, "information_without_search", f"block {i} is <information> after {before}")
        if tag in ("search", "answer") and not body.strip():
            return FormatCheck(False, "empty_block", f"block {i} is an empty <{tag}>")
    answers = [i for i, (tag, _) in enumerate(blocks) if tag == "answer"]
    if not answers:
        return FormatCheck(False, "no_answer", f"{len(blocks)} blocks, none of them <answer>")
    if answers != [len(blocks) - 1]:
        return FormatCheck(False, "answer_not_last", f"<answer> at block(s) {answers} of {len(blocks)}")
    return FormatCheck(True, "", "")


# ----------------------------------------------------------------------------------------------------------------
# Evaluation: roll out test questions with the agent and score them

JUDGE_PROMPT = (  # BranPO Table 7
    "You are an evaluation assistant. Please determine if the predicted answer is equivalent to any of the labeled "
    "answers.\n\nQuestion: {question}\n\nLabeled Answers: {answers}\n\nPredicted Answer: {prediction}\n\n"
    "Did the model give an answer **equivalent** to any of the labeled answers? Respond with \"Correct\" if "
    "equivalent to at least one, otherwise \"Incorrect\".\n\nOutput in JSON format:\n```json\n{{\n  "
    "\"rationale\": \"your rationale\",\n  \"judgement\": \"Correct\" or \"Incorrect\"\n}}\n```")


def judge(engine, tokenizer, items):
    """LLM-as-judge (BranPO Table 7) with a local model: 1.0 where its judgement says "Correct". `items` are
    (question, golden answers, prediction); a missing prediction is judged incorrect without asking."""
    from engines import Sampling
    from rollout import user_turn_ids
    asks = [i for i, (_, _, p) in enumerate(items) if p]
    prompts = [user_turn_ids(tokenizer, JUDGE_PROMPT.format(question=items[i][0], answers="; ".join(items[i][1]),
                                                           prediction=items[i][2])) for i in asks]
    outs = engine.generate(prompts, Sampling(temperature=0.0, max_tokens=256)) if prompts else []
    scores = [0.0] * len(items)
    for i, out in zip(asks, outs):
        verdict = re.search(r'"judgement"\s*:\s*"(\w+)"', tokenizer.decode(out.token_ids, skip_special_tokens=True))
        scores[i] = float(verdict is not None and verdict.group(1).lower() == "correct")
    return scores


def evaluate(agent, rows, k=1, seed=0, judge_fn=None):
    """Roll out every question k times (independent chains) and score them.

    Returns the overall metrics and, under "by_source", one dict per data_source: n, em, f1, cover_em (of the
    first sample), pass@k (any of the k samples has EM 1), format (share of first samples passing check_format),
    turns and searches (means over first samples), and judge (if `judge_fn` is given); em_hop{h}: EM of the rows
    with h hops, where rows know their hop count (the embedded world). Samples whose retrieval failed (env_error)
    are the environment's fault, not the model's: they are left out, and a question left with none is counted in
    env_errors instead of n; if every question is lost, it raises.
    """
    import random

    import rollout
    prompts = rollout.chain(agent, rows, random.Random(seed), G=k)
    per_row, lost = [], Counter()
    for row, trees in zip(rows, prompts):
        samples = [t.leaves()[0] for t in trees if t.leaves()[0].scored]
        if not samples:
            lost[row.data_source] += 1
            continue
        first = samples[0]
        steps = rollout.path(first)
        prediction = first.answer
        per_row.append({
            "source": row.data_source, "hops": row.hops, "question": row.question, "golden": row.golden_answers,
            "prediction": prediction,
            "em": exact_match(prediction, row.golden_answers), "f1": token_f1(prediction, row.golden_answers),
            "cover_em": cover_exact_match(prediction, row.golden_answers),
            f"pass@{k}": max(exact_match(s.answer, row.golden_answers) for s in samples),
            "format": float(check_format("".join(s.text + s.obs_text for s in steps)).ok),
            "turns": float(len(steps)), "searches": float(sum(s.action == "search" for s in steps))})
    if not per_row:
        raise RuntimeError(f"all {len(rows)} evaluation questions were lost to retrieval errors (env_error); "
                           f"the retriever is down or overloaded: check it, then evaluate again")
    if judge_fn is not None:
        for r, score in zip(per_row, judge_fn([(r["question"], r["golden"], r["prediction"]) for r in per_row])):
            r["judge"] = score
    keys = [key for key in per_row[0] if key not in ("source", "hops", "question", "golden", "prediction")]
    mean = lambda rs, lost: {"n": len(rs), "env_errors": lost,  # noqa: E731
                             **{key: sum(r[key] for r in rs) / len(rs) if rs else 0.0 for key in keys}}
    by_source, by_hops = {src: [] for src in lost}, {}
    for r in per_row:
        by_source.setdefault(r["source"], []).append(r)
        if r["hops"]:  # the embedded world's rows know their hop count
            by_hops.setdefault(r["hops"], []).append(r["em"])
    hops = {f"em_hop{h}": sum(v) / len(v) for h, v in sorted(by_hops.items())}
    return {**mean(per_row, sum(lost.values())), **hops,
            "by_source": {src: mean(rs, lost[src]) for src, rs in sorted(by_source.items())}}


def table(report):
    """The per-dataset table as text."""
    keys = [key for key in report if key != "by_source" and not key.startswith("em_hop")]
    lines = [f"{'dataset':14}" + "".join(f"{key:>10}" for key in keys)]
    for name, m in [*report["by_source"].items(), ("all", report)]:
        lines.append(f"{name:14}" + "".join(f"{m[key]:>10d}" if key in ("n", "env_errors") else f"{m[key]:>10.3f}"
                                            for key in keys))
    hops = [f"{key[6:]}-hop {v:.3f}" for key, v in report.items() if key.startswith("em_hop")]
    return "\n".join(lines + ([f"EM by hops: {', '.join(hops)}"] if hops else []))


if __name__ == "__main__":
    import json
    import os
    from dataclasses import dataclass, field

    import importlib.util

    import cli

    @dataclass
    class EvalArgs:
        """`python eval.py --model DIR --data NAME|PATH`: multi-turn evaluation of a policy."""
        model: str = "out/warmstart"
        """Policy: a checkpoint directory (e.g. out/runs/tree_grpo-seed0/final) or a hub name."""
        gguf_file: str = ""
        """A GGUF file inside --model's directory."""
        data: str = ""
        """Questions: .parquet / .jsonl / a directory with {split}.* / a datasets name; empty = the embedded world."""
        split: str = "test"
        """Split to evaluate."""
        corpus: str = ""
        """Corpus JSONL; empty = the embedded world's."""
        retriever: str = field(default="bm25", metadata={"choices": ["bm25", "dense"]})
        """In-process retriever (when --retriever_url is empty)."""
        retriever_url: str = ""
        """A Search-R1 retrieval server."""
        retriever_timeout_s: float = 10.0
        """Seconds the retrieval server gets per request (train.py --retriever_timeout_s)."""
        retriever_retries: int = 2
        """Further tries of a failed retrieval request (train.py --retriever_retries)."""
        n: int = 500
        """Questions: n spread evenly over the split."""
        k: int = 1
        """Samples per question (pass@k); k > 1 needs temperature > 0."""
        temperature: float = 0.7
        """Sampling temperature: the papers' seeds evaluate at 0.7 with top_p 0.8 (as train.py's eval); 0 = greedy."""
        top_p: float = 0.8
        """Nucleus mass."""
        max_turns: int = 4
        """Search rounds, then one answer-only step (train.py --max_turns)."""
        instruction: str = field(default="auto", metadata={"choices": ["auto", "search_r1", "short"]})
        """Prompt: auto = short for the embedded default's tokenizer, else Search-R1's."""
        judge_model: str = ""
        """A local judge model directory for LLM-as-judge (BranPO Table 7); empty = none."""
        engine: str = field(default="auto", metadata={"choices": ["auto", "hf", "vllm"]})
        """Generation engine."""
        out: str = ""
        """JSON report path; empty = next to the model as eval_<split>.json."""

    a = cli.parse(EvalArgs)[0]
    cli.check(a, [("n k max_turns", "an integer >= 1", lambda v: v >= 1),
                  ("temperature", ">= 0", lambda v: v >= 0), ("top_p", "in (0, 1]", lambda v: 0 < v <= 1),
                  ("retriever_timeout_s", "> 0", lambda v: v > 0), ("retriever_retries", ">= 0", lambda v: v >= 0),
                  ("engine", "auto or hf: vllm is not installed (pip install -r requirements-gpu.txt)",
                   lambda v: v != "vllm" or importlib.util.find_spec("vllm") is not None)],
              [(a.k > 1 and a.temperature == 0, f"--k {a.k} needs --temperature > 0: greedy samples are all equal")])
    import data
    import policy
    import rollout
    from engines import make_engine
    from retriever import RemoteRetriever, RetrieverConfig, health_check, load_corpus, make_retriever
    world = data.ensure_world("out/world") if not (a.data and a.corpus) else ""
    rows = data.spread(data.load_rows(a.data or world, a.split), a.n)
    search = (RemoteRetriever(a.retriever_url, a.retriever_timeout_s, a.retriever_retries) if a.retriever_url else
              make_retriever(load_corpus(a.corpus or os.path.join(world, "corpus.jsonl")),
                             RetrieverConfig(retriever=a.retriever)))
    health_check(search, f"the retrieval server {a.retriever_url}" if a.retriever_url else
                 f"the in-process {a.retriever}")
    model, tok = policy.load_policy(a.model, a.gguf_file or None)
    engine = make_engine(a.engine, model, tok, a.model)
    cfg = rollout.AgentConfig(instruction=policy.instruction(a.instruction, tok),
                              max_turns=a.max_turns, temperature=a.temperature, top_p=a.top_p)
    judge_fn = None
    if a.judge_model:
        judge_model, judge_tok = policy.load_policy(a.judge_model)
        judge_engine = make_engine(a.engine, judge_model, judge_tok, a.judge_model)
        judge_fn = lambda items: judge(judge_engine, judge_tok, items)  # noqa: E731
    report = evaluate(rollout.Agent(engine, search, tok, cfg), rows, k=a.k, judge_fn=judge_fn)
    print(table(report))
    out = a.out or os.path.join(a.model if os.path.isdir(a.model) else ".", f"eval_{a.split}.json")
    with open(out, "w") as f:
        json.dump({"args": vars(a), "report": report}, f, indent=1)
    print(f"report: {out}")
