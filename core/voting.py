"""Final answers and votes: extract each stream's answer, normalise it, and combine N candidates.

Pure functions over text and scores. `\\boxed{}` wins over the last number; math-verify decides equality, so
"0.5", "\\frac{1}{2}" and "1/2" land in one bucket. An unparsable answer gets no vote.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_boxed(text: str) -> str | None:
    """Contents of the last \\boxed{...} / \\fbox{...}, braces matched."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i:j - 1].strip() if depth == 0 else None


def extract_answer(text: str) -> str | None:
    """The final answer of a response: the last \\boxed{}, else the last number; None if there is neither."""
    boxed = last_boxed(text)
    if boxed:
        return boxed
    numbers = NUMBER.findall(text)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def _parsed(answer: str):
    from math_verify import parse

    try:
        return parse(f"${answer}$") or parse(answer)
    except Exception:  # math-verify raises on odd LaTeX: treat as unparsable
        return []


def same_answer(a: str, b: str) -> bool:
    if a.strip() == b.strip():
        return True
    from math_verify import verify

    pa, pb = _parsed(a), _parsed(b)
    if not pa or not pb:
        return False
    try:
        return bool(verify(pa, pb))
    except Exception:
        return False


def is_correct(response_or_answer: str, gold: str) -> bool:
    """Does the response's final answer equal the gold answer (math-verify equivalence)?"""
    answer = extract_answer(response_or_answer)
    return answer is not None and same_answer(answer, gold.replace(",", ""))


@dataclass(frozen=True)
class Vote:
    winner: str | None
    winner_index: int | None
    """Index of the first candidate holding the winning answer (its text becomes the reply)."""
    table: tuple[tuple[str, float, int], ...]
    """(answer, summed weight, number of votes), best first."""
    method: str


def vote(answers: Sequence[str | None], weights: Sequence[float] | None = None, method: str = "weighted") -> Vote:
    """Weighted majority (argmax of summed verifier scores), plain majority, or best-of-N (highest score)."""
    if method not in ("weighted", "majority", "best"):
        raise ValueError("method must be weighted, majority or best")
    weights = list(weights) if weights is not None else [1.0] * len(answers)
    if len(weights) != len(answers):
        raise ValueError("one weight per answer")
    buckets: list[list] = []  # [representative answer, weight, count, first index]
    for i, (ans, w) in enumerate(zip(answers, weights, strict=True)):
        if ans is None:
            continue
        for b in buckets:
            if same_answer(b[0], ans):
                b[1] += w
                b[2] += 1
                break
        else:
            buckets.append([ans, w, 1, i])
    if not buckets:
        return Vote(None, None, (), method)
    if method == "best":
        best = max((i for i, a in enumerate(answers) if a is not None), key=lambda i: weights[i])
        bucket = next(b for b in buckets if same_answer(b[0], answers[best]))
        winner, index = bucket[0], best
    else:
        key = (lambda b: (b[2], b[1])) if method == "majority" else (lambda b: (b[1], b[2]))
        top = max(buckets, key=key)
        winner, index = top[0], top[3]
    table = tuple((b[0], round(b[1], 4), b[2]) for b in sorted(buckets, key=lambda b: (-b[1], -b[2])))
    return Vote(winner, index, table, method)
