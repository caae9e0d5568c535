"""Messages to prompt token ids through the model's own chat template, with user text kept as text.

Text typed by a person (any message content) never becomes control tokens: `<|im_start|>`, `<|im_end|>`,
`<think>` or `<tool_call>` inside a message are tokenized as plain characters (`split_special_tokens` covers the
tokens marked special; added tokens that are not, like Qwen2.5-Coder's `<tool_call>`, are split by hand). The
template's own markup is tokenized normally. Knows nothing about models or generation.
"""
from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass


class PromptTooLong(ValueError):
    """The conversation does not fit in the model's context window."""


DEFAULT_SYSTEM = "You are Ponder, a helpful assistant running offline on this computer. Answer clearly and concisely."


@dataclass(frozen=True)
class RawPrompt:
    """Text the model continues as it is, without the chat template (the server's `/v1/completions`). Its
    template tokens are text too, like any message's."""

    text: str


def normalise_messages(messages: Sequence[dict] | str, system: str | None = None) -> list[dict]:
    """Accept a plain string or [{'role','content'}]; add the system message when one is given and none exists."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    out = [{"role": m["role"], "content": str(m.get("content", ""))} for m in messages]
    for m in out:
        if m["role"] not in ("system", "user", "assistant"):
            raise ValueError(f"unknown message role {m['role']!r}")
    if system and (not out or out[0]["role"] != "system"):
        out.insert(0, {"role": "system", "content": system})
    return out


def build_prompt_ids(tokenizer, messages: Sequence[dict] | str, *, system: str | None = DEFAULT_SYSTEM,
                     add_generation_prompt: bool = True) -> list[int]:
    """Render the chat template and tokenize it so that message contents cannot inject special tokens (a
    `RawPrompt` is tokenized as it is, with no template and no system prompt)."""
    if isinstance(messages, RawPrompt):
        return text_ids(tokenizer, messages.text)
    msgs = normalise_messages(messages, system)
    tag = secrets.token_hex(8)
    sentinels = [f"\x00{tag}:{i}\x00" for i in range(len(msgs))]
    templated = [{"role": m["role"], "content": s} for m, s in zip(msgs, sentinels, strict=True)]
    rendered = tokenizer.apply_chat_template(templated, tokenize=False, add_generation_prompt=add_generation_prompt)
    pieces = re.split(f"(\x00{tag}:\\d+\x00)", rendered)
    ids: list[int] = []
    for piece in pieces:
        if not piece:
            continue
        if piece.startswith(f"\x00{tag}:"):
            ids += text_ids(tokenizer, msgs[int(piece[len(tag) + 2:-1])]["content"])
        else:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return ids


def _plain_added(tokenizer) -> re.Pattern | None:
    """A pattern matching the tokenizer's added tokens that are not marked special (split_special_tokens leaves
    those whole), longest first; None when there are none."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    plain = sorted({t.content for t in decoder.values() if not t.special and t.content}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, plain))) if plain else None


SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone UTF-16 surrogate: what Python makes of bytes that are not UTF-8 in a command-line argument or a
C-locale stdin (`\\udce9` for a Latin-1 é), or a JSON "\\ud800"; the tokenizer refuses it."""


def text_ids(tokenizer, text: str) -> list[int]:
    """Token ids of `text` as plain characters: no control token, special or merely added, comes out of it; a
    character that cannot be encoded (a lone surrogate) becomes U+FFFD."""
    text = SURROGATE.sub("\ufffd", text)
    encode = lambda t: tokenizer(t, add_special_tokens=False, split_special_tokens=True)["input_ids"]  # noqa: E731
    pattern = _plain_added(tokenizer)
    if pattern is None or not pattern.search(text):
        return encode(text)
    ids, at = [], 0
    for m in pattern.finditer(text):
        ids += encode(text[at:m.start()]) if m.start() > at else []
        ids += encode(m.group()[:1]) + encode(m.group()[1:])  # the same characters, never the added token
        at = m.end()
    return ids + (encode(text[at:]) if at < len(text) else [])


def stop_token_ids(tokenizer) -> set[int]:
    """Token ids that end an assistant turn: <|im_end|>, <|endoftext|> and the tokenizer's eos."""
    ids = set()
    for tok in ("<|im_end|>", "<|endoftext|>", tokenizer.eos_token):
        if tok:
            tid = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
                ids.add(tid)
    return ids
