"""N answers from one prefill: the prompt cache is replicated and the N streams decode as one batch.

Each row walks thinking → answer → verify → done. Forced tokens (the `</think>` close at the budget, the
verification prompt) are queued per row and fed one per step, so all rows stay in lockstep; finished rows
are pruned from the batch. At the end of its verification prompt a row's hidden state goes to the verifier.
Candidates are combined by verifier-weighted majority (plain majority without a verifier).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .cache import cache_bytes, fork, new_cache
from .chat_format import DEFAULT_SYSTEM
from .config import SamplingConfig
from .events import Answer, Candidate, DoneEvent, GenerationStats, TokenEvent
from .prompts import reasoning_prompts, reasoning_system
from .sampling import make_generator, sample_next
from .text_stream import TextStream
from .voting import extract_answer, vote

MAX_STREAMS = 8


@dataclass
class Row:
    index: int
    phase: str
    """'thinking', 'answer', 'verify' or 'done'."""
    think: TextStream
    answer: TextStream
    queue: list[int] = field(default_factory=list)
    thinking_ids: list[int] = field(default_factory=list)
    answer_ids: list[int] = field(default_factory=list)
    forced: bool = False
    """The engine closed the trace (budget reached or end-of-turn inside it)."""
    budget_hit: bool = False
    finish: str = ""
    score: float | None = None
    scoring: bool = False


def stream_parallel(engine, messages: Sequence[dict] | str, sampling: SamplingConfig | None = None, *, n: int = 4,
                    mode: str = "reason", budget: int | None = 256, answer_max_tokens: int = 256,
                    cancel: threading.Event | None = None, system: str | None = DEFAULT_SYSTEM,
                    ) -> Iterator[TokenEvent | DoneEvent]:
    """Yield TokenEvents tagged with their stream, then a DoneEvent whose Answer carries every candidate,
    the vote table and the chosen reply."""
    if not 1 <= n <= MAX_STREAMS:
        raise ValueError(f"parallel answers must be between 1 and {MAX_STREAMS}")
    if mode != "base" and not engine.can_reason:
        raise ValueError("reasoning needs the reasoning adapter, which is not loaded")
    cfg = sampling or SamplingConfig()
    tok, model = engine.tokenizer, engine.model
    start = time.perf_counter()
    ids = engine.prompt_ids(messages, reasoning_system(budget, system or DEFAULT_SYSTEM) if mode != "base" else system)
    room = engine.context - len(ids) - 64
    if room < 16:
        from .engine import PromptTooLong

        raise PromptTooLong(f"The conversation is {len(ids)} tokens; this model's window is {engine.context}.")
    cache = new_cache(model.config, engine.kv)
    logits, decision = engine.open_prompt(ids, mode, cache)
    reasoning = decision.reason
    context = (lambda: torch.inference_mode()) if reasoning else engine._base
    cache = fork(cache, n)
    kv_bytes = cache_bytes(cache)
    logits = logits.expand(n, -1)
    p = reasoning_prompts()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    verify_ids = enc(p["verify_prompt"]) if engine.verifier is not None else []
    think_limit = min(budget or room, room - answer_max_tokens) if reasoning else 0
    answer_limit = answer_max_tokens if reasoning else min(cfg.max_tokens, room)
    rows = [Row(i, "thinking" if reasoning else "answer", TextStream(tok, (p["think_close_marker"],)),
                TextStream(tok, cfg.stop)) for i in range(n)]
    active = list(range(n))  # batch position -> row index
    generator = make_generator(cfg.seed)
    first_at, produced = None, 0

    def close_answer(row: Row, reason: str) -> None:
        row.finish = reason
        if verify_ids:
            row.phase, row.queue = "verify", list(verify_ids)
        else:
            row.phase = "done"

    while active:
        if cancel is not None and cancel.is_set():
            for r in active:
                rows[r].phase, rows[r].finish = "done", "cancelled"
            break
        sampled = sample_next(logits, cfg, generator)
        if first_at is None:
            first_at = time.perf_counter()
        inputs = []
        for pos, r in enumerate(active):
            row = rows[r]
            if row.queue:
                inputs.append(row.queue.pop(0))
                row.scoring = row.phase == "verify" and not row.queue
                continue
            t = int(sampled[pos])
            produced += 1
            is_eos = t in engine.eos_ids and not cfg.ignore_eos
            if row.phase == "thinking":
                if not is_eos:
                    row.thinking_ids.append(t)
                piece = "" if is_eos else row.think.push(t)
                if piece:
                    yield TokenEvent(piece, "thinking", len(row.thinking_ids) - 1, r)
                if row.think.stopped:
                    row.phase = "answer"
                elif is_eos or len(row.thinking_ids) >= think_limit:
                    row.phase, row.forced, row.budget_hit = "answer", True, not is_eos
                    row.queue = engine._think_close + engine._forced_prefix
                    tail = row.think.flush()
                    if tail:
                        yield TokenEvent(tail, "thinking", len(row.thinking_ids) - 1, r)
                    yield TokenEvent(engine._forced_prefix_text, "answer", 0, r)
                if is_eos:
                    inputs.append(row.queue.pop(0))
                    continue
                inputs.append(t)
                continue
            # answer phase
            if is_eos:
                close_answer(row, "stop")
                inputs.append(row.queue.pop(0) if row.queue else t)
                continue
            row.answer_ids.append(t)
            piece = row.answer.push(t)
            if piece:
                yield TokenEvent(piece, "answer", len(row.answer_ids) - 1, r)
            if row.answer.stopped or len(row.answer_ids) >= answer_limit:
                tail = row.answer.flush()
                if tail:
                    yield TokenEvent(tail, "answer", len(row.answer_ids) - 1, r)
                close_answer(row, "stop" if row.answer.stopped else "length")
            inputs.append(t)
        scoring = [pos for pos, r in enumerate(active) if rows[r].scoring]
        with context():
            with torch.inference_mode():
                out = model(input_ids=torch.tensor(inputs).view(-1, 1), cache=cache, use_cache=True, logits_to_keep=1,
                            output_hidden_states=bool(scoring))
        logits = out.logits[:, -1]
        if scoring:
            scores = engine.verifier.scores(out.hidden_states[-1][scoring, -1])
            for pos, s in zip(scoring, scores, strict=True):
                row = rows[active[pos]]
                row.score, row.phase, row.scoring = s, "done", False
        keep = [pos for pos, r in enumerate(active) if rows[r].phase != "done"]
        if len(keep) < len(active):
            if keep:
                cache.batch_select_indices(torch.tensor(keep))
                logits = logits[keep]
            active = [active[pos] for pos in keep]
    return_answer = _combine(engine, rows, ids, decision, budget, start, first_at, produced, kv_bytes, reasoning)
    yield DoneEvent(return_answer)


def _combine(engine, rows: list[Row], ids, decision, budget, start, first_at, produced, kv_bytes, reasoning) -> Answer:
    candidates = []
    for row in rows:
        text = (engine._forced_prefix_text if row.forced else "") + row.answer.text.lstrip("\n")
        candidates.append(Candidate(row.index, text, row.think.text, extract_answer(text), row.score,
                                    len(row.thinking_ids), len(row.answer_ids), row.budget_hit, row.finish or "cancelled"))
    weights = [c.score if c.score is not None else 1.0 for c in candidates]
    method = "weighted" if all(c.score is not None for c in candidates) else "majority"
    result = vote([c.final_answer for c in candidates], weights, method)
    chosen = result.winner_index if result.winner_index is not None else 0
    best = candidates[chosen]
    end = time.perf_counter()
    first_at = first_at or end
    stats = GenerationStats(prompt_tokens=len(ids), completion_tokens=produced, ttft_s=first_at - start,
                            decode_tok_s=produced / (end - first_at) if end > first_at else 0.0, total_s=end - start,
                            kv_cache_bytes=kv_bytes, precision=engine.precision, kv=engine.kv)
    reason = "cancelled" if any(c.finish_reason == "cancelled" for c in candidates) else best.finish_reason
    return Answer(best.text, reason, stats, engine.model_id, (), thinking=best.thinking,
                  thinking_tokens=best.thinking_tokens, answer_tokens=best.answer_tokens, budget=budget if reasoning else None,
                  budget_forced=best.budget_forced, route=decision, adapter=engine.adapter_name if reasoning else None,
                  candidates=tuple(candidates), vote_table=result.table, vote_method=method, chosen=chosen)
