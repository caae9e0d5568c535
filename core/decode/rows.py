"""The one decode loop: rows with phases, decoded together as one batch.

A row is one answer in progress and walks `thinking → answer → verify → done`:
- thinking: the adapter's `<think>` trace, up to the row's budget. When the model writes `</think>` the answer
  follows; at the budget (or an end-of-turn inside the trace) the engine closes the trace itself by feeding
  `</think>` and `Final answer: ` (the forced close).
- answer: up to the row's answer limit, an end-of-turn token or a stop string.
- verify: with a verifier, the verification prompt is fed and the hidden state of its last token is scored.

Tokens a row must feed before it samples again (the token just sampled, a forced close, the verification
prompt, the "think longer" opener) wait in `row.pending`; each step feeds the same number of pending tokens
from every row (all of them for a single row), so rows stay in lockstep and one forward pass serves them all.
Finished rows leave the batch. `Engine.stream` runs one row, `Engine.parallel` N rows forked from one
prefill, `Engine.generate_batch` K different prompts left-padded into one prefill. Like nanochat's
`Engine.generate`, every mode is the same loop with a different number of rows.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from core.config import SamplingConfig
from core.decode.sampling import pick_logprobs, sample_next
from core.decode.text_stream import TextStream
from core.events import PhaseEvent, TokenEvent
from core.prompting.markers import ReasoningMarkers

PHASES = ("thinking", "answer", "verify", "done")


@dataclass
class Row:
    """One answer in progress."""

    index: int
    """Stream index reported in TokenEvents (0 for a single answer)."""
    phase: str
    think: TextStream
    answer: TextStream
    think_limit: int
    """Thinking tokens this row may sample before the engine closes the trace."""
    answer_limit: int
    verify: bool = False
    pending: list[int] = field(default_factory=list)
    """Tokens to feed to the model before this row samples again."""
    thinking_ids: list[int] = field(default_factory=list)
    answer_ids: list[int] = field(default_factory=list)
    """Sampled answer tokens, an end-of-turn token included."""
    seen: list[int] | None = None
    """Token ids the repetition penalty looks at (prompt + sampled); None when the penalty is off."""
    forced: bool = False
    """The engine closed the trace (budget reached, or an end-of-turn token inside it)."""
    budget_hit: bool = False
    finish: str = ""
    """'stop' (end of turn or stop string), 'length' (answer limit) or 'cancelled'."""
    score: float | None = None
    fed: int = 0
    """Tokens this row fed to the model since the loop started."""
    think_offset: int = 0
    """Tokens fed before the first sampled thinking token (the "think longer" opener)."""
    think_end: int | None = None
    """Tokens fed, counted from the loop's start, up to where the trace's text ends (before `</think>`)."""
    trace_exact: bool = True
    """The cache up to `think_end` holds exactly the trace's text (see `_Step._thinking`)."""
    thinking_before: int = 0
    """Thinking tokens of an earlier part of this trace (think longer), for event indices."""
    first_token_at: float | None = None

    reasoning: bool = False
    """The row began with a thinking trace."""
    logprobs: list[float] | None = None
    """With `new_row(logprobs=...)`: each kept token's log-probability, one per entry of `thinking_ids +
    answer_ids`; under the distribution it was drawn from ('sampling': penalty and temperature applied, before
    top-k/top-p — RL's importance weights) or the model's own ('model': the raw logits — a candidate's confidence,
    comparable across sampling settings)."""
    logprob_kind: str = "sampling"

    def keep(self, ids: list[int], t: int, logprob: float | None) -> None:
        """Append a sampled token to `ids` (the row's thinking or answer ids) and its log-prob when recorded."""
        ids.append(t)
        if self.logprobs is not None:
            self.logprobs.append(logprob)

    def answer_text(self, markers: ReasoningMarkers) -> str:
        if not self.reasoning:
            return self.answer.text
        return (markers.forced_prefix_text if self.forced else "") + self.answer.text.lstrip("\n")


def new_row(index: int, tokenizer, markers: ReasoningMarkers, cfg: SamplingConfig, *, reasoning: bool,
            think_limit: int, answer_limit: int, verify: bool = False, seen: list[int] | None = None,
            pending: list[int] | None = None, logprobs: str | None = None) -> Row:
    """A row that starts thinking (reasoning) or answering (base), sampling from the prefill's logits;
    `logprobs` ('sampling' or 'model', see `Row.logprobs`) records each sampled token's log-probability."""
    if logprobs not in (None, "sampling", "model"):
        raise ValueError("logprobs must be None, 'sampling' or 'model'")
    pending = list(pending or [])
    return Row(index, "thinking" if reasoning else "answer", TextStream(tokenizer, (markers.close_marker,)),
               TextStream(tokenizer, cfg.stop), think_limit=think_limit, answer_limit=answer_limit, verify=verify,
               pending=pending, think_offset=len(pending), reasoning=reasoning,
               seen=list(seen or []) if cfg.repetition_penalty != 1.0 else None, logprobs=[] if logprobs else None,
               logprob_kind=logprobs or "sampling")


