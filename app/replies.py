"""What a reply request is (ReplyOptions), what the view shows while a reply streams (LiveReply), the
conversation as the model sees it (`history`), and what is recorded with a finished answer (`answer_meta`).
No Qt here."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from core.config import SamplingConfig


@dataclass
class ReplyOptions:
    mode: str = "auto"
    budget: int | None = 256
    parallel: int = 1
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 40
    repetition_penalty: float = 1.05
    answer_max_tokens: int = 256
    max_tokens: int = 1024
    skill: str | None = None
    """The chat's skill adapter (library name) that answers; None = the base model."""
    system: str | None = None
    """The chat's system prompt (None: Ponder's own); reasoning modes add the budget statement to it."""

    @classmethod
    def from_meta(cls, settings: dict | None) -> ReplyOptions:
        """The options recorded with an earlier answer (keys this version does not know are ignored)."""
        known = {k: v for k, v in (settings or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class LiveReply:
    """What the view shows while an answer streams."""

    thinking: str = ""
    answer: str = ""
    thinking_tokens: int = 0
    budget: int | None = None
    started: float = field(default_factory=time.monotonic)
    streams: dict = field(default_factory=dict)
    """stream index -> {'thinking': str, 'answer': str} for parallel answers."""
    conversation_id: str | None = None
    message_id: int | None = None
    """The stored row the reply streams into."""
    parent_id: int | None = None
    """The stored message the reply follows (its question)."""
    replaces: tuple[int, ...] = ()
    """Shown rows this reply is an alternative to (regenerate, think longer): they stay shown while it streams
    (the reply's own row is then not on the shown branch) and it is shown instead once it has finished; a
    stopped or failed one stays a sibling to switch to, and the branch shown is left as it was."""


def history(messages) -> list[dict]:
    """The conversation as the model sees it: each question with one reply (the last finished one when a
    question kept several, e.g. a stopped "think longer" next to the answer it continued)."""
    out: list[dict] = []
    group: list = []

    def flush():
        if group:
            best = next((m for m in reversed(group) if m.status == "complete"), group[-1])
            out.append({"role": "assistant", "content": best.content})
            group.clear()

    for m in messages:
        if m.role == "user":
            flush()
            out.append({"role": "user", "content": m.content})
        elif m.content:
            group.append(m)
    flush()
    return out


def sampling_of(options: ReplyOptions) -> SamplingConfig:
    return SamplingConfig(temperature=options.temperature, top_p=options.top_p, top_k=options.top_k,
                          repetition_penalty=options.repetition_penalty, max_tokens=options.max_tokens)


def answer_meta(answer, options: ReplyOptions) -> dict:
    s = answer.stats
    route = answer.route
    meta = {
        "settings": asdict(options), "model": answer.model, "precision": s.precision, "kv": s.kv,
        "route": None if route is None else {"reason": route.reason, "probability": route.probability,
                                             "source": route.source},
        "adapter": answer.adapter, "thinking_tokens": answer.thinking_tokens, "answer_tokens": answer.answer_tokens,
        "budget": answer.budget, "budget_forced": answer.budget_forced, "ttft_s": s.ttft_s,
        "decode_tok_s": s.decode_tok_s, "tokens": s.completion_tokens, "finish_reason": answer.finish_reason,
    }
    if getattr(answer, "resumed", None):
        meta["resumed"] = answer.resumed
    if answer.candidates:
        meta["candidates"] = [c.to_dict() for c in answer.candidates]
        meta["vote"] = {"method": answer.vote_method, "table": [list(r) for r in answer.vote_table],
                        "tie": bool(getattr(answer, "vote_tie", False))}
        meta["chosen"] = answer.chosen
    return meta
