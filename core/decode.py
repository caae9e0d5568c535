"""The decode loop's small named pieces: `prefill`, `decode_step`, `feed`, `should_stop`, and `run_segment`,
which decodes one segment (thinking or answer) token by token and yields its text as it becomes final.

No adapter policy here: the caller passes the context (adapter on, or `adapters.base`) to run under.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from .config import SamplingConfig
from .events import TokenEvent
from .sampling import sample_next
from .text_stream import TextStream


@torch.inference_mode()
def prefill(model, input_ids: torch.Tensor, cache, want_hidden: bool = False):
    """Run the prompt (B, T) into `cache`. Returns (last logits (B, V), last-layer hidden states (B, T, H) or None)."""
    out = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1, output_hidden_states=want_hidden)
    hidden = out.hidden_states[-1] if want_hidden else None
    return out.logits[:, -1], hidden


@torch.inference_mode()
def decode_step(model, tokens: torch.Tensor, cache) -> torch.Tensor:
    """One token per row (B,) in, next-token logits (B, V) out; the cache grows by one position."""
    return model(input_ids=tokens.view(-1, 1), cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]


@torch.inference_mode()
def feed(model, ids: list[int], cache, batch: int = 1) -> torch.Tensor:
    """Append forced tokens (the same for every row) to the cache; return the next-token logits (B, V)."""
    x = torch.tensor([ids] * batch, dtype=torch.long)
    return model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]


def should_stop(token_id: int, n_generated: int, limit: int, eos_ids: set[int], text: TextStream,
                cancel: threading.Event | None, ignore_eos: bool = False) -> str | None:
    """Why the segment ends after this token, or None to go on."""
    if cancel is not None and cancel.is_set():
        return "cancelled"
    if token_id in eos_ids and not ignore_eos:
        return "stop"
    if text.stopped:
        return "stop"
    if n_generated >= limit:
        return "length"
    return None


@dataclass
class Segment:
    """What one decoded segment produced."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    reason: str = ""
    """'stop' (eos or stop string), 'length' (limit), 'cancelled'."""
    hit_eos: bool = False
    first_token_at: float | None = None
    pending: int | None = None
    """The last sampled token, not yet fed to the model (None when it was an end-of-turn token)."""
    stop_char: int | None = None
    """Where a stop string began in the segment's text, when one ended it."""


@dataclass
class DecodeState:
    """Shared across the segments of one request."""

    model: object
    cache: object
    cfg: SamplingConfig
    generator: torch.Generator
    seen: torch.Tensor
    eos_ids: set[int]
    cancel: threading.Event | None
    logits: torch.Tensor
    n_tokens: int = 0
    """Tokens generated so far in the request (all segments), for event indices."""


def run_segment(state: DecodeState, tokenizer, *, limit: int, kind: str, stop: tuple[str, ...] = (),
                context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                ) -> Iterator[TokenEvent]:
    """Sample up to `limit` tokens from `state.logits`, yielding TokenEvents of `kind`; the Segment is returned
    (as the generator's value). The final sampled token is left pending, not fed."""
    seg = Segment()
    text = TextStream(tokenizer, stop)
    cfg = state.cfg
    penalise = cfg.repetition_penalty != 1.0
    while True:
        token = sample_next(state.logits, cfg, state.generator, state.seen if penalise else None)
        tid = int(token[0])
        if seg.first_token_at is None:
            seg.first_token_at = time.perf_counter()
        seg.ids.append(tid)
        state.n_tokens += 1
        is_eos = tid in state.eos_ids and not cfg.ignore_eos
        if not is_eos:
            piece = text.push(tid)
            if piece:
                yield TokenEvent(piece, kind, state.n_tokens - 1)
        reason = should_stop(tid, len(seg.ids), limit, state.eos_ids, text, state.cancel, cfg.ignore_eos)
        if penalise:
            state.seen = torch.cat([state.seen, token.view(1, 1)], dim=1)
        if reason is not None:
            break
        with context():
            state.logits = decode_step(state.model, token, state.cache)
    tail = text.flush()
    if tail:
        yield TokenEvent(tail, kind, state.n_tokens - 1)
    seg.text, seg.reason, seg.hit_eos = text.text, reason, is_eos
    seg.pending = None if is_eos else tid
    if text.stopped:
        seg.stop_char = len(text.text)
    return seg


def stop_token_index(tokenizer, ids: list[int], char: int) -> int:
    """Index of the first token whose text reaches past character `char` (where a stop string began)."""
    for i in range(len(ids)):
        if len(tokenizer.decode(ids[: i + 1], skip_special_tokens=True)) > char:
            return i
    return len(ids)