def stop_token_index(tokenizer, ids: list[int], char: int) -> int:
    """Index of the first token whose text reaches past character `char` (where a stop string began)."""
    for i in range(len(ids)):
        if len(tokenizer.decode(ids[: i + 1], skip_special_tokens=True)) > char:
            return i
    return len(ids)


class _Step:
    """Turns one sampled token of a row into events, a phase change and tokens to feed."""

    def __init__(self, tokenizer, markers: ReasoningMarkers, eos_ids: set[int], cfg: SamplingConfig):
        self.tokenizer, self.markers, self.eos_ids, self.cfg = tokenizer, markers, eos_ids, cfg

    def take(self, row: Row, t: int, logprob: float | None = None) -> Iterator[TokenEvent]:
        if row.first_token_at is None:
            row.first_token_at = time.perf_counter()
        if row.seen is not None:
            row.seen.append(t)
        is_eos = t in self.eos_ids and not self.cfg.ignore_eos
        if row.phase == "thinking":
            yield from self._thinking(row, t, is_eos, logprob)
        else:
            yield from self._answer(row, t, is_eos, logprob)

    def _event(self, row: Row, text: str, kind: str) -> TokenEvent:
        n = row.thinking_before + len(row.thinking_ids) + len(row.answer_ids)
        return TokenEvent(text, kind, max(0, n - 1), row.index)

    def _thinking(self, row: Row, t: int, is_eos: bool, logprob: float | None) -> Iterator[TokenEvent]:
        if not is_eos:
            row.keep(row.thinking_ids, t, logprob)
            piece = row.think.push(t)
            if piece:
                yield self._event(row, piece, "thinking")
        if row.think.stopped:  # the model wrote </think> itself: the answer follows
            cut = stop_token_index(self.tokenizer, row.thinking_ids, len(row.think.text))
            row.think_end = row.think_offset + cut
            # a token like ".</" holds the trace's last characters and the marker's start: the cache then ends
            # before text the trace shows, and a continuation must be rebuilt from the text instead
            row.trace_exact = self.tokenizer.decode(row.thinking_ids[:cut], skip_special_tokens=True) == row.think.text
            row.phase, row.pending = "answer", [t]
            return
        if is_eos or len(row.thinking_ids) >= row.think_limit:  # the engine closes the trace
            tail = row.think.flush()
            if tail:
                yield self._event(row, tail, "thinking")
            row.forced, row.budget_hit = True, not is_eos
            row.think_end = row.fed + (0 if is_eos else 1)
            row.pending = ([] if is_eos else [t]) + list(self.markers.forced_close)
            row.phase = "answer"
            yield self._event(row, self.markers.forced_prefix_text, "answer")
            return
        row.pending = [t]

    def _answer(self, row: Row, t: int, is_eos: bool, logprob: float | None) -> Iterator[TokenEvent]:
        row.keep(row.answer_ids, t, logprob)
        if is_eos:
            finish, feed = "stop", []
        else:
            piece = row.answer.push(t)
            if piece:
                yield self._event(row, piece, "answer")
            if row.answer.stopped:
                finish = "stop"
            elif len(row.answer_ids) >= row.answer_limit:
                finish = "length"
            else:
                row.pending = [t]
                return
            feed = [t]
        tail = row.answer.flush()
        if tail:
            yield self._event(row, tail, "answer")
        row.finish = finish
        if row.verify:
            row.phase, row.pending = "verify", feed + list(self.markers.verify)
        else:
            row.phase = "done"


def _penalty_context(rows: list[Row]) -> torch.Tensor | None:
    """(B, S) ids for the repetition penalty, each row padded with its own first id (a no-op duplicate)."""
    if rows[0].seen is None:
        return None
    width = max(len(r.seen) for r in rows)
    if width == 0:
        return None
    return torch.tensor([r.seen + [r.seen[0] if r.seen else 0] * (width - len(r.seen)) for r in rows])


