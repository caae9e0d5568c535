"""The OpenAI wire format of the local server: request bodies (pydantic models), their translation into an
engine `Generation`, and the JSON bodies built from `Answer`s and `TokenEvent`s, errors included.

Ponder's own controls ride along as extension fields: `reasoning_mode`, `thinking_budget`, `vote`, `top_k`,
`repetition_penalty`, `ignore_eos` in requests; `reasoning_content` and a `ponder` object (route, candidates with verifier
scores, vote table, tie) in responses. Knows nothing about HTTP or threads.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.config import SamplingConfig
from core.events import Answer, TokenEvent
from core.prompting.chat_format import RawPrompt
from core.reasoning.voting import vote

from .engine_worker import Generation

DEFAULT_TEMPERATURE = 0.7


class ApiError(Exception):
    """An error answered in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for."""

    max_tokens: int = 4096
    """Largest `max_tokens` and `thinking_budget` accepted."""
    default_max_tokens: int = 512
    """`max_tokens` when the request gives none."""
    default_thinking_budget: int = 256
    max_body_bytes: int = 1 << 20
    body_timeout_s: float = 30.0
    """A body still arriving after this long is refused (408): a slow sender cannot hold a request open."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # unknown OpenAI parameters are accepted and ignored


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class _Request(_Strict):
    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=1e-6, le=1)
    top_k: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, ge=0.01, le=4)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=8)
    reasoning_mode: Literal["auto", "reason", "base"] = "base"
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    """OpenAI's knob (LM Studio's users ask for it): none/minimal answer directly; low, medium and high think with
    half, one and four times the model's default budget, unless `reasoning_mode` / `thinking_budget` say otherwise."""
    thinking_budget: int | None = Field(None, ge=1)
    vote: Literal["weighted", "majority"] | None = None
    ignore_eos: bool = False
    """Keep going past end-of-turn up to max_tokens (as in vLLM; for benchmarks)."""


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(_Request):
    prompt: str | list[str]


MAX_STOP_CHARS = 256
"""Longest stop string: the stream holds back text that could begin one, checked at every token."""
MIN_TEMPERATURE = 1e-4
"""Temperatures above 0 but below this sample greedily (1e-50 would turn the logits to inf in float32)."""

UNSUPPORTED = {  # parameter -> value that is fine to send (anything else is refused)
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
    "logit_bias": (None, {}),
}


def parse(model: type[_Request], body: bytes) -> _Request:
    """Validate a request body; raises ApiError (400) naming the offending parameter."""
    try:
        req = model.model_validate_json(body)
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "json_invalid":
            raise ApiError(400, "The request body is not valid JSON.", code="invalid_json") from None
        if first["type"] == "model_type":
            raise ApiError(400, "The request body must be a JSON object.", code="invalid_json") from None
        param = ".".join(str(p) for p in first["loc"]  # pydantic's union tags are not parameter names
                         if not (str(p).startswith(("function-", "list[")) or str(p) == "str"))
        if first["type"] == "missing":
            raise ApiError(400, f"Missing required parameter: '{param}'.", param=param,
                           code="missing_required_parameter") from None
        raise ApiError(400, f"Invalid value for '{param}': {first['msg']}.", param=param, code="invalid_value") from None
    for name, allowed in UNSUPPORTED.items():
        value = (req.model_extra or {}).get(name)
        if value not in allowed:
            raise ApiError(400, f"'{name}' is not supported by this server.", param=name, code="unsupported_parameter")
    if isinstance(req, CompletionRequest) and isinstance(req.prompt, list) and len(req.prompt) != 1:
        raise ApiError(400, "'prompt' must be a string or a list of one string.", param="prompt", code="invalid_value")
    if isinstance(req, CompletionRequest) and not (req.prompt if isinstance(req.prompt, str) else req.prompt[0]):
        raise ApiError(400, "'prompt' must not be empty.", param="prompt", code="invalid_value")
    stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ApiError(400, f"Each 'stop' string may be at most {MAX_STOP_CHARS} characters.", param="stop",
                       code="invalid_value")
    if req.temperature is not None and 0 < req.temperature < MIN_TEMPERATURE:
        req.temperature = 0.0  # the same answer in practice, without dividing the logits by ~0
    return req


