"""Reasoning traces kept in memory for "think longer": a reasoning answer asked for with a `trace_key` keeps its
cache, cropped to where its trace's text ends, so `think_longer` reopens the trace without re-encoding it; when
it is gone (a restart, another model, more than KEPT_TRACES later) the trace is rebuilt from the stored text:
the prompt and `<think>` by the base model, the thinking with the adapter on. A mixin of `core.engine.Engine`.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from core.config import SamplingConfig
from core.decode.cache import crop, new_cache
from core.decode.rows import Row, new_row
from core.events import DoneEvent, RouteDecision, TokenEvent
from core.prompting.chat_format import DEFAULT_SYSTEM, PromptTooLong

KEPT_TRACES = 4
"""Reasoning traces kept in memory for "think longer" (a few MB of KV cache each)."""


@dataclass
class KeptTrace:
    """A reasoning answer's cache and what `think_longer` needs to reopen its trace."""

    cache: object
    prompt_ids: list[int]
    think_end: int
    """Cache length where the trace's text ends (before `</think>`)."""
    thinking: str
    thinking_ids: list[int]
    budget: int | None


class TraceKeeping:
    """`think_longer` and the traces it continues (the Engine's `_traces`, most recent last)."""

    def think_longer(self, messages: Sequence[dict] | str, thinking: str, *, trace_key: str | None = None,
                     new_trace_key: str | None = None, extra_budget: int = 256, budget: int | None = None,
                     answer_max_tokens: int = 256, sampling: SamplingConfig | None = None,
                     system: str | None = DEFAULT_SYSTEM, cancel: threading.Event | None = None
                     ) -> Iterator[TokenEvent | DoneEvent]:
        """Reopen a reasoning answer's trace, think up to `extra_budget` more tokens, answer again.

        messages: the conversation up to the question (not the reply); thinking: the reply's trace; budget: the
        budget it was asked with. The trace kept under `trace_key` is continued on its cache when it matches;
        otherwise the trace is rebuilt by prefilling the prompt (base) and the thinking text (adapter on).
        The new trace is kept under `new_trace_key`. The Answer's `resumed` says which ('cache' or 'text').
        """
        self._check("reason")
        if extra_budget < 1:
            raise ValueError("extra_budget must be >= 1")
        cfg = sampling or SamplingConfig()
        start = time.perf_counter()
        ids = self._prompt(messages, "reason", budget, system)
        trace = self._traces.get(trace_key) if trace_key is not None else None
        if trace is not None and trace.prompt_ids == ids and trace.thinking == thinking:
            cache, think_end, thinking_ids, resumed = trace.cache, trace.think_end, trace.thinking_ids, "cache"
            crop(cache, think_end)
            del self._traces[trace_key]  # the cache now belongs to the continuation
        else:
            cache, thinking_ids = self._rebuild(ids, thinking)
            think_end, resumed = cache.get_seq_length(), "text"
        self.last_cache = cache
        opener = list(self.markers.think_longer)
        think_limit, answer_limit = self._limits(think_end + len(opener), True, extra_budget, answer_max_tokens, cfg)
        row = new_row(0, self.tokenizer, self.markers, cfg, reasoning=True, think_limit=think_limit,
                      answer_limit=answer_limit, seen=ids + thinking_ids, pending=opener)
        row.thinking_before = len(thinking_ids) + len(opener)
        yield TokenEvent(self.markers.think_longer_text, "thinking", row.thinking_before - 1)
        yield from self._decode(cache, None, [row], cfg, True, cancel)
        prior, prior_ids = thinking + self.markers.think_longer_text, thinking_ids + opener
        total_budget = len(prior_ids) + extra_budget  # the trace so far (its tokens as now encoded) plus the extra
        answer = self._answer(row, ids, RouteDecision(True, None, "mode"), total_budget, start, cache, prior=prior,
                              prior_ids=prior_ids, resumed=resumed)
        if new_trace_key is not None:
            self._keep_row(new_trace_key, row, cache, ids, think_end, budget, prior, prior_ids)
        yield DoneEvent(answer)

    def _rebuild(self, ids: list[int], thinking: str) -> tuple[object, list[int]]:
        """A trace's cache from its text: the prompt and `<think>` by the base model, the trace with the adapter."""
        thinking_ids = self.tokenizer(thinking, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if len(ids) + len(thinking_ids) + 64 >= self.context:
            raise PromptTooLong("The conversation and its thinking no longer fit in this model's window.")
        cache = new_cache(self.model.config, self.kv)
        with self._scoring(cache):
            with self._base(), torch.inference_mode():
                self.model(input_ids=torch.tensor([ids + list(self.markers.think_open)]), cache=cache,
                           use_cache=True, logits_to_keep=1)
            if thinking_ids:
                with self._using(self.slots.reasoning), torch.inference_mode():
                    self.model(input_ids=torch.tensor([thinking_ids]), cache=cache, use_cache=True, logits_to_keep=1)
        return cache, thinking_ids

    def _keep_row(self, key: str, row: Row, cache, ids: list[int], start_len: int, budget: int | None,
                  prior: str = "", prior_ids: Sequence[int] = ()) -> None:
        """Keep a finished reasoning row's trace for `think_longer`: its cache cropped to where the trace's text
        ends. Not kept when the row was cancelled mid-trace or its cache does not end exactly at that text."""
        if row.think_end is None or not row.trace_exact:
            self._traces.pop(key, None)
            return
        end = start_len + row.think_end
        crop(cache, end)
        trace_ids = list(prior_ids) + row.thinking_ids[: row.think_end - row.think_offset]
        self._keep(key, KeptTrace(cache, ids, end, prior + row.think.text, trace_ids, budget))

    def _keep(self, key: str, trace: KeptTrace) -> None:
        self._traces.pop(key, None)
        self._traces[key] = trace
        while len(self._traces) > KEPT_TRACES:
            self._traces.popitem(last=False)

    def has_trace(self, key: str) -> bool:
        """Whether a trace is in memory under `key` (think longer then needs no re-prefill)."""
        return key in self._traces