def decode_rows(model, cache, logits: torch.Tensor | None, rows: list[Row], *, tokenizer,
                markers: ReasoningMarkers, eos_ids: set[int], cfg: SamplingConfig, generator: torch.Generator,
                adapter: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                cancel: threading.Event | None = None, verifier=None, mask: torch.Tensor | None = None,
                next_pos: torch.Tensor | None = None, fused=None) -> Iterator[TokenEvent | PhaseEvent]:
    """Decode `rows` (batch order = cache rows) to the end, yielding TokenEvents as text becomes final (and, with
    several rows, a PhaseEvent when a row starts verifying or is done).

    logits: (B, V) next-token logits after the prefill (None when every row starts with pending tokens).
    adapter: context to run decode steps under (the adapter on, or `adapters.base` for base answers).
    mask, next_pos: attention mask (B, L) and next positions (B,) for left-padded prompts; None otherwise.
    fused: a core.decode.fused.FusedDecoder for the steps it takes (one token per row, no mask, no scoring),
    given only when `adapter` runs the base model; None: every step goes through `model`.
    Rows are updated in place: phase, text, token ids, finish reason, verifier score, where the trace ends.
    """
    step = _Step(tokenizer, markers, eos_ids, cfg)
    active = list(rows)
    told = {row.index: row.phase for row in rows} if len(rows) > 1 else None
    while active:
        if cancel is not None and cancel.is_set():
            for row in active:
                for stream, kind in ((row.think, "thinking"), (row.answer, "answer")):
                    tail = stream.flush()
                    if tail:
                        yield TokenEvent(tail, kind, 0, row.index)
                row.phase, row.finish = "done", "cancelled"
            return
        need = [pos for pos, row in enumerate(active) if not row.pending and row.phase != "done"]
        if need:
            scores = logits if len(need) == len(active) else logits[need]  # no (B, V) copy in the common case
            seen = _penalty_context([active[p] for p in need])
            picks = sample_next(scores, cfg, generator, seen)
            lps = _recorded_logprobs([active[p] for p in need], scores, picks, cfg, seen)
            for pos, t, lp in zip(need, picks.tolist(), lps, strict=True):
                yield from step.take(active[pos], t, lp)
            yield from _moved(active, told)
        keep = [pos for pos, row in enumerate(active) if row.phase != "done"]
        if not keep:
            return
        if len(keep) < len(active):  # finished rows leave the batch before the next forward pass
            index = torch.tensor(keep)
            cache.batch_select_indices(index)
            if mask is not None:
                mask, next_pos = mask[index], next_pos[index]
            active = [active[pos] for pos in keep]
        k = min(len(row.pending) for row in active)
        inputs = torch.tensor([row.pending[:k] for row in active])  # (B, k)
        for row in active:
            del row.pending[:k]
            row.fed += k
        scoring = [pos for pos, row in enumerate(active) if row.phase == "verify" and not row.pending]
        extra = {}
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(len(active), k)], dim=1)
            extra = {"attention_mask": mask, "position_ids": next_pos.view(-1, 1) + torch.arange(k)}
            next_pos = next_pos + k
        if fused is not None and k == 1 and mask is None and not scoring and fused.takes(cache):
            logits = fused.step(inputs[:, 0], cache)
            continue
        with adapter(), torch.inference_mode():
            out = model(input_ids=inputs, cache=cache, use_cache=True, logits_to_keep=1,
                        output_hidden_states=bool(scoring), **extra)
        logits = out.logits[:, -1]
        if scoring:
            layers = getattr(verifier, "layers", None)  # a collection recording other layers too (core.training.heads)
            states = [out.hidden_states[i][scoring, -1] for i in (layers or (-1,))]
            scores = verifier.scores(states[0] if layers is None else torch.stack(states, 1))
            for pos, s in zip(scoring, scores, strict=True):
                active[pos].score, active[pos].phase = s, "done"
            yield from _moved(active, told)


def _recorded_logprobs(rows: list[Row], scores: torch.Tensor, picks: torch.Tensor, cfg: SamplingConfig,
                       seen: torch.Tensor | None) -> list[float | None]:
    """Each row's log-prob of its pick, of the kind it records (None for rows that record none)."""
    out: list[float | None] = [None] * len(rows)
    for kind in ("sampling", "model"):
        which = [i for i, r in enumerate(rows) if r.logprobs is not None and r.logprob_kind == kind]
        if which:
            index = torch.tensor(which)
            values = (pick_logprobs(scores[index], picks[index], cfg, None if seen is None else seen[index])
                      if kind == "sampling" else pick_logprobs(scores[index], picks[index], RAW))
            for i, v in zip(which, values.tolist(), strict=True):
                out[i] = v
    return out


RAW = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
"""The model's own distribution: what 'model' log-probs are taken under."""


def _moved(rows: list[Row], told: dict[int, str] | None) -> Iterator[PhaseEvent]:
    """PhaseEvents for rows that started verifying or finished since they were last told (several rows only)."""
    if told is None:
        return
    for row in rows:
        if row.phase != told[row.index] and row.phase in ("verify", "done"):
            told[row.index] = row.phase
            yield PhaseEvent(row.index, row.phase)
