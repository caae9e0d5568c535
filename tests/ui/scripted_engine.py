"""A scripted stand-in for the Engine, for the window's edge cases that a random tiny model cannot produce on
demand: a trace cut exactly at its budget, candidates with chosen verifier scores, a tied vote, a crash
mid-stream, "think longer" on a kept trace or after a restart. It speaks the Engine's interface (stream /
parallel / think_longer with trace keys), emits the same event types, and records every call in `calls`."""
from __future__ import annotations

import time
from collections import OrderedDict

from core.events import Answer, Candidate, DoneEvent, GenerationStats, RouteDecision, TokenEvent
from core.reasoning.voting import vote

KEPT_TRACES = 4


class ScriptedCrash(RuntimeError):
    pass


def _stats(n: int) -> GenerationStats:
    return GenerationStats(prompt_tokens=12, completion_tokens=n, ttft_s=0.01, decode_tok_s=100.0, total_s=0.1,
                           kv_cache_bytes=1024, precision="w4", kv="int8")


class ScriptedEngine:
    model_id = "scripted"

    def __init__(self, crash_after: int | None = None, delay_s: float = 0.0, *, can_reason: bool = True,
                 finals=("42", "41", "42", "7"), scores=(0.9, 0.95, 0.6, 0.1), method: str = "weighted",
                 think_error: Exception | None = None, think_crash_after: int | None = None):
        self.crash_after = crash_after
        self.delay_s = delay_s
        self.can_reason = can_reason
        self.finals, self.scores, self.method = list(finals), list(scores), method
        self.think_error = think_error
        """Raised by think_longer before it yields anything."""
        self.think_crash_after = think_crash_after
        """think_longer raises after this many continuation tokens."""
        self.calls: list[tuple[str, dict]] = []
        self.traces: OrderedDict[str, tuple] = OrderedDict()
        """trace key -> (messages, thinking) of the reasoning answers kept "in memory"."""

    def _keep(self, key: str | None, messages, thinking: str) -> None:
        if key is None:
            return
        self.traces[key] = (list(messages), thinking)
        self.traces.move_to_end(key)
        while len(self.traces) > KEPT_TRACES:
            self.traces.popitem(last=False)

    def stream(self, messages, sampling=None, *, mode="base", budget=256, answer_max_tokens=256, cancel=None,
               system=None, trace_key=None):
        self.calls.append(("stream", {"messages": list(messages), "mode": mode, "budget": budget,
                                      "trace_key": trace_key}))
        if mode != "base" and not self.can_reason:
            raise ValueError("reasoning needs the reasoning adapter, which is not loaded")
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
        if route.reason:
            self._keep(trace_key, messages, thinking)
        yield DoneEvent(Answer(answer, "stop", _stats(n + 4), self.model_id, (), thinking=thinking,
                               thinking_tokens=n, answer_tokens=4, budget=budget if route.reason else None,
                               budget_forced=route.reason, route=route, adapter="reason" if route.reason else None))

    def parallel(self, messages, sampling=None, *, n=4, mode="reason", budget=256, answer_max_tokens=256,
                 cancel=None, system=None):
        self.calls.append(("parallel", {"messages": list(messages), "n": n, "mode": mode, "budget": budget}))
        finals, scores = self.finals[:n], self.scores[:n]
        cands = []
        for i, (a, s) in enumerate(zip(finals, scores, strict=True)):
            yield TokenEvent(f"t{i} ", "thinking", 0, i)
            yield TokenEvent(f"\\boxed{{{a}}}", "answer", 0, i)
            cands.append(Candidate(i, f"The answer is \\boxed{{{a}}}.", f"t{i} ", a, s, 1, 6, False, "stop"))
        result = vote(finals, scores, self.method)
        best = cands[result.winner_index]
        yield DoneEvent(Answer(best.text, "stop", _stats(4 * n), self.model_id, (), thinking=best.thinking,
                               thinking_tokens=1, answer_tokens=6, budget=budget,
                               route=RouteDecision(True, None, "mode"), adapter="reason", candidates=tuple(cands),
                               vote_table=result.table, vote_method=self.method, chosen=result.winner_index,
                               vote_tie=result.tie))

    def think_longer(self, messages, thinking: str, *, trace_key=None, new_trace_key=None, extra_budget=256,
                     budget=None, answer_max_tokens=256, sampling=None, system=None, cancel=None):
        messages = list(messages)
        resumed = "cache" if self.traces.get(trace_key) == (messages, thinking) else "text"
        self.calls.append(("think_longer", {"messages": messages, "thinking": thinking, "trace_key": trace_key,
                                            "new_trace_key": new_trace_key, "extra_budget": extra_budget,
                                            "budget": budget, "resumed": resumed}))
        if not self.can_reason:
            raise ValueError("reasoning needs the reasoning adapter, which is not loaded")
        if self.think_error is not None:
            raise self.think_error
        from core.prompting.prompts import reasoning_prompts

        opener = reasoning_prompts()["think_longer"]  # streamed first, as the engine does
        yield TokenEvent(opener, "thinking", len(thinking.split()))
        more, finish, before = "", "stop", len(thinking.split()) + 1
        for k in range(extra_budget):
            if self.think_crash_after is not None and k >= self.think_crash_after:
                raise ScriptedCrash("the model crashed while thinking longer")
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            time.sleep(self.delay_s)
            piece = f"more{k} "
            more += piece
            yield TokenEvent(piece, "thinking", before + k)  # positions continue the trace's, as the engine's
        answer = "" if finish == "cancelled" else f"Final answer: 43 (after {len(more.split())} more steps)"
        if answer:
            yield TokenEvent(answer, "answer", extra_budget)
        whole = thinking + opener + more
        self._keep(new_trace_key, messages, whole)
        total = (budget or 0) + extra_budget
        yield DoneEvent(Answer(answer, finish, _stats(len(more.split()) + 1), self.model_id, (), thinking=whole,
                               thinking_tokens=len(whole.split()), answer_tokens=1, budget=total,
                               route=RouteDecision(True, None, "mode"), adapter="reason", resumed=resumed))