def _text(content) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(part.text for part in content)


EFFORT_BUDGET = {"low": 0.5, "medium": 1.0, "high": 4.0}
"""`reasoning_effort` -> thinking budget as a multiple of the model's default."""


def _conversation(req: _Request) -> tuple[list[dict] | RawPrompt, str | None]:
    """(messages, system prompt) for the engine; leading system/developer messages become the system prompt. A
    completion's prompt is continued as it is (no chat template)."""
    if isinstance(req, CompletionRequest):
        return RawPrompt(req.prompt if isinstance(req.prompt, str) else req.prompt[0]), None
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)}
                for m in req.messages]
    system = []
    while messages and messages[0]["role"] == "system":
        system.append(messages.pop(0)["content"])
    if not any(m["role"] == "user" for m in messages):
        raise ApiError(400, "'messages' must contain a user message.", param="messages", code="invalid_value")
    return messages, "\n\n".join(system) if system else None


def _bounded(value: int | None, default: int, limit: int, param: str) -> int:
    value = default if value is None else value
    if value > limit:
        raise ApiError(400, f"'{param}' is {value}; this server allows at most {limit}.", param=param,
                       code="invalid_value")
    return value


def to_generation(req: _Request, limits: Limits, *, can_reason: bool) -> Generation:
    """The engine call a validated request asks for; raises ApiError for values the engine cannot honour."""
    messages, system = _conversation(req)
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = _bounded(req.max_completion_tokens or req.max_tokens, limits.default_max_tokens, limits.max_tokens,
                          param)
    mode, default_budget = req.reasoning_mode, limits.default_thinking_budget
    if req.reasoning_effort is not None and "reasoning_mode" not in req.model_fields_set:
        thinks = req.reasoning_effort in EFFORT_BUDGET and can_reason and isinstance(req, ChatRequest)
        mode = "reason" if thinks else "base"  # clients send it to any model: one that cannot think answers
        if thinks:
            default_budget = min(limits.max_tokens, max(1, round(default_budget * EFFORT_BUDGET[req.reasoning_effort])))
    budget = _bounded(req.thinking_budget, default_budget, limits.max_tokens, "thinking_budget")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if len(stop) > 4 or any(not s for s in stop):
        raise ApiError(400, "'stop' takes up to 4 non-empty strings.", param="stop", code="invalid_value")
    if isinstance(req, CompletionRequest) and mode != "base":
        raise ApiError(400, "/v1/completions continues the prompt as it is: only reasoning_mode 'base' applies; use "
                       "/v1/chat/completions to think first.", param="reasoning_mode", code="invalid_value")
    if mode == "reason" and not can_reason:
        raise ApiError(400, "reasoning_mode 'reason' needs the reasoning adapter, which this model does not have.",
                       param="reasoning_mode", code="invalid_value")
    if mode == "auto" and not can_reason:
        mode = "base"
    sampling = SamplingConfig(
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_p=SamplingConfig.top_p if req.top_p is None else req.top_p,
        top_k=SamplingConfig.top_k if req.top_k is None else req.top_k,
        repetition_penalty=SamplingConfig.repetition_penalty if req.repetition_penalty is None else req.repetition_penalty,
        max_tokens=max_tokens, seed=req.seed, stop=stop, ignore_eos=req.ignore_eos)
    options = {"mode": mode, "budget": budget, "answer_max_tokens": max_tokens}
    if system is not None:
        options["system"] = system
    if req.n > 1:
        return Generation("parallel", messages, sampling, {**options, "n": req.n}, source="server")
    return Generation("stream", messages, sampling, options, source="server")


# --- responses -----------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def usage(answer: Answer) -> dict:
    s = answer.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
            "total_tokens": s.prompt_tokens + s.completion_tokens}


