"""The Engine: owns model, tokenizer, adapter, switcher, verifier and KV caches; streams answers.

Every request is one base-model prefill (adapter off), then the one decode loop of `core.decode.rows`: one row for a
chat answer (`stream`), N rows forked from that prefill for parallel answers (`parallel`), K left-padded
prompts for evaluation (`generate_batch`). In reasoning mode a row thinks (adapter on) up to its budget, then
answers; at the budget the engine closes the trace itself and forces the answer. A reasoning answer asked
for with a `trace_key` keeps its cache in memory under that key, so `think_longer` can reopen that trace
without re-encoding it; when it is gone (a restart, another model) `think_longer` rebuilds it from the stored
text. Exactly one thread calls an Engine; cancellation is a `threading.Event` checked every decode step.
Adapters (`core.adapters.slots`) switch without reloading the model: the reasoning adapter thinks, a skill
adapter (by name) answers base-mode requests; the prompt is always encoded by the base model.
The engine knows nothing about files or Qt.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import replace

import torch

from core.adapters import lora as adapters
from core.adapters.slots import AdapterChoice, AdapterSlots, Loaded
from core.config import SamplingConfig
from core.decode import lean_layers
from core.decode.attention import use_decode_attention
from core.decode.cache import cache_bytes, crop, new_cache, planned_bytes, repeat_rows
from core.decode.fused import FusedDecoder
from core.decode.joint import JointStep, JointSteps
from core.decode.prompt_cache import PromptCache
from core.decode.rows import Row, decode_rows, new_row
from core.decode.sampling import make_generator
from core.events import Answer, Candidate, DoneEvent, GenerationStats, RouteDecision, TokenEvent
from core.kept_traces import KeptTrace, TraceKeeping
from core.memory import check_rows_fit
from core.prompting.chat_format import DEFAULT_SYSTEM, PromptTooLong, RawPrompt, build_prompt_ids, stop_token_ids
from core.prompting.markers import ReasoningMarkers
from core.prompting.prompts import reasoning_system
from core.reasoning.confidence import token_confidence
from core.reasoning.verifier import combined_features, vote_shares
from core.reasoning.voting import extract_answer, vote
from core.sparse.ff import SparsePlan, missing_parts, plan_for, prefill_selection

MODES = ("auto", "reason", "base")
MAX_STREAMS = 8

class Engine(TraceKeeping, AdapterChoice):
    """One loaded model, ready to answer."""

    def __init__(self, model, tokenizer, *, model_id: str, precision: str = "bf16", kv: str = "bf16",
                 context: int = 8192, router=None, adapter_name: str | None = None, decode: str = "dense",
                 ff_keep: float = 0.5, prompt_cache: PromptCache | None = None, ff_reselect: int = 0,
                 ff_decay: float = 1.0):
        use_decode_attention(model)
        self.prompt_cache = prompt_cache
        """Recent prompts' keys and values, reused by answers whose prompt starts the same (None: off)."""
        lean_layers.install(model)
        self.fused = FusedDecoder.build(model)
        """Base-model decode steps as one function over the packed int4 weights (None for other weights)."""
        self.model_lock = threading.RLock()
        """Held by whatever runs the model (prefills, steps, adapter switches), so that callers on other threads
        take turns with the engine thread between steps."""
        self.joint = JointSteps(self.fused, self.model_lock)
        """Requests decoding at the same time on the engine thread, their fused steps run as one (core.decode.joint;
        without packed int4 weights every step takes the module path and requests simply take turns)."""
        self.slots = AdapterSlots(model.eval(), adapter_name if adapters.is_adapted(model) else None)
        self.base_fingerprint: str | None = None
        """The base weights' fingerprint (set by the loader): adapters trained on other weights are refused."""
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.precision = precision
        self.kv = kv
        self.decode, self.ff_keep = decode, ff_keep
        self.ff_reselect, self.ff_decay = ff_reselect, ff_decay
        """Decode steps' feed-forward: 'dense', 'griffin' (each prompt's top `ff_keep` neurons, core.sparse.ff) or
        'griffin+caprese' (with `caprese`'s low-rank branches, at the share they were fitted for)."""
        self.caprese: dict = {}
        """core.sparse.caprese.Branches of this model by the sparsity they recover ('griffin', 'cats')."""
        self.cats: dict | None = None
        """This model's CATS calibration (core.sparse.cats: `thresholds` per layer), when it has one."""
        self.context = min(context, int(getattr(model.config, "max_position_embeddings", context)))
        self.eos_ids = stop_token_ids(tokenizer)
        self.router = router
        self.verifier = None
        """A core.reasoning.verifier.Verifier scoring parallel reasoning answers, when one is loaded."""
        self.markers = ReasoningMarkers.for_tokenizer(tokenizer)
        self.last_cache = None
        self._traces: OrderedDict[str, KeptTrace] = OrderedDict()

    def prompt_ids(self, messages: Sequence[dict] | str, system: str | None = DEFAULT_SYSTEM) -> list[int]:
        return build_prompt_ids(self.tokenizer, messages, system=system)

    @contextlib.contextmanager
    def _using(self, item: Loaded | None):
        """Run the model under adapter `item` (None: the base model), holding the model lock."""
        with self.model_lock, self.slots.using(item):
            yield

    def _base(self):
        return self._using(None)

    def route(self, mode: str, hidden: torch.Tensor | None) -> RouteDecision:
        if mode == "reason":
            return RouteDecision(True, None, "mode")
        if mode == "base" or self.router is None:
            return RouteDecision(False, None, "mode" if mode == "base" else "no-switcher")
        t = time.perf_counter()
        prob = self.router.probability(hidden)
        return RouteDecision(prob >= self.router.threshold, prob, "switcher", time.perf_counter() - t)

    def _scoring(self, cache, mask: torch.Tensor | None = None):
        """Context for a request's prefill(s): with GRIFFIN decoding, the cache then carries the prompt's cut
        feed-forward blocks (`mask`: the left-padded batch's attention mask)."""
        return prefill_selection(self.model, cache, self.sparse_plan(), mask)

    def sparse_plan(self) -> SparsePlan | None:
        """What `decode` asks for, as far as this model has the parts (core.sparse.ff.plan_for)."""
        return plan_for(self.decode, self.ff_keep, self.cats, self.caprese, self.ff_reselect, self.ff_decay)

    def missing_for_decode(self) -> str | None:
        """A note for the user when `decode` asks for a part this model lacks."""
        return missing_parts(self.decode, self.cats, self.caprese)

    def open_prompt(self, ids: list[int], mode: str, cache, reuse: bool = False) -> tuple[torch.Tensor, RouteDecision]:
        """The one base-model prefill every mode shares; returns the next-token logits (1, V) and the route.

        When reasoning may follow, `<think>\n` is part of that prefill (base-encoded, like the rest of the
        prompt), so switching the adapter on afterwards re-encodes nothing: the first thinking token comes
        straight from the prefill's logits. If `auto` routes to the base model, the cache is cropped back to
        the prompt and the logits before `<think>` are used. `reuse`: start from the prompt cache's longest
        prefix of `ids` and keep this prompt there (dense decoding only: GRIFFIN scores the whole prompt).
        """
        opener = list(self.markers.think_open) if mode != "base" else []
        store = self.prompt_cache if reuse and self.sparse_plan() is None else None
        known, prefix_hidden = store.take(ids, cache, need_hidden=mode == "auto") if store else (0, None)
        with self._base(), torch.inference_mode(), self._scoring(cache):
            out = self.model(input_ids=torch.tensor([ids[known:] + opener]), cache=cache, use_cache=True,
                             logits_to_keep=len(opener) + 1, output_hidden_states=mode == "auto")
        hidden = out.hidden_states[-1][:, : len(ids) - known] if mode == "auto" else None
        if known and hidden is not None:
            hidden = torch.cat([prefix_hidden, hidden], dim=1)
        if store is not None:
            store.put(ids, cache, hidden)
        decision = self.route(mode, hidden)
        if decision.reason:
            return out.logits[:, -1], decision
        if opener:
            crop(cache, len(ids))
        return out.logits[:, 0], decision

    # --- requests -------------------------------------------------------------------------------------
    def _check(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if mode != "base" and not self.can_reason:
            raise ValueError("reasoning needs the reasoning adapter, which is not loaded")

    @staticmethod
    def _prompt_system(mode: str, budget: int | None, system: str | None = DEFAULT_SYSTEM) -> str | None:
        """The system prompt of a request: reasoning modes add the budget statement."""
        return reasoning_system(budget, system or DEFAULT_SYSTEM) if mode != "base" else system

    def _prompt(self, messages, mode: str, budget: int | None, system: str | None, reserve: int = 8) -> list[int]:
        if isinstance(messages, RawPrompt) and mode != "base":
            raise ValueError("a raw prompt (no chat template) is continued by the base model: mode must be 'base'")
        ids = self.prompt_ids(messages, self._prompt_system(mode, budget, system))
        if len(ids) >= self.context - reserve:
            raise PromptTooLong(f"The conversation is {len(ids)} tokens; this model's window is {self.context}.")
        return ids

    def _limits(self, start_len: int, reasoning: bool, budget: int | None, answer_max_tokens: int,
                cfg: SamplingConfig) -> tuple[int, int]:
        """(thinking limit, answer limit) for rows whose cache holds `start_len` tokens."""
        room = self.context - start_len - len(self.markers.forced_close) - 2
        if room < 2:
            raise PromptTooLong(f"The conversation is {start_len} tokens; this model's window is {self.context}.")
        if not reasoning:
            return 0, max(1, min(cfg.max_tokens, room))
        think_limit = max(1, min(budget or room, room - answer_max_tokens))
        return think_limit, max(1, min(answer_max_tokens, room - think_limit))

    def _check_rows_fit(self, rows: int, start_len: int, limits: tuple[int, int], what: str) -> None:
        """Refuse (core.memory.RequestTooLarge) `rows` rows from `start_len` tokens with these limits whose KV cache,
        one copy a row, would not fit in the memory free now; before the rows are made."""
        tokens = min(self.context, start_len + sum(limits) + len(self.markers.forced_close) + len(self.markers.verify))
        check_rows_fit(rows, planned_bytes(self.model.config, self.kv, 1, tokens), what, tokens)

    def fused_step(self, item: Loaded | None):
        """The fused decode step under adapter `item` (None: the base model), or None where the module path must
        run: other weights than packed int4, sparse feed-forward, adapters that train whole modules (LM head)."""
        if self.fused is None or self.decode != "dense" or self.slots.trains_extra_modules:
            return None
        single = self.fused if item is None else self.fused.with_adapter(item.peft_name)
        return None if single is None else JointStep(self.joint, single)

    def _decode(self, cache, logits, rows: list[Row], cfg: SamplingConfig, reasoning: bool, cancel,
                skill: Loaded | None = None, **extra) -> Iterator[TokenEvent]:
        """Decode steps run under the reasoning adapter, else the skill adapter, else the base model (through the
        fused step where it applies: not for adapters that train whole modules, such as the LM head)."""
        item = self.slots.reasoning if reasoning else skill
        adapter = functools.partial(self._using, item)
        fused = self.fused_step(item)
        events = decode_rows(self.model, cache, logits, rows, tokenizer=self.tokenizer, markers=self.markers,
                             eos_ids=self.eos_ids, cfg=cfg, generator=make_generator(cfg.seed), adapter=adapter,
                             cancel=cancel, verifier=self.verifier, fused=fused, **extra)
        return events if fused is not None else self.joint.turns(events)

    def stream(self, messages: Sequence[dict] | str, sampling: SamplingConfig | None = None, *, mode: str = "base",
               budget: int | None = 256, answer_max_tokens: int = 256, cancel: threading.Event | None = None,
               system: str | None = DEFAULT_SYSTEM, trace_key: str | None = None, skill=None
               ) -> Iterator[TokenEvent | DoneEvent]:
        """Yield TokenEvents (kind 'thinking' or 'answer') as text becomes final, then one DoneEvent.

        mode: 'base' answers directly; 'reason' thinks first (needs the adapter); 'auto' lets the switcher decide.
        budget: thinking tokens before the engine forces the answer (None = up to the context window).
        trace_key: keep a reasoning answer's trace in memory under this key for `think_longer`.
        skill: a loaded skill adapter's name (or an AdapterCard) that writes the answer when no thinking happens.
        """
        self._check(mode)
        skill = self._skill(skill)
        cfg = sampling or SamplingConfig()
        start = time.perf_counter()
        ids = self._prompt(messages, mode, budget, system)
        cache = self.last_cache = new_cache(self.model.config, self.kv)
        logits, decision = self.open_prompt(ids, mode, cache, reuse=True)
        start_len = cache.get_seq_length()
        think_limit, answer_limit = self._limits(start_len, decision.reason, budget, answer_max_tokens, cfg)
        row = new_row(0, self.tokenizer, self.markers, cfg, reasoning=decision.reason, think_limit=think_limit,
                      answer_limit=answer_limit, seen=ids)
        yield from self._decode(cache, logits, [row], cfg, decision.reason, cancel, skill)
        answer = self._answer(row, ids, decision, budget if decision.reason else None, start, cache, skill=skill)
        if decision.reason and trace_key is not None:
            self._keep_row(trace_key, row, cache, ids, start_len, budget)
        yield DoneEvent(answer)

    def _answer(self, row: Row, ids, decision: RouteDecision, budget, start, cache, prior: str = "",
                prior_ids: Sequence[int] = (), resumed: str | None = None, skill: Loaded | None = None) -> Answer:
        end = time.perf_counter()
        first_at = row.first_token_at or end
        out_ids = list(prior_ids) + row.thinking_ids + row.answer_ids
        n = len(row.thinking_ids) + len(row.answer_ids)
        stats = GenerationStats(
            prompt_tokens=len(ids), completion_tokens=n, ttft_s=first_at - start,
            decode_tok_s=(n - 1) / (end - first_at) if n > 1 and end > first_at else 0.0,
            total_s=end - start, kv_cache_bytes=cache_bytes(cache), precision=self.precision, kv=self.kv,
        )
        reasoning = decision.reason
        return Answer(row.answer_text(self.markers), row.finish or "cancelled",
                      stats, self.model_id, tuple(out_ids), thinking=prior + row.think.text,
                      thinking_tokens=len(prior_ids) + len(row.thinking_ids), answer_tokens=len(row.answer_ids),
                      budget=budget, budget_forced=row.budget_hit, route=decision,
                      adapter=self._answered_by(reasoning, skill), resumed=resumed)

    def parallel(self, messages: Sequence[dict] | str, sampling: SamplingConfig | None = None, *, n: int = 4,
                 mode: str = "reason", budget: int | None = 256, answer_max_tokens: int = 256,
                 cancel: threading.Event | None = None, system: str | None = DEFAULT_SYSTEM, skill=None
                 ) -> Iterator[TokenEvent | DoneEvent]:
        """N answers sampled from one prefill, decoded as one batch and voted on.

        With a verifier and a reasoning route each row ends with the verification prompt and the vote is
        verifier-weighted (unless the verifier's head.json says `"vote": "majority"`, measured better on its
        model; the scores are still shown); otherwise (no verifier, or `auto` routed to the base model, whose
        states the verifier was not trained on) it is a plain majority. TokenEvents carry their stream index.
        """
        if not 1 <= n <= MAX_STREAMS:
            raise ValueError(f"parallel answers must be between 1 and {MAX_STREAMS}")
        self._check(mode)
        skill = self._skill(skill)
        cfg = sampling or SamplingConfig()
        start = time.perf_counter()
        ids = self._prompt(messages, mode, budget, system, reserve=64)
        cache = new_cache(self.model.config, self.kv)
        logits, decision = self.open_prompt(ids, mode, cache, reuse=True)
        start_len = cache.get_seq_length()
        verify = decision.reason and self.verifier is not None
        think_limit, answer_limit = self._limits(start_len + len(self.markers.verify), decision.reason, budget,
                                                 answer_max_tokens, cfg)
        self._check_rows_fit(n, start_len, (think_limit, answer_limit), "parallel answers")
        cache = self.last_cache = repeat_rows(cache, n)
        kv_bytes = cache_bytes(cache)
        rows = [new_row(i, self.tokenizer, self.markers, cfg, reasoning=decision.reason, think_limit=think_limit,
                        answer_limit=answer_limit, verify=verify, seen=ids, logprobs="model") for i in range(n)]
        yield from self._decode(cache, logits.expand(n, -1), rows, cfg, decision.reason, cancel, skill)
        yield DoneEvent(self._combine(rows, ids, decision, budget if decision.reason else None, start, kv_bytes,
                                      skill, cfg.temperature))

    def _combine(self, rows: list[Row], ids, decision, budget, start, kv_bytes, skill=None,
                 temperature: float | None = None) -> Answer:
        candidates = []
        for row in rows:
            text = row.answer_text(self.markers)
            confidence = token_confidence(row.logprobs or ())
            candidates.append(Candidate(row.index, text, row.think.text, extract_answer(text), row.score,
                                        len(row.thinking_ids), len(row.answer_ids), row.budget_hit,
                                        row.finish or "cancelled", *(confidence or (None, None))))
        scored = all(c.score is not None for c in candidates)
        if scored and self.verifier is not None and self.verifier.combines(temperature) and all(
                c.logprob_mean is not None for c in candidates):  # the score, its confidence and its vote share
            shares = vote_shares([c.final_answer for c in candidates])
            combined = self.verifier.combine([combined_features(c.score, c.logprob_mean, c.logprob_lowest, share)
                                              for c, share in zip(candidates, shares, strict=True)])
            candidates = [replace(c, score=p, head_score=c.score) for c, p in zip(candidates, combined, strict=True)]
        method = "weighted" if scored and (self.verifier is None or self.verifier.vote == "weighted") else "majority"
        result = vote([c.final_answer for c in candidates],  # a count: each candidate one vote, whatever its score
                      [c.score if method == "weighted" else 1.0 for c in candidates], method)
        chosen = result.winner_index if result.winner_index is not None else 0
        best = candidates[chosen]
        end = time.perf_counter()
        stamps = [r.first_token_at for r in rows if r.first_token_at is not None]
        first_at = min(stamps) if stamps else end
        produced = sum(c.thinking_tokens + c.answer_tokens for c in candidates)
        stats = GenerationStats(prompt_tokens=len(ids), completion_tokens=produced, ttft_s=first_at - start,
                                decode_tok_s=produced / (end - first_at) if end > first_at else 0.0,
                                total_s=end - start, kv_cache_bytes=kv_bytes, precision=self.precision, kv=self.kv)
        reason = "cancelled" if any(c.finish_reason == "cancelled" for c in candidates) else best.finish_reason
        return Answer(best.text, reason, stats, self.model_id, (), thinking=best.thinking,
                      thinking_tokens=best.thinking_tokens, answer_tokens=best.answer_tokens, budget=budget,
                      budget_forced=best.budget_forced, route=decision,
                      adapter=self._answered_by(decision.reason, skill), candidates=tuple(candidates),
                      vote_table=result.table, vote_method=method, chosen=chosen,
                      vote_tie=result.tie)

    def generate_batch(self, prompts: Sequence[Sequence[dict] | str], sampling: SamplingConfig | None = None, *,
                       mode: str = "base", budget: int | None = 256, answer_max_tokens: int = 256,
                       system: str | None = DEFAULT_SYSTEM, skill=None) -> list[Answer]:
        """Answers to K different prompts decoded as one batch (left-padded prefill), for evaluation throughput.

        Same prompts, rules and weights as `stream`; only the batching differs, so results can differ from
        one-at-a-time runs in the last bits of floating point. `auto` routes each prompt first (`_auto_batch`).
        """
        if mode == "auto":
            return self._auto_batch(prompts, sampling, budget=budget, answer_max_tokens=answer_max_tokens,
                                    system=system, skill=skill)
        self._check(mode)
        skill = self._skill(skill)
        cfg = sampling or SamplingConfig()
        reasoning = mode == "reason"
        start = time.perf_counter()
        prompt_ids = [self._prompt(p, mode, budget, system) for p in prompts]
        opener = list(self.markers.think_open) if reasoning else []
        seqs = [ids + opener for ids in prompt_ids]
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        think_limit, answer_limit = self._limits(width, reasoning, budget, answer_max_tokens, cfg)
        self._check_rows_fit(len(seqs), width, (think_limit, answer_limit), "prompts in one batch")
        cache = new_cache(self.model.config, self.kv)
        with self._base(), torch.inference_mode(), self._scoring(cache, mask):
            logits = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1]
        rows = [new_row(i, self.tokenizer, self.markers, cfg, reasoning=reasoning, think_limit=think_limit,
                        answer_limit=answer_limit, seen=ids) for i, ids in enumerate(prompt_ids)]
        for _event in self._decode(cache, logits, rows, cfg, reasoning, None, skill, mask=mask,
                                   next_pos=positions[:, -1] + 1):
            pass
        decision = RouteDecision(reasoning, None, "mode")
        return [self._answer(row, ids, decision, budget if reasoning else None, start, cache, skill=skill)
                for row, ids in zip(rows, prompt_ids, strict=True)]

    def route_prompt(self, messages: Sequence[dict] | str, *, mode: str = "auto", budget: int | None = 256,
                     system: str | None = DEFAULT_SYSTEM) -> RouteDecision:
        """The route `stream` takes for this request (auto: the switcher on its prefill), without decoding."""
        self._check(mode)
        ids = self._prompt(messages, mode, budget, system)
        return self.open_prompt(ids, mode, new_cache(self.model.config, self.kv))[1]

    def _auto_batch(self, prompts, sampling, *, budget, answer_max_tokens, system, skill) -> list[Answer]:
        """`auto` in batches: each prompt is routed on a prefill of its own, then the prompts routed to thinking
        decode as one Reason batch and the rest as one base batch on auto's own prompt (its system prompt states
        the budget), which is what `stream` continues after the switcher says no. Costs one more prefill a
        prompt than the modes' batches."""
        decisions = [self.route_prompt(p, mode="auto", budget=budget, system=system) for p in prompts]
        answers: list[Answer | None] = [None] * len(prompts)
        for reason in (True, False):
            picked = [i for i, d in enumerate(decisions) if d.reason == reason]
            if not picked:
                continue
            got = self.generate_batch([prompts[i] for i in picked], sampling, mode="reason" if reason else "base",
                                      budget=budget, answer_max_tokens=answer_max_tokens, skill=skill,
                                      system=system if reason else self._prompt_system("auto", budget, system))
            for i, answer in zip(picked, got, strict=True):
                answers[i] = replace(answer, route=decisions[i])
        return answers

    def generate(self, messages: Sequence[dict] | str, sampling: SamplingConfig | None = None, **kw) -> Answer:
        """Run `stream` to the end and return the Answer."""
        return collect(self.stream(messages, sampling, **kw))


def collect(events: Iterator) -> Answer:
    for event in events:
        if isinstance(event, DoneEvent):
            return event.answer
    raise RuntimeError("stream ended without an answer")
