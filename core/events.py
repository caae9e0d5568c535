"""Immutable values that cross threads: streamed tokens and finished answers. No tensors, no Qt."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TokenEvent:
    """A piece of streamed text. `kind` is 'answer' (later also 'thinking')."""

    text: str
    kind: str = "answer"
    index: int = 0
    """Position of the token in this answer (0-based)."""
    stream: int = 0
    """Which of the parallel streams it belongs to."""


@dataclass(frozen=True)
class PhaseEvent:
    """One of several parallel streams moved on: 'verify' (its answer is written and the verifier reads it) or
    'done'. Thinking and answering are told by the TokenEvents' kinds; a single stream sends no PhaseEvents."""

    stream: int
    phase: str


@dataclass(frozen=True)
class GenerationStats:
    """Per-request measurements."""

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    """Time from request start to the first generated token."""
    decode_tok_s: float
    """Generated tokens after the first, per second of decoding."""
    total_s: float
    kv_cache_bytes: int
    precision: str
    kv: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RouteDecision:
    """Whether this request reasons, and why."""

    reason: bool
    probability: float | None
    """The switcher's P(reasoning needed), when it was asked."""
    source: str
    """'mode' (the user chose reason/base) or 'switcher' (auto)."""
    latency_s: float = 0.0
    """Time the switcher took (pooling + head)."""


@dataclass(frozen=True)
class Candidate:
    """One of N parallel answers."""

    index: int
    text: str
    thinking: str
    final_answer: str | None
    """Extracted final answer (\\boxed{} or last number); None when there is none."""
    score: float | None
    """Verifier P(correct), None without a verifier."""
    thinking_tokens: int
    answer_tokens: int
    budget_forced: bool
    finish_reason: str
    logprob_mean: float | None = None
    """Mean log-prob of its sampled tokens (core.reasoning.confidence), None when not recorded."""
    logprob_lowest: float | None = None
    """Lowest mean log-prob over a window of its tokens (DeepConf's lowest group confidence)."""
    head_score: float | None = None
    """The verifier head's own P(correct) when a combiner turned it into `score`; None otherwise."""

    def to_dict(self) -> dict:
        """The JSON form `ponder ask --json`, the local server and stored chats share (`answer` = final_answer)."""
        return {"index": self.index, "answer": self.final_answer, "score": self.score, "text": self.text,
                "thinking": self.thinking, "thinking_tokens": self.thinking_tokens,
                "answer_tokens": self.answer_tokens, "budget_forced": self.budget_forced,
                "finish_reason": self.finish_reason, "logprob_mean": self.logprob_mean,
                "logprob_lowest": self.logprob_lowest, "head_score": self.head_score}


@dataclass(frozen=True)
class Answer:
    """A finished (or stopped) answer."""

    text: str
    finish_reason: str
    """'stop' (end of turn or stop string), 'length' (max tokens or context) or 'cancelled'."""
    stats: GenerationStats
    model: str
    token_ids: tuple[int, ...] = ()
    thinking: str = ""
    thinking_tokens: int = 0
    answer_tokens: int = 0
    budget: int | None = None
    budget_forced: bool = False
    """True when the thinking budget ran out and the engine closed the trace."""
    route: RouteDecision | None = None
    adapter: str | None = None
    candidates: tuple[Candidate, ...] = ()
    vote_table: tuple[tuple[str, float, int], ...] = ()
    """(answer, summed weight, votes), best first."""
    vote_method: str | None = None
    chosen: int | None = None
    """Index of the candidate whose text is the reply."""
    vote_tie: bool = False
    """Several answers shared the top of the vote; the earliest candidate's is the reply."""
    resumed: str | None = None
    """For "think longer": 'cache' (continued on the kept cache) or 'text' (the trace was re-prefilled)."""


@dataclass(frozen=True)
class DoneEvent:
    """Last event of a stream."""

    answer: Answer


@dataclass(frozen=True)
class TrainProgress:
    """One optimizer step of a training run."""

    step: int
    total_steps: int
    loss: float
    lr: float
    elapsed_s: float
    message: str = ""
