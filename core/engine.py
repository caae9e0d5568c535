"""The Engine: owns model, tokenizer, adapter, switcher and KV cache; streams answers token by token.

One request = one base-model prefill (adapter off), then segments decoded on that same cache: in base mode
an answer; in reasoning mode a `<think>` trace (adapter on) bounded by a token budget, then the answer. At
the budget the engine closes the trace itself and forces the answer. `think_longer` reopens the last trace
on its cache and continues it. Exactly one thread calls an Engine; cancellation is a `threading.Event`
checked every decode step. The engine knows nothing about files or Qt.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from . import adapters
from .cache import cache_bytes, crop, new_cache
from .chat_format import DEFAULT_SYSTEM, build_prompt_ids, stop_token_ids
from .config import SamplingConfig
from .decode import DecodeState, feed, run_segment, stop_token_index
from .events import Answer, DoneEvent, GenerationStats, RouteDecision, TokenEvent
from .prompts import reasoning_prompts, reasoning_system
from .sampling import make_generator

MODES = ("auto", "reason", "base")


class PromptTooLong(ValueError):
    """The conversation does not fit in the model's context window."""


@dataclass
class _Trace:
    """What `think_longer` needs from the last reasoning request."""

    state: DecodeState
    prompt_len: int
    think_end: int
    """Cache length where the trace's text ends (before `</think>`)."""
    thinking: str
    thinking_ids: list[int]
    budget: int | None
    answer_max_tokens: int
    route: RouteDecision
    started: float


