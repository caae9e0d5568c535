"""Prompt caching: the base model's keys and values for recent prompts, so a prompt that starts like one seen
before prefills only what differs.

Every request begins with the same chat-template tokens and usually the same system prompt (an editor plugin
sends a long one with each request); a chat's next turn begins with the whole of its previous prompt. The prompt
is always encoded by the base model (masked LoRA: the adapters are off on prompt tokens), so its cache does not
depend on the mode that follows. `PromptCache.take` copies the longest stored prefix of a new prompt into its
empty cache (with the last-layer states the switcher reads); `put` keeps the prompt's own after its prefill.
Entries are compact copies (decoding appends to the request's cache, never to them), the least recently used
goes first, and they hold at most `max_tokens` tokens in all. A prefill split at the prefix computes the same
function as one pass; its floating-point rounding may differ in the last bit, as llama.cpp's prompt cache does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core.decode.cache import Int8KVLayer


@dataclass
class _Entry:
    ids: tuple[int, ...]
    layers: list[tuple[torch.Tensor, ...]]
    hidden: torch.Tensor | None
    """(1, T, H) last-layer states of the prompt, when the prefill computed them (`auto` mode)."""


class PromptCache:
    """Recent prompts' base-model keys and values (see the module docstring)."""

    def __init__(self, max_tokens: int = 4096, min_tokens: int = 8):
        self.max_tokens, self.min_tokens = max_tokens, min_tokens
        self._entries: list[_Entry] = []  # most recent last
        self.hits = 0
        self.reused_tokens = 0

    def _best(self, ids: list[int]) -> tuple[_Entry | None, int]:
        best, best_len = None, 0
        for entry in self._entries:
            n = _common_prefix(entry.ids, ids)
            if n > best_len:
                best, best_len = entry, n
        return best, best_len

    def take(self, ids: list[int], cache, need_hidden: bool = False) -> tuple[int, torch.Tensor | None]:
        """Fill the empty `cache` with the longest stored prefix of `ids` (at most all but its last token) and
        return its length and, when `need_hidden`, its last-layer states; (0, None) when none is worth it."""
        entry, n = self._best(ids)
        n = min(n, len(ids) - 1)
        if entry is None or n < self.min_tokens or (need_hidden and entry.hidden is None) or cache.get_seq_length():
            return 0, None
        for layer, stored in zip(cache.layers, entry.layers, strict=True):
            _load(layer, stored, n)
        self._entries.remove(entry)
        self._entries.append(entry)
        self.hits += 1
        self.reused_tokens += n
        return n, entry.hidden[:, :n] if need_hidden else None

    def put(self, ids: list[int], cache, hidden: torch.Tensor | None = None) -> None:
        """Keep the first len(ids) positions of `cache` (the prompt, prefilled by the base model)."""
        if len(ids) < self.min_tokens or len(ids) > self.max_tokens:
            return
        key = tuple(ids)
        self._entries = [e for e in self._entries if e.ids != key]
        layers = [_save(layer, len(ids)) for layer in cache.layers]
        self._entries.append(_Entry(key, layers, None if hidden is None else hidden[:, : len(ids)].clone()))
        while sum(len(e.ids) for e in self._entries) > self.max_tokens:
            self._entries.pop(0)

    def clear(self) -> None:
        """Forget every prompt (the base weights changed)."""
        self._entries.clear()

    @property
    def tokens(self) -> int:
        return sum(len(e.ids) for e in self._entries)


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _save(layer, length: int) -> tuple:
    if isinstance(layer, Int8KVLayer):
        return layer.q[..., :length, :].clone(), layer.s[..., :length, :].clone(), layer.dtype
    return layer.keys[..., :length, :].clone(), layer.values[..., :length, :].clone(), layer.keys.dtype


def _load(layer, stored: tuple, length: int) -> None:
    """Give an empty layer the first `length` positions of a stored one (its own copy: decoding appends to it)."""
    a, b = (t[..., :length, :] for t in stored[:2])
    if isinstance(layer, Int8KVLayer):
        k = torch.empty(a.shape[1:], dtype=stored[2])  # shapes and dtype only: lazy_initialization sizes the buffers
        layer.lazy_initialization(k, k)
        layer._ensure_capacity(length)
        layer.q[..., :length, :] = a
        layer.s[..., :length, :] = b
        layer.length = length
        return
    layer.lazy_initialization(a, b)
    layer.keys, layer.values = a.clone(), b.clone()
