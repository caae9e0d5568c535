"""A scripted stand-in for the Engine, for the window's edge cases that a random tiny model cannot produce on
demand: a trace cut exactly at its budget, candidates with chosen verifier scores, a crash mid-stream.
It speaks the Engine's interface (stream / parallel / think_longer) and emits the same event types."""
from __future__ import annotations

import time

from core.events import Answer, Candidate, DoneEvent, GenerationStats, RouteDecision, TokenEvent
from core.voting import vote


class ScriptedCrash(RuntimeError):
    pass


def _stats(n: int) -> GenerationStats:
    return GenerationStats(prompt_tokens=12, completion_tokens=n, ttft_s=0.01, decode_tok_s=100.0, total_s=0.1,
                           kv_cache_bytes=1024, precision="w4", kv="int8")


class ScriptedEngine:
    model_id = "scripted"
    can_reason = True

    def __init__(self, crash_after: int | None = None, delay_s: float = 0.0):
        self.crash_after = crash_after
        self.delay_s = delay_s

    def stream(self, messages, sampling=None, *, mode="base", budget=256, cancel=None, **kw):
        route = RouteDecision(mode != "base", 0.87 if mode == "auto" else None, "switcher" if mode == "auto" else "mode")
        thinking, n = "", 0
        if route.reason:
            for k in range(budget):  # the model never closes its trace: the budget cuts it
                piece = f"step{k} "
                thinking += piece
                n += 1
                yield TokenEvent(piece, "thinking", k)
        answer = "Final answer: 42" if route.reason else ""
        if route.reason:
            yield TokenEvent(answer, "answer", n)
        for k, piece in enumerate(["The ", "answer ", "is ", "42."] if not route.reason else []):
            if self.crash_after is not None and k >= self.crash_after:
                raise ScriptedCrash("the model crashed mid-answer")
            if cancel is not None and cancel.is_set():
                break
            time.sleep(self.delay_s)
            answer += piece
            yield TokenEvent(piece, "answer", n + k)
        yield DoneEvent(Answer(answer, "stop", _stats(n + 4), self.model_id, (), thinking=thinking,
                               thinking_tokens=n, answer_tokens=4, budget=budget if route.reason else None,
                               budget_forced=route.reason, route=route, adapter="reason" if route.reason else None))

    def parallel(self, messages, sampling=None, *, n=4, cancel=None, **kw):
        finals, scores = ["42", "41", "42", "7"][:n], [0.9, 0.95, 0.6, 0.1][:n]
        cands = []
        for i, (a, s) in enumerate(zip(finals, scores, strict=True)):
            yield TokenEvent(f"t{i} ", "thinking", 0, i)
            yield TokenEvent(f"\\boxed{{{a}}}", "answer", 0, i)
            cands.append(Candidate(i, f"The answer is \\boxed{{{a}}}.", f"t{i} ", a, s, 1, 6, False, "stop"))
        result = vote(finals, scores, "weighted")
        best = cands[result.winner_index]
        yield DoneEvent(Answer(best.text, "stop", _stats(4 * n), self.model_id, (), thinking=best.thinking,
                               thinking_tokens=1, answer_tokens=6, budget=kw.get("budget"),
                               route=RouteDecision(True, None, "mode"), adapter="reason", candidates=tuple(cands),
                               vote_table=result.table, vote_method="weighted", chosen=result.winner_index))

    def think_longer(self, extra_budget=256, cancel=None):
        raise ValueError("there is no reasoning answer to continue")