class Engine:
    """One loaded model, ready to answer."""

    def __init__(self, model, tokenizer, *, model_id: str, precision: str = "bf16", kv: str = "bf16",
                 context: int = 8192, router=None, adapter_name: str | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.precision = precision
        self.kv = kv
        self.context = min(context, int(getattr(model.config, "max_position_embeddings", context)))
        self.eos_ids = stop_token_ids(tokenizer)
        self.router = router
        self.verifier = None
        """A core.verifier.Verifier scoring parallel answers, when one is loaded."""
        self.adapter_name = adapter_name if adapters.is_adapted(model) else None
        self.last_cache = None
        self._trace: _Trace | None = None
        p = reasoning_prompts()
        enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        self._think_open, self._think_close = enc(p["think_open"]), enc(p["think_close"])
        self._forced_prefix_text = p["forced_answer_prefix"]
        self._forced_prefix = enc(p["forced_answer_prefix"])
        self._wait = enc(p["think_longer"])
        self._close_marker = p["think_close_marker"]

    @property
    def can_reason(self) -> bool:
        return self.adapter_name is not None

    def prompt_ids(self, messages: Sequence[dict] | str, system: str | None = DEFAULT_SYSTEM) -> list[int]:
        return build_prompt_ids(self.tokenizer, messages, system=system)

    def _base(self):
        return adapters.base(self.model)

    def route(self, mode: str, hidden: torch.Tensor | None) -> RouteDecision:
        if mode == "reason":
            return RouteDecision(True, None, "mode")
        if mode == "base" or self.router is None:
            return RouteDecision(False, None, "mode" if mode == "base" else "no-switcher")
        t = time.perf_counter()
        prob = self.router.probability(hidden)
        return RouteDecision(prob >= self.router.threshold, prob, "switcher", time.perf_counter() - t)

    def open_prompt(self, ids: list[int], mode: str, cache) -> tuple[torch.Tensor, RouteDecision]:
        """The one base-model prefill every mode shares; returns the next-token logits and the route.

        When reasoning may follow, `<think>\n` is part of that prefill (base-encoded, like the rest of the
        prompt), so switching the adapter on afterwards re-encodes nothing: the first thinking token comes
        straight from the prefill's logits. If `auto` routes to the base model, the cache is cropped back to
        the prompt and the logits before `<think>` are used.
        """
        opener = self._think_open if mode != "base" else []
        with self._base(), torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids + opener]), cache=cache, use_cache=True,
                             logits_to_keep=len(opener) + 1, output_hidden_states=mode == "auto")
        hidden = out.hidden_states[-1][:, : len(ids)] if mode == "auto" else None
        decision = self.route(mode, hidden)
        if decision.reason:
            return out.logits[:, -1], decision
        if opener:
            crop(cache, len(ids))
        return out.logits[:, 0], decision

    def stream(self, messages: Sequence[dict] | str, sampling: SamplingConfig | None = None, *, mode: str = "base",
               budget: int | None = 256, answer_max_tokens: int = 256, cancel: threading.Event | None = None,
               system: str | None = DEFAULT_SYSTEM) -> Iterator[TokenEvent | DoneEvent]:
        """Yield TokenEvents (kind 'thinking' or 'answer') as text becomes final, then one DoneEvent.

        mode: 'base' answers directly; 'reason' thinks first (needs the adapter); 'auto' lets the switcher decide.
        budget: thinking tokens before the engine forces the answer (None = up to the context window).
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if mode != "base" and not self.can_reason:
            raise ValueError("reasoning needs the reasoning adapter, which is not loaded")
        cfg = sampling or SamplingConfig()
        start = time.perf_counter()
        sys_prompt = reasoning_system(budget, system or DEFAULT_SYSTEM) if mode != "base" else system
        ids = self.prompt_ids(messages, sys_prompt)
        if len(ids) >= self.context - 8:
            raise PromptTooLong(f"The conversation is {len(ids)} tokens; this model's window is {self.context}.")
        cache = new_cache(self.model.config, self.kv)
        self.last_cache = cache
        logits, decision = self.open_prompt(ids, mode, cache)
        state = DecodeState(self.model, cache, cfg, make_generator(cfg.seed), torch.tensor([ids]), self.eos_ids,
                            cancel, logits)
        if decision.reason:
            yield from self._reason(state, len(ids), decision, budget, answer_max_tokens, start, thinking_so_far="",
                                    thinking_ids=[])
            return
        room = self.context - len(ids)
        seg = yield from run_segment(state, self.tokenizer, limit=min(cfg.max_tokens, room), kind="answer",
                                     stop=cfg.stop, context=self._base)
        self._trace = None
        yield DoneEvent(self._answer(seg.text, seg.reason, seg.ids, len(ids), seg.first_token_at, start, cache,
                                     route=decision, answer_tokens=len(seg.ids)))

    def think_longer(self, extra_budget: int = 256, cancel: threading.Event | None = None
                     ) -> Iterator[TokenEvent | DoneEvent]:
        """Reopen the last reasoning trace on its cache, think up to `extra_budget` more tokens, answer again."""
        trace = self._trace
        if trace is None:
            raise ValueError("there is no reasoning answer to continue")
        state = trace.state
        state.cancel = cancel
        crop(state.cache, trace.think_end)
        with torch.inference_mode():
            state.logits = feed(self.model, self._wait, state.cache)
        wait_text = self.tokenizer.decode(self._wait)
        yield TokenEvent(wait_text, "thinking", state.n_tokens)
        yield from self._reason(state, trace.prompt_len, trace.route, extra_budget, trace.answer_max_tokens,
                                time.perf_counter(), thinking_so_far=trace.thinking + wait_text,
                                thinking_ids=trace.thinking_ids + self._wait,
                                total_budget=(trace.budget or 0) + extra_budget)

    def _reason(self, state: DecodeState, prompt_len: int, decision: RouteDecision, budget: int | None,
                answer_max_tokens: int, start: float, thinking_so_far: str, thinking_ids: list[int],
                total_budget: int | None = None):
        cache = state.cache
        think_start = cache.get_seq_length()
        room = self.context - think_start - len(self._think_close) - len(self._forced_prefix) - 2
        limit = max(1, min(budget or room, room - answer_max_tokens))
        think = yield from run_segment(state, self.tokenizer, limit=limit, kind="thinking", stop=(self._close_marker,))
        thinking_ids = thinking_ids + (think.ids[:-1] if think.hit_eos else think.ids)  # an eos is replaced by the close
        closed_by_model = think.stop_char is not None
        if closed_by_model:  # the model wrote </think> itself: continue after it
            think_end = think_start + stop_token_index(self.tokenizer, think.ids, think.stop_char)
            forced_ids = [think.pending]
        else:
            think_end = think_start + len(think.ids) - (1 if think.pending is None else 0)
            forced_ids = ([] if think.pending is None else [think.pending]) + self._think_close + self._forced_prefix
        thinking_text = thinking_so_far + think.text
        forced = not closed_by_model and think.reason != "cancelled"  # the engine closes the trace itself
        answer_text, answer_ids, reason = "", [], think.reason
        if think.reason != "cancelled":
            with torch.inference_mode():
                state.logits = feed(self.model, forced_ids, cache)
            if forced:
                yield TokenEvent(self._forced_prefix_text, "answer", state.n_tokens)
            cfg = state.cfg
            ans = yield from run_segment(state, self.tokenizer, limit=answer_max_tokens, kind="answer", stop=cfg.stop)
            answer_text = (self._forced_prefix_text if forced else "") + ans.text.lstrip("\n")
            answer_ids, reason = ans.ids, ans.reason
        self._trace = _Trace(state, prompt_len, think_end, thinking_text, thinking_ids, total_budget or budget,
                             answer_max_tokens, decision, start)
        yield DoneEvent(self._answer(
            answer_text, reason, thinking_ids + answer_ids, prompt_len, think.first_token_at, start, cache,
            route=decision, thinking=thinking_text, thinking_tokens=len(thinking_ids), answer_tokens=len(answer_ids),
            budget=total_budget or budget, budget_forced=forced and think.reason == "length"))

    def _answer(self, text, reason, out_ids, prompt_len, first_at, start, cache, **extra) -> Answer:
        end = time.perf_counter()
        first_at = first_at or end
        n = len(out_ids)
        stats = GenerationStats(
            prompt_tokens=prompt_len, completion_tokens=n, ttft_s=first_at - start,
            decode_tok_s=(n - 1) / (end - first_at) if n > 1 and end > first_at else 0.0,
            total_s=end - start, kv_cache_bytes=cache_bytes(cache), precision=self.precision, kv=self.kv,
        )
        adapter = self.adapter_name if extra.get("route") and extra["route"].reason else None
        return Answer(text, reason, stats, self.model_id, tuple(out_ids), adapter=adapter, **extra)

    def parallel(self, messages: Sequence[dict] | str, sampling: SamplingConfig | None = None, *, n: int = 4,
                 **kw) -> Iterator[TokenEvent | DoneEvent]:
        """N answers sampled from one prefill and voted on (see core.parallel)."""
        from .parallel import stream_parallel

        return stream_parallel(self, messages, sampling, n=n, **kw)

    def generate(self, messages: Sequence[dict] | str, sampling: SamplingConfig | None = None, **kw) -> Answer:
        """Run `stream` to the end and return the Answer."""
        return collect(self.stream(messages, sampling, **kw))


def collect(events: Iterator) -> Answer:
    for event in events:
        if isinstance(event, DoneEvent):
            return event.answer
    raise RuntimeError("stream ended without an answer")

