"""Real datasets as questions: Search-R1 parquet, FlashRAG / our JSONL and Hugging Face `datasets`
turned into infra/data.py's `QARow`s (`load_rows`), every bad file or row named (`DataError`).

Deviations from the papers, each cited by its name (argued in docs/paper_code.md):
- question-from-prompt: a parquet row without `question` takes the prompt's last "Question:"
"""

import json
import os
import re
from dataclasses import fields

import datasets
import pyarrow.parquet

from infra.data import QARow
from infra.squad import normalize_answer


class DataError(ValueError):
    """A dataset file or row that cannot be read as questions; the message names the file and
    row."""


def _question_from_prompt(prompt, where):
    users = (
        [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if isinstance(prompt, list)
        else []
    )
    if not isinstance(prompt, str) and not users:
        raise DataError(
            f"{where}: 'prompt' must be a string or chat messages with a user turn, got "
            f"{prompt!r:.200}"
        )
    text = prompt if isinstance(prompt, str) else users[-1].get("content", "")
    return text.rsplit("Question:", 1)[-1].strip()  # question-from-prompt


def _integer(value, name, where):
    if not isinstance(value, int) or isinstance(value, bool):
        raise DataError(
            f"{where}: {name!r} must be an integer, got {value!r}; fix or drop that field"
        )
    return value


def row_from_record(rec, where, split, index):
    """One QARow from a Search-R1 (prompt + reward_model) or FlashRAG (question + golden_answers)
    record."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if "reward_model" in rec or "prompt" in rec:
        try:
            answers = rec["reward_model"]["ground_truth"]["target"]
        except (KeyError, TypeError):
            raise DataError(
                f"{where}: Search-R1 row has no reward_model.ground_truth.target "
                f"(keys: {sorted(rec)})"
            ) from None
        question = rec.get("question") or _question_from_prompt(rec.get("prompt"), where)
    elif "question" in rec and "golden_answers" in rec:
        question, answers = rec["question"], rec["golden_answers"]
    else:
        raise DataError(
            f"{where}: not a question row (keys: {sorted(rec)}); expected FlashRAG 'question' + "
            f"'golden_answers' or Search-R1 'prompt' + 'reward_model.ground_truth.target'"
        )
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: empty or non-string question {question!r}")
    answers = [answers] if isinstance(answers, str) else answers
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise DataError(
            f"{where}: golden answers must be a non-empty list of strings, got {answers!r}"
        )
    empty = [a for a in answers if not normalize_answer(a)]
    if empty:
        raise DataError(
            f"{where}: golden answer {empty[0]!r} is empty once normalised (lower case, no "
            "punctuation, no article a / an / the), so EM and F1 would score answers such as "
            "'the' or '?' 1.0; fix or drop that answer (or the row)"
        )
    extra = rec.get("extra_info") or {}
    gold = {
        f.name: rec[f.name] for f in fields(QARow) if f.name.startswith("gold_") and f.name in rec
    }
    return QARow(
        id=str(rec.get("id", f"{split}_{index}")),
        question=question.strip(),
        golden_answers=answers,
        data_source=str(rec.get("data_source", "unknown")),
        split=str(extra.get("split", rec.get("split", split))),
        index=_integer(extra.get("index", index), "extra_info.index", where),
        hops=_integer(rec.get("hops", 0), "hops", where),
        **gold,
    )


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # a hub dataset: OWNER/NAME
SUFFIXES = (".parquet", ".jsonl", ".json")  # the question files load_rows reads itself


def source_problem(source: str, split: str) -> str:
    """Why `load_rows(source, split)` cannot read `source` (empty: it may): a path that exists
    nowhere, a file of another kind, or a directory without the split's file. A `source` that is
    no local file or directory is taken for a Hugging Face datasets name only when written as one,
    OWNER/NAME without a file suffix; anything else (a bare name, ./x, /x, a/b/c) is a local path
    that is missing. Said before a run writes anything (infra/run.py) and by `load_rows`."""
    if os.path.isdir(source):
        return (
            ""
            if split_file(source, split)
            else f"has no {split}.parquet or {split}.jsonl; pass a file, or a directory holding one"
        )
    if os.path.exists(source):
        return (
            ""
            if source.endswith(SUFFIXES)
            else f"is not a {', '.join(SUFFIXES)} file; write its questions as JSONL, one "
            '{"question": ..., "golden_answers": [...]} per line'
        )
    if HUB_NAME.fullmatch(source) and not source.endswith(SUFFIXES):
        return ""
    return (
        "does not exist: no file or directory of that name here, and not a Hugging Face datasets "
        f"name (OWNER/NAME); pass a {', '.join(SUFFIXES)} file, a directory holding "
        f"{split}.parquet or {split}.jsonl, or a datasets name (`python -m infra.data --out DIR` "
        "writes the embedded world's)"
    )


def load_rows(source, split="train"):
    """Questions from a .parquet / .jsonl file, a directory holding {split}.parquet or .jsonl, or a
    `datasets` name (OWNER/NAME: source_problem)."""
    if problem := source_problem(source, split):
        raise DataError(f"{source}: {problem}")
    source = split_file(source, split) if os.path.isdir(source) else source
    if source.endswith(".parquet"):
        try:
            records = pyarrow.parquet.read_table(source).to_pylist()
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{source} is not a Parquet file that pyarrow reads ({e})") from None
        rows = [row_from_record(r, f"{source}: row {i}", split, i) for i, r in enumerate(records)]
    elif source.endswith((".jsonl", ".json")):
        rows = [
            row_from_record(rec, f"{source}: line {line_no}", split, i)
            for i, (line_no, rec) in enumerate(read_jsonl(source, DataError))
        ]
    else:
        try:
            ds = datasets.load_dataset(source, split=split)
        except (OSError, ValueError) as e:  # not on the hub, no network, no such split
            raise DataError(
                f"{source}: not a local file or directory, and datasets could not load it as a "
                f"hub dataset ({type(e).__name__}: {e}); check the name, the split {split!r} and "
                "the network, or pass a local file"
            ) from None
        rows = [
            row_from_record(dict(r), f"{source}[{split}]: row {i}", split, i)
            for i, r in enumerate(ds)
        ]
    if not rows:
        raise DataError(f"{source} holds no rows")
    return rows


def split_file(source: str, split: str) -> str:
    """The file `load_rows` reads `split` from: `source` itself, or in a directory its
    {split}.parquet, else {split}.jsonl; empty when there is none (a directory without it, or a
    `datasets` name)."""
    if not os.path.isdir(source):
        return source if os.path.isfile(source) else ""
    found = [os.path.join(source, f"{split}.{e}") for e in ("parquet", "jsonl")]
    return next((p for p in found if os.path.exists(p)), "")


def read_jsonl(path, error=ValueError):
    """(line number, parsed object) per non-blank line; a line not UTF-8 or not JSON raises `error`
    naming it."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(
                    f"{path}: line {line_no}: not UTF-8 ({e}); re-encode the file as UTF-8"
                ) from None
            if line.strip():
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as e:
                    raise error(f"{path}: line {line_no}: invalid JSON ({e})") from None
