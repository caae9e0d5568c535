"""Final answers, scoring and votes: extract each stream's answer, check it against a gold answer, combine N candidates.

Pure functions over text and scores. math-verify reads the whole response with its own LaTeX/expression extraction
(`\\boxed{}` first, then "final answer: ..." anchors, then the last expression) and decides equality, gold first:
`verify(gold, answer)`. The last number of a text counts only against a GSM8K-style integer gold, and only when
math-verify finds no answer at all. An unparsable answer gets no vote. Texts are read with a Unicode minus as "-"
and LaTeX digit-group separators (`10\\,000`, `10{,}000`) removed, which math-verify misreads (10·0).
"""
from __future__ import annotations

import ctypes
import logging
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
INTEGER = re.compile(r"-?\d+")
"""A GSM8K-style gold answer (commas already removed)."""
GROUP_SEPARATOR = re.compile(r"(?<=\d)(?:\\,|\\!|\\ |\{,\})(?=\d{3}(?!\d))")
"""LaTeX between digit groups: 10\\,000, 10{,}000, 10\\!000, 10\\ 000."""
SECONDS = 5
"""Time limit of one math-verify parse or comparison (comparing (x+y+z+1)^{60} with x^2+1 takes minutes)."""
LIMIT_BITS = 2**22
"""Largest number (in bits: 1.26 million digits) an answer may make sympy compute when compared: 10^{1000000}
passes, 9^{9^9} (1.2 billion bits) does not. Such a power or factorial is one C call that holds the GIL: no timer
and no other thread (the window's included) runs until it ends, and only the main thread's SIGALRM stops it."""


def _plain(text: str) -> str:
    """`text` with a Unicode minus (U+2212) as "-" and digit-group separators removed, before any reading."""
    return GROUP_SEPARATOR.sub("", text.replace("\u2212", "-"))


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
    """math-verify times out with SIGALRM, which works on the main thread only; worker threads use `_bounded`."""
    return SECONDS if threading.current_thread() is threading.main_thread() else None


class _Expired(BaseException):
    """Raised into a worker thread whose math-verify call ran past SECONDS (not an Exception: math-verify and
    sympy catch those)."""


def _bounded(call, default):
    """call(), or `default` when it runs past SECONDS. On a worker thread (the app and the server vote there) a
    timer raises `_Expired` into the thread at its next bytecode, as math-verify's SIGALRM does on the main one."""
    if threading.current_thread() is threading.main_thread():
        return call()
    target, lock, running = threading.get_ident(), threading.Lock(), [True]

    def expire() -> None:
        with lock:
            if running[0]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(_Expired))

    timer = threading.Timer(SECONDS, expire)
    timer.daemon = True
    try:
        timer.start()
        try:
            return call()
        finally:
            with lock:
                running[0] = False
            timer.cancel()
    except _Expired:  # raised inside call(), or just after it returned (then its result is given up too)
        return default


def _parse(text: str, *, gold: bool = False) -> list:
    """math-verify's extraction of `text` ([sympy object, source string], or [] when it finds nothing)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(), ExprExtractionConfig()]

    def read() -> list:
        try:
            if gold:  # a reference answer is bare LaTeX ("\\frac{1}{2}", "(3, \\pi)"): read it as one expression
                return parse(f"${text}$", config, parsing_timeout=_timeout()) or parse(text, config,
                                                                                      parsing_timeout=_timeout())
            return parse(text, config, parsing_timeout=_timeout())
        except Exception:  # math-verify raises on odd LaTeX: treat as unparsable
            return []

    return _bounded(read, [])


def _bits(e) -> float:
    """An upper bound on log2(1 + |x|) for the numbers x that evaluating the sympy expression `e` computes, a
    symbol or a float counting as one bit (inf when a number may pass 2^(2^64))."""
    from sympy import Add, Float, Mul, Pow, Rational, binomial, factorial

    if isinstance(e, Rational):
        return max(abs(int(e.p)), int(e.q)).bit_length()
    if isinstance(e, Float) or not e.args:
        return 1.0
    bits = [_bits(a) for a in e.args]
    if isinstance(e, Add):
        return max(bits) + len(bits)
    if isinstance(e, Mul):
        return sum(bits)
    if isinstance(e, Pow):  # |b^x| < 2^(bits(b)·2^bits(x))
        return math.inf if bits[1] > 64 else bits[0] * 2.0 ** bits[1]
    if isinstance(e, (factorial, binomial)):  # n! <= n^n, C(n, k) < 2^n
        n = bits[0]
        return math.inf if n > 64 else 2.0 ** n * (n if isinstance(e, factorial) else 1.0)
    return max(bits)


def _too_large(parsed: list) -> bool:
    from sympy import Basic

    try:
        return any(isinstance(x, Basic) and _bits(x) > LIMIT_BITS for x in parsed)
    except RecursionError:  # nested deeper than Python's stack
        return True
    except Exception:  # an object the bound does not know: compared as before, within the time limit
        return False


def _verify(gold: list, answer: list) -> bool:
    from math_verify import verify

    def check() -> bool:
        if _too_large(gold) or _too_large(answer):  # never compared: refused, as an unfinished comparison is
            return False
        try:
            return bool(gold and answer and verify(gold, answer, timeout_seconds=_timeout()))
        except Exception:
            return False

    return _bounded(check, False)


def extract_answer(text: str) -> str | None:
    """The final answer of a response as the scorer reads it: the last \\boxed{}, else math-verify's extraction,
    else the last number; None if there is none."""
    text = _plain(text)
    boxed = last_boxed(text)
    if boxed:
        return boxed
    parsed = _parse(text)
    if parsed and isinstance(parsed[-1], str) and parsed[-1].strip():
        return parsed[-1].strip().rstrip(".").strip()
    return last_number(text)


def same_answer(reference: str, answer: str) -> bool:
    """Do two extracted answers agree? `reference` (a vote bucket's first answer) is read as the gold."""
    reference, answer = _plain(reference), _plain(answer)
    if reference.strip() == answer.strip():
        return True
    return _verify(_parse(reference, gold=True), _parse(answer, gold=True))


def is_correct(response: str, gold: str) -> bool:
    """Is the response's answer the gold one? math-verify on the whole text, `verify(gold, answer)`; for an
    integer gold (GSM8K) a text in which math-verify finds no answer is judged by its last number."""
    gold, response = _plain(gold).strip(), _plain(response)
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
    score). Every tie goes to the earliest candidate and is reported. A weight that is not a finite number (a
    verifier fed an overflowed hidden state) counts as 0."""
    if method not in ("weighted", "majority", "best"):
        raise ValueError("method must be weighted, majority or best")
    weights = [1.0] * len(answers) if weights is None else [
        0.0 if isinstance(w, float) and not math.isfinite(w) else w for w in weights]
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
    level, head = {}, None  # values within rounding of each other (0.1 + 0.2 and 0.3) share a level
    for b in sorted(buckets, key=lambda b: -value(b)):
        if head is None or not _equal(value(b), head):
            head = value(b)
        level[id(b)] = head
    ranked = sorted(buckets, key=lambda b: (-level[id(b)], first(b)))
    leaders = [b for b in ranked if level[id(b)] == level[id(ranked[0])]]
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
