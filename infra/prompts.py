"""The words the agent is prompted with, in Search-R1's protocol (rollout.py's agent speaks it):
the instruction (Search-R1's, or a short one for the embedded default's tokenizer), the message that
follows an invalid action (--retry_invalid), the observation body made of retrieved passages, and a
user turn through the tokenizer's chat template.
"""

from infra import data

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


def is_world_tokenizer(tokenizer) -> bool:
    """Whether `tokenizer` is the embedded default's (its syllable continuation pieces are in the
    vocabulary)."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return all("##" + s in vocab for s in data.SYLLABLES)


def instruction_template(choice: str, tokenizer) -> str:
    """AgentConfig.instruction's template ("auto": short for the embedded default's tokenizer, else
    Search-R1's)."""
    return (
        INSTRUCTIONS.get(choice)
        or INSTRUCTIONS["short" if is_world_tokenizer(tokenizer) else "search_r1"]
    )


def format_passages(passages) -> str:
    """Search-R1's observation body: 'Doc i(Title: t) text' per passage."""
    return "\n".join(f"Doc {i + 1}(Title: {p.title}) {p.text}" for i, p in enumerate(passages))


def user_turn_ids(tokenizer, text: str) -> list[int]:
    """`text` as a user turn: the chat template (generation prompt added) if the tokenizer has one,
    else plain."""
    if getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                tokenize=True,
                add_generation_prompt=True,
                return_dict=False,
            )
        )
    return tokenizer.encode(text, add_special_tokens=False)
