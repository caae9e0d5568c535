"""Final answers, scoring and votes: extract each stream's answer, check it against a gold answer, combine N candidates.

Pure functions over text and scores. math-verify reads the whole response with its own LaTeX/expression extraction
(`\\boxed{}` first, then "final answer: ..." anchors, then the last expression) and decides equality, gold first:
`verify(gold, answer)`. The last number of a text counts only against a GSM8K-style integer gold, and only when
math-verify finds no answer at all. An unparsable answer gets no vote.
"""
from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
INTEGER = re.compile(r"-?\d+")
"""A GSM8K-style gold answer (commas already removed)."""


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


def last_number(text: str) -> str | None:
    numbers = NUMBER.findall(text)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


class _NoTimeoutNotice(logging.Filter):
    """math-verify warns once that it runs without a time limit; off the main thread that is this module's choice
    (SIGALRM cannot work there), not something a user of `ponder ask` should read on stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoTimeoutNotice())


def _timeout() -> int | None:
    """math-verify times out with SIGALRM, which works on the main thread only; worker threads go without."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def _parse(text: str, *, gold: bool = False) -> list:
    """math-verify's extraction of `text` ([sympy object, source string], or [] when it finds nothing)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    try:
        if gold:  # a reference answer is bare LaTeX ("\\frac{1}{2}", "(3, \\pi)"): read it as one expression
            return parse(f"${text}$", config, parsing_timeout=_timeout()) or parse(text, config,
                                                                                  parsing_timeout=_timeout())
        return parse(text, config, parsing_timeout=_timeout())
    except Exception:  # math-verify raises on odd LaTeX: treat as unparsable
        return []


def _verify(gold: list, answer: list) -> bool:
    from math_verify import verify

    try:
        return bool(gold and answer and verify(gold, answer, timeout_seconds=_timeout()))
    except Exception:
        return False


def extract_answer(text: str) -> str | None:
    """The final answer of a response as the scorer reads it: the last \\boxed{}, else math-verify's extraction,
    else the last number; None if there is none."""
    boxed = last_boxed(text)
    if boxed:
        return boxed
    parsed = _parse(text)
    if parsed and isinstance(parsed[-1], str) and parsed[-1].strip():
        return parsed[-1].strip().rstrip(".").strip()
    return last_number(text)


def same_answer(reference: str, answer: str) -> bool:
    """Do two extracted answers agree? `reference` (a vote bucket's first answer) is read as the gold."""
    if reference.strip() == answer.strip():
        return True
    return _verify(_parse(reference, gold=True), _parse(answer, gold=True))


def is_correct(response: str, gold: str) -> bool:
    """Is the response's answer the gold one? math-verify on the whole text, `verify(gold, answer)`; for an
    integer gold (GSM8K) a text in which math-verify finds no answer is judged by its last number."""
    gold = gold.strip()
    integer_gold = INTEGER.fullmatch(gold.replace(",", "")) is not None
    answer = _parse(response)
    if answer:
        return _verify(_parse(gold.replace(",", "") if integer_gold else gold, gold=True), answer)
    number = last_number(response) if integer_gold else None
    return number is not None and _verify(_parse(gold.replace(",", ""), gold=True), _parse(number, gold=True))


@dataclass(frozen=True)
class Vote:
    winner: str | None
    winner_index: int | None
    """Index of the first candidate holding the winning answer (its text becomes the reply)."""
    table: tuple[tuple[str, float, int], ...]
    """(answer, summed weight, number of votes), best first by the method's key, then first seen."""
    method: str
    tie: bool = False
    """Several answers shared the top: the earliest candidate's answer won."""
    tied: tuple[str, ...] = ()
    """The answers sharing the top (in order of first appearance) when `tie`; else empty."""


def _equal(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def vote(answers: Sequence[str | None], weights: Sequence[float] | None = None, method: str = "weighted") -> Vote:
    """Plain majority (most votes), weighted majority (largest summed verifier score) or best-of-N (highest single
    score). Every tie goes to the earliest candidate and is reported."""
    if method not in ("weighted", "majority", "best"):
        raise ValueError("method must be weighted, majority or best")
    weights = list(weights) if weights is not None else [1.0] * len(answers)
    if len(weights) != len(answers):
        raise ValueError("one weight per answer")
    buckets: list[list] = []  # [answer, summed weight, votes, first index, best single weight, its first index]
    for i, (ans, w) in enumerate(zip(answers, weights, strict=True)):
        if ans is None:
            continue
        for b in buckets:
            if same_answer(b[0], ans):
                b[1] += w
                b[2] += 1
                if w > b[4] and not _equal(w, b[4]):
                    b[4], b[5] = w, i
                break
        else:
            buckets.append([ans, w, 1, i, w, i])
    if not buckets:
        return Vote(None, None, (), method)
    if method == "best":  # the reply is the highest-scored candidate itself, not its bucket's first member
        value, first = (lambda b: b[4]), (lambda b: b[5])
    else:
        value, first = ((lambda b: b[2]) if method == "majority" else (lambda b: b[1])), (lambda b: b[3])
    top = max(value(b) for b in buckets)
    leaders = sorted((b for b in buckets if _equal(value(b), top)), key=first)
    ranked = sorted(buckets, key=lambda b: (-value(b), first(b)))
    table = tuple((b[0], round(b[1], 4), b[2]) for b in ranked)
    tie = len(leaders) > 1
    return Vote(leaders[0][0], first(leaders[0]), table, method, tie, tuple(b[0] for b in leaders) if tie else ())


METHODS = ("weighted", "majority", "best")


def score_candidates(candidates: list[dict], gold: str) -> dict:
    """Per-question fields of a parallel answer from its candidates ({"answer", "score", "text", ...}): each
    candidate's correctness (from its full text), each method's pick and correctness, ties, and pass@N."""
    rows = [{**c, "correct": is_correct(c["text"], gold)} for c in candidates]
    out: dict = {"candidates": rows, "pass_at_n": any(c["correct"] for c in rows)}
    scores = [1.0 if c["score"] is None else c["score"] for c in rows]
    for method in METHODS:
        v = vote([c["answer"] for c in rows], scores, method)
        out[f"correct_{method}"] = v.winner_index is not None and rows[v.winner_index]["correct"]
        out[f"tie_{method}"] = v.tie
    return out