def _vote(answer: Answer, method: str | None) -> dict:
    chosen, table, tie, used = answer.chosen, answer.vote_table, answer.vote_tie, answer.vote_method
    scored = all(c.score is not None for c in answer.candidates)
    if method is not None and method != used and (method == "majority" or scored):
        result = vote([c.final_answer for c in answer.candidates],
                      [c.score if method == "weighted" else 1.0 for c in answer.candidates], method)
        chosen = result.winner_index if result.winner_index is not None else 0
        table, tie, used = result.table, result.tie, method
    return {"method": used, "chosen": chosen, "tie": tie,
            "table": [{"answer": a, "weight": w, "votes": v} for a, w, v in table]}


def ponder_extension(answer: Answer, vote_method: str | None = None) -> dict:
    """Ponder's own view of an answer: route, thinking, timings; candidates and the vote for n > 1."""
    route, s = answer.route, answer.stats
    out = {
        "route": None if route is None else {"reason": route.reason, "probability": route.probability,
                                             "source": route.source},
        "adapter": answer.adapter, "thinking_tokens": answer.thinking_tokens, "answer_tokens": answer.answer_tokens,
        "budget": answer.budget, "budget_forced": answer.budget_forced,
        "ttft_s": round(s.ttft_s, 4), "decode_tok_s": round(s.decode_tok_s, 2), "total_s": round(s.total_s, 3),
    }
    if answer.candidates:
        out["candidates"] = [c.to_dict() for c in answer.candidates]
        out["vote"] = _vote(answer, vote_method)
    return out


def _choices(answer: Answer, chosen: int | None = None) -> list[tuple[int, str, str, str]]:
    """(index, text, thinking, finish) per choice: the N candidates for n > 1, the voted one (`chosen`) first and
    the others in their order; else the one answer."""
    if answer.candidates:
        order = sorted(answer.candidates, key=lambda c: (c.index != chosen, c.index))
        return [(i, c.text, c.thinking, c.finish_reason) for i, c in enumerate(order)]
    return [(0, answer.text, answer.thinking, answer.finish_reason)]


def chat_completion(answer: Answer, req: ChatRequest, model: str) -> dict:
    choices, extension = [], ponder_extension(answer, req.vote)
    for index, text, thinking, finish in _choices(answer, extension.get("vote", {}).get("chosen")):
        message = {"role": "assistant", "content": text}
        if thinking:
            message["reasoning_content"] = thinking
        choices.append({"index": index, "message": message, "finish_reason": finish_reason(finish), "logprobs": None})
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(answer), "ponder": extension}


def completion(answer: Answer, req: CompletionRequest, model: str) -> dict:
    extension = ponder_extension(answer, req.vote)
    choices = [{"index": index, "text": text, "finish_reason": finish_reason(finish), "logprobs": None}
               | ({"reasoning_content": thinking} if thinking else {})
               for index, text, thinking, finish in _choices(answer, extension.get("vote", {}).get("chosen"))]
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(answer), "ponder": extension}


def chat_chunk(cid: str, created: int, model: str, choices: list[dict], **extra) -> dict:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices,
            **extra}


def token_delta(event: TokenEvent, chat: bool) -> dict:
    """One streamed piece as a choice of a chunk."""
    if not chat:
        key = "reasoning_content" if event.kind == "thinking" else "text"
        return {"index": event.stream, "text": "", key: event.text, "finish_reason": None, "logprobs": None}
    key = "reasoning_content" if event.kind == "thinking" else "content"
    return {"index": event.stream, "delta": {key: event.text}, "finish_reason": None, "logprobs": None}


def final_deltas(answer: Answer, chat: bool) -> list[dict]:
    """The closing choice of each stream, with its finish reason."""
    out = []
    for index, _text, _thinking, finish in _choices(answer):
        piece = {"delta": {}} if chat else {"text": ""}
        out.append({"index": index, **piece, "finish_reason": finish_reason(finish), "logprobs": None})
    return out
