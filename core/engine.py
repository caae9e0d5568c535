"""The Engine: owns model, tokenizer and KV cache, and streams answers token by token.

The decode loop is built from small named functions (`prefill`, `decode_step`, `sample_next`, `should_stop`)
so later features plug in at the seams: the switcher reads the prefill state, adapters switch between
segments, parallel streams fork the cache. Exactly one thread calls an Engine; cancellation is a
`threading.Event` checked every decode step. The engine knows nothing about files or Qt.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import torch

from .cache import cache_bytes, new_cache
from .chat_format import DEFAULT_SYSTEM, build_prompt_ids, stop_token_ids
from .config import SamplingConfig
from .events import Answer, DoneEvent, GenerationStats, TokenEvent
from .sampling import make_generator, sample_next
from .text_stream import TextStream


class PromptTooLong(ValueError):
    """The conversation does not fit in the model's context window."""


@torch.inference_mode()
def prefill(model, input_ids: torch.Tensor, cache) -> torch.Tensor:
    """Run the prompt (B, T) through the model into `cache`; return the last position's logits (B, V)."""
    return model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]


@torch.inference_mode()
def decode_step(model, tokens: torch.Tensor, cache) -> torch.Tensor:
    """One token per row (B,) in, next-token logits (B, V) out; the cache grows by one position."""
    return model(input_ids=tokens.view(-1, 1), cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]


def should_stop(token_id: int, n_generated: int, cfg: SamplingConfig, eos_ids: set[int], text: TextStream,
                cancel: threading.Event | None) -> str | None:
    """Why generation ends after this token, or None to go on."""
    if cancel is not None and cancel.is_set():
        return "cancelled"
    if token_id in eos_ids and not cfg.ignore_eos:
        return "stop"
    if text.stopped:
        return "stop"
    if n_generated >= cfg.max_tokens:
        return "length"
    return None


class Engine:
    """One loaded model, ready to answer."""

    def __init__(self, model, tokenizer, *, model_id: str, precision: str = "bf16", kv: str = "bf16",
                 context: int = 8192):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.precision = precision
        self.kv = kv
        self.context = min(context, int(getattr(model.config, "max_position_embeddings", context)))
        self.eos_ids = stop_token_ids(tokenizer)
        self.last_cache = None

    def prompt_ids(self, messages: Sequence[dict] | str, system: str | None = DEFAULT_SYSTEM) -> list[int]:
        return build_prompt_ids(self.tokenizer, messages, system=system)

    def stream(self, messages: Sequence[dict] | str, sampling: SamplingConfig | None = None, *,
               cancel: threading.Event | None = None, system: str | None = DEFAULT_SYSTEM,
               ) -> Iterator[TokenEvent | DoneEvent]:
        """Yield TokenEvents as text becomes final, then one DoneEvent with the Answer and its stats."""
        cfg = sampling or SamplingConfig()
        start = time.perf_counter()
        ids = self.prompt_ids(messages, system)
        if len(ids) >= self.context:
            raise PromptTooLong(f"The conversation is {len(ids)} tokens; this model's window is {self.context}.")
        budget = min(cfg.max_tokens, self.context - len(ids))
        cfg_eff = cfg if budget == cfg.max_tokens else SamplingConfig(**{**cfg.__dict__, "max_tokens": budget})
        generator = make_generator(cfg.seed)
        cache = new_cache(self.model.config, self.kv)
        self.last_cache = cache
        seen = torch.tensor([ids], dtype=torch.long)
        logits = prefill(self.model, seen, cache)
        text = TextStream(self.tokenizer, cfg.stop)
        out_ids: list[int] = []
        first_at = None
        reason = None
        while reason is None:
            token = sample_next(logits, cfg_eff, generator, seen if cfg.repetition_penalty != 1.0 else None)
            tid = int(token[0])
            if first_at is None:
                first_at = time.perf_counter()
            out_ids.append(tid)
            if tid not in self.eos_ids or cfg.ignore_eos:
                piece = text.push(tid)
                if piece:
                    yield TokenEvent(piece, "answer", len(out_ids) - 1)
            reason = should_stop(tid, len(out_ids), cfg_eff, self.eos_ids, text, cancel)
            if reason is None:
                if cfg.repetition_penalty != 1.0:
                    seen = torch.cat([seen, token.view(1, 1)], dim=1)
                logits = decode_step(self.model, token, cache)
        tail = text.flush()
        if tail:
            yield TokenEvent(tail, "answer", len(out_ids) - 1)
        end = time.perf_counter()
        n = len(out_ids)
        stats = GenerationStats(
            prompt_tokens=len(ids), completion_tokens=n, ttft_s=first_at - start,
            decode_tok_s=(n - 1) / (end - first_at) if n > 1 and end > first_at else 0.0,
            total_s=end - start, kv_cache_bytes=cache_bytes(cache), precision=self.precision, kv=self.kv,
        )
        yield DoneEvent(Answer(text.text, reason, stats, self.model_id, tuple(out_ids)))

    def generate(self, messages: Sequence[dict] | str, sampling: SamplingConfig | None = None, **kw) -> Answer:
        """Run `stream` to the end and return the Answer."""
        for event in self.stream(messages, sampling, **kw):
            if isinstance(event, DoneEvent):
                return event.answer
        raise RuntimeError("stream ended without an answer")
