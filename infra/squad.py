"""Answer scoring as SQuAD's official evaluation script: normalisation, exact match and token F1,
against the best-matching of a question's golden answers. The outcome reward (rollout.py) and
eval.py's cover EM score with these; how they depart from SQuAD's script (Unicode punctuation,
HotpotQA's yes / no rule, no empty gold) is rollout.py's squad-reward. The rules and their edge
cases: docs/evaluation.md.
"""

import re
import string
import unicodedata
from collections import Counter


def normalize_answer(s):
    """SQuAD normalisation: lowercase, drop punctuation, drop articles (a, an, the), collapse
    whitespace."""
    s = unicodedata.normalize("NFC", s).lower()
    s = "".join(
        ch
        for ch in s
        if ch not in string.punctuation and not unicodedata.category(ch).startswith("P")
    )
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def normalized_golds(golden_answers):
    """The normalised golden answers (a single string is one answer); none raises. A gold that
    normalises to empty ("The The", "?") is left out: it cannot tell an answer from no answer, so
    it matches nothing (SQuAD's script: it matches any answer that normalises to empty)."""
    golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    if not golds:
        raise ValueError(
            "golden_answers is empty; every question needs at least one accepted answer"
        )
    return [g for g in map(normalize_answer, golds) if g]


def exact_match(prediction, golden_answers):
    """1.0 if the normalised prediction equals any normalised golden answer, else 0.0."""
    golds = normalized_golds(golden_answers)
    return float(prediction is not None and normalize_answer(prediction) in golds)


def token_f1(prediction, golden_answers):
    """Best token-level F1 (SQuAD) between the prediction and any golden answer."""
    golds = normalized_golds(golden_answers)
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    best = 0.0
    for gold in golds:
        if (
            pred in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer")
        ) and pred != gold:
            continue  # HotpotQA: a yes/no answer gets no partial credit
        p, g = pred.split(), gold.split()
        same = sum((Counter(p) & Counter(g)).values())
        if same:  # an empty prediction shares no token: 0 (no gold is empty)
            precision, recall = same / len(p), same / len(g)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best
