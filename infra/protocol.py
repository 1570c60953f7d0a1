"""Search-R1's agent protocol, shared by rollout.py's agent, the warm start's demonstrator,
evaluation and dumps: the agent's settings (`AgentConfig`, the same in every script), the
instruction it is prompted with (Search-R1's, or a short one for the embedded default's tokenizer),
the message that follows an invalid action (--retry_invalid), the observation body made of
retrieved passages, a user turn through the tokenizer's chat template, IGPO's teacher-forced
answer, the abnormal outcomes a step can end with (FLAGS), and how a step's text is read into its
action (`parse_action`) and its query compared (`query_key`).
"""

import re
from dataclasses import dataclass, replace
from typing import Literal

from infra import data

FLAGS = ("parse_error", "repeated_query", "too_many_calls", "max_turns", "truncated", "env_error")
# parse_error: no valid tag, unclosed tag or empty query; repeated_query: same query earlier on the
# path; too_many_calls: more tool calls in one step than allowed; max_turns: turn limit reached
# without an answer; truncated: token budget per trajectory exceeded; env_error: retrieval failed or
# timed out (trajectory discarded).

INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <{think}> and </{think}> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times as "
    "your want. If you find no further external knowledge needed, you can directly provide the "
    "answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> "
    "Beijing </answer>. Question: {question}\n"
)
SHORT_INSTRUCTION = (
    "Answer the question. Think inside <{think}> </{think}>, search with <search> query </search>, "
    "read <information> </information>, answer inside <answer> </answer>. Question: {question}\n"
)
RETRY = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer between "
    "<answer> and </answer>. Let me try again.\n"
)
INSTRUCTIONS = {"search_r1": INSTRUCTION, "short": SHORT_INSTRUCTION}
# IGPO's teacher-forced answer (its official code's words, in a step of our own): the gold follows
FORCED_ANSWER = "<{think}>\nNow there's enough information to answer\n</{think}>\n<answer> "


@dataclass
class AgentConfig:
    """How an agent step is generated, parsed, executed and scored: one config for every script."""

    instruction: Literal["auto", "search_r1", "short"] = "auto"
    """Prompt: auto = the short one for the embedded default's tokenizer, else Search-R1's."""
    think_tag: str = "think"
    """Reasoning tag: "think" (Search-R1); "thinking" or "reason" (the papers' Qwen3 runs)."""
    max_turns: int = 4
    """Search rounds (Search-R1's); step max_turns + 1 may only answer (a search: reward 0)."""
    max_step_tokens: int = 64
    """Tokens generated per step."""
    max_traj_tokens: int = 1024
    """Trajectory token budget after the prompt; past it: truncated (reward counts, untrained)."""
    max_obs_tokens: int = 160
    """Observation tokens appended per search (the passages are cut, the closing tag kept)."""
    topk: int = 3
    """Passages retrieved per query."""
    max_calls: int = 1
    """Tool calls allowed in one step; more: too_many_calls (Cut the Bill: 5 or 10, in parallel)."""
    temperature: float = 1.0
    """Rollout sampling temperature."""
    top_p: float = 1.0
    """Rollout nucleus mass."""
    eval_temperature: float = 0.0
    """Evaluation temperature (0 = greedy; the seeds' protocol: 0.7 with top-p 0.8)."""
    eval_top_p: float = 1.0
    """Evaluation nucleus mass."""
    reward: Literal["f1", "em"] = "f1"
    """Outcome reward, one for every --algo (each paper's own: the README's table of methods)."""
    format_penalty: bool = False
    """BranPO's -0.5 for a broken tag format or an answer without any search."""
    retry_invalid: bool = False
    """Search-R1's: a parse error appends a retry message (RETRY) instead of ending the step."""


RULES = [  # flags.check: (flags, what is allowed, test)
    (
        "max_turns max_step_tokens max_traj_tokens max_obs_tokens topk max_calls",
        "an integer >= 1",
        lambda v: v >= 1,
    ),
    ("temperature eval_temperature", ">= 0", lambda v: v >= 0),
    ("top_p eval_top_p", "in (0, 1]", lambda v: 0 < v <= 1),
]


def for_eval(cfg: AgentConfig) -> AgentConfig:
    """The agent settings evaluation samples with (eval_temperature, eval_top_p), every budget
    unchanged."""
    return replace(cfg, temperature=cfg.eval_temperature, top_p=cfg.eval_top_p)


def instruction_template(choice: str, tokenizer) -> str:
    """AgentConfig.instruction's template; "auto": the short one for the embedded default's
    tokenizer (its syllable continuation pieces are in the vocabulary), else Search-R1's."""
    if choice == "auto":
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        choice = "short" if all("##" + s in vocab for s in data.SYLLABLES) else "search_r1"
    return INSTRUCTIONS[choice]


def encode(tokenizer, text: str) -> list[int]:
    """`text`'s token ids, without the special tokens a tokenizer may add around it."""
    return tokenizer.encode(text, add_special_tokens=False)


def forced_answer_ids(tokenizer, think: str, gold: str) -> tuple[list[int], list[int]]:
    """IGPO's teacher-forced answer after a context: (FORCED_ANSWER's ids, the gold's ids), encoded
    apart so that the gold's own tokens are known; only the gold's are scored."""
    return encode(tokenizer, FORCED_ANSWER.format(think=think)), encode(tokenizer, gold.strip())


def format_passages(passages) -> str:
    """Search-R1's observation body: 'Doc i(Title: t) text' per passage."""
    return "\n".join(f"Doc {i + 1}(Title: {p.title}) {p.text}" for i, p in enumerate(passages))


def user_turn_ids(tokenizer, text: str) -> list[int]:
    """`text` as a user turn: the chat template (generation prompt added) if the tokenizer has one,
    else plain."""
    if not getattr(tokenizer, "chat_template", None):
        return encode(tokenizer, text)
    turn = [{"role": "user", "content": text}]
    kw = {"tokenize": True, "add_generation_prompt": True, "return_dict": False}
    return list(tokenizer.apply_chat_template(turn, **kw))


def parse_action(text: str, think: str, max_calls: int) -> tuple[str, str | None, str | None]:
    """One step's (action, content, abnormal flag): "search" or "answer" for the FIRST complete tag,
    else "invalid" with too_many_calls (> max_calls <search> tags) or parse_error (no tag, unclosed
    tag, empty, unbalanced think)."""
    if text.count("<search>") > max_calls:
        return "invalid", None, "too_many_calls"
    found = [(text.find(f"<{tag}>"), tag) for tag in ("search", "answer") if f"<{tag}>" in text]
    if text.count(f"<{think}>") != text.count(f"</{think}>") or not found:
        return "invalid", None, "parse_error"
    start, tag = min(found)
    end = text.find(f"</{tag}>", start)
    content = text[start + len(tag) + 2 : end].strip()
    if end < 0 or not content:
        return "invalid", None, "parse_error"
    return tag, content, None


def query_key(query: str) -> str:
    """A query as the repeated_query check compares it: lowercased, whitespace collapsed."""
    return re.sub(r"\s+", " ", query.strip().lower())
