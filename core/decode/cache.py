"""The KV cache: the only module that touches transformers' Cache API.

`new_cache(config, kv)` gives a `DynamicCache` (bf16) or one whose layers store keys and values as int8 with
one bf16 scale per token and head (symmetric absmax), appended in place into growing buffers. transformers'
own `QuantizedCache` offers only 2/4-bit quanto/HQQ or per-tensor fp8, so the int8 layer is ours, built on
its `DynamicLayer` so that crop / batch_repeat_interleave / batch_select_indices keep working.
"""
from __future__ import annotations

import copy

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

INITIAL_CAPACITY = 256
GROWTH = 64
"""An int8 layer's buffers grow by this many tokens past what is needed (not doubled: at 2k and 8k tokens the
allocated bytes stay ≤ 0.55× a bf16 cache's; the copy it costs every 64 tokens is what DynamicCache's
`torch.cat` pays on every step)."""


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (..., T, D) -> int8 (..., T, D) and bf16 scales (..., T, 1), absmax per token and head."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-8).div_(127.0)
    q = xf.div_(scale).round_().clamp_(-127, 127).to(torch.int8)
    return q, scale.to(torch.bfloat16)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return q.to(dtype) * scale.to(dtype)


class Int8KVLayer(DynamicLayer):
    """One layer's keys/values in int8 + per-(token, head) scales, in buffers that grow by GROWTH tokens.
    Keys and values share one buffer (2, B, H, capacity, D), so a step quantizes, stores and dequantizes them
    in one pass each. `float_decode`: a one-token step gets float32 keys and values (core.decode.attention's decode)."""

    def __init__(self, float_decode: bool = False):
        super().__init__()
        self.float_decode = float_decode

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.shape != value_states.shape:
            raise ValueError("the int8 cache needs keys and values of one shape")
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.length = 0
        b, h, t, d = key_states.shape
        cap = max(INITIAL_CAPACITY, t)
        self.q = torch.empty(2, b, h, cap, d, dtype=torch.int8)
        self.s = torch.empty(2, b, h, cap, 1, dtype=torch.bfloat16)
        self.keys = self.values = None
        self.is_initialized = True

    def _ensure_capacity(self, needed: int) -> None:
        cap = self.q.shape[-2]
        if needed <= cap:
            return
        for name in ("q", "s"):
            old = getattr(self, name)
            grown = torch.empty(*old.shape[:3], needed + GROWTH, old.shape[-1], dtype=old.dtype)
            grown[..., : self.length, :] = old[..., : self.length, :]
            setattr(self, name, grown)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[-2]
        self._ensure_capacity(self.length + t)
        end = self.length + t
        q, scale = quantize_int8(torch.stack((key_states, value_states)))
        self.q[..., self.length:end, :] = q
        self.s[..., self.length:end, :] = scale
        self.length = end
        # the "ponder" attention computes a decode step in float32: dequantize straight to it, one pass
        dtype = torch.float32 if self.float_decode and t == 1 and not torch.is_grad_enabled() else self.dtype
        kv = dequantize_int8(self.q[..., :end, :], self.s[..., :end, :], dtype)
        return kv[0], kv[1]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def reset(self) -> None:
        self.is_initialized = False
        self.length = 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)

    def _map_rows(self, fn) -> None:
        """Apply `fn` to the batch dimension (dim 1 of the buffers), keeping the tokens in use."""
        if not self.is_initialized:
            return
        for name in ("q", "s"):
            setattr(self, name, fn(getattr(self, name)[..., : max(self.length, 1), :]).contiguous())

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_rows(lambda t: t.repeat_interleave(repeats, dim=1))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_rows(lambda t: t[:, indices])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_rows(lambda t: t.index_select(1, beam_idx))

    def allocated_bytes(self) -> int:
        """Bytes of the buffers as allocated (capacity, not tokens used)."""
        if not self.is_initialized:
            return 0
        return self.q.untyped_storage().nbytes() + self.s.untyped_storage().nbytes()

    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        per_token = sum(t[..., :1, :].numel() * t.element_size() for t in (self.q, self.s))
        return per_token * self.length


class _PromptState:
    """What the prompt decided beside its keys and values, one entry per cache row, following the cache's row
    operations: `ff_selection`, GRIFFIN's cut feed-forward blocks (core.sparse.ff), or None (dense)."""

    ff_selection = None

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.ff_selection is not None:
            self.ff_selection = self.ff_selection.repeat(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.ff_selection is not None:
            self.ff_selection = self.ff_selection.select(indices)


class PonderDynamicCache(_PromptState, DynamicCache):
    """transformers' DynamicCache (bf16) with the prompt's state."""


class PonderCache(_PromptState, Cache):
    """A cache of int8 layers with the prompt's state."""


def new_cache(config, kv: str = "bf16") -> Cache:
    """An empty cache for `config`'s decoder: DynamicCache for bf16, int8 layers for 'int8'."""
    if kv == "bf16":
        return PonderDynamicCache(config=config)
    if kv == "int8":
        float_decode = getattr(config, "_attn_implementation", None) == "ponder"
        return PonderCache(layers=[Int8KVLayer(float_decode) for _ in range(config.num_hidden_layers)])
    raise ValueError(f"unknown KV format {kv!r}")


def cache_bytes(cache: Cache) -> int:
    """Bytes the cache holds right now (keys + values + scales)."""
    total = 0
    for layer in cache.layers:
        if isinstance(layer, Int8KVLayer):
            total += layer.nbytes()
        elif getattr(layer, "keys", None) is not None and layer.keys.numel():
            total += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
    return total


def allocated_bytes(cache: Cache) -> int:
    """Bytes the cache's buffers take in memory (int8: their capacity; bf16: the concatenated tensors)."""
    total = 0
    for layer in cache.layers:
        if isinstance(layer, Int8KVLayer):
            total += layer.allocated_bytes()
        elif getattr(layer, "keys", None) is not None and layer.keys.numel():
            total += layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes()
    return total


def kv_bytes_per_token(config, kv: str = "bf16") -> int:
    """Bytes one token of one row takes in a cache for `config`, every layer together: bf16 keys and values, or
    int8 ones with one bf16 scale per token and head (what `cache_bytes` counts per token)."""
    heads = config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_layer = 2 * heads * (dim + 2) if kv == "int8" else 2 * heads * dim * 2
    return config.num_hidden_layers * per_layer


def planned_bytes(config, kv: str, rows: int, tokens: int) -> int:
    """The most bytes a cache for `config` takes while `rows` rows grow to at most `tokens` tokens each:
    every layer's buffers at their largest (int8: a capacity of up to `tokens + GROWTH`, never under
    INITIAL_CAPACITY; bf16: exactly the tokens), plus one layer's old buffers, alive while that layer is copied
    to grow (int8's `_ensure_capacity`, bf16's `torch.cat`) or to drop finished rows (`batch_select_indices`).
    Rows are separate copies: N answers from one prompt hold its keys and values N times."""
    capacity = max(INITIAL_CAPACITY, tokens + GROWTH) if kv == "int8" else tokens
    layers = config.num_hidden_layers
    return rows * capacity * kv_bytes_per_token(config, kv) * (layers + 1) // layers


def cache_length(cache: Cache) -> int:
    return cache.get_seq_length()


def fork(cache: Cache, n: int) -> Cache:
    """A deep copy whose rows are the original's repeated n times (for N streams from one prefill)."""
    clone = copy.deepcopy(cache)
    if n > 1:
        clone.batch_repeat_interleave(n)
    return clone


def repeat_rows(cache: Cache, n: int) -> Cache:
    """`cache`'s one row repeated n times, in place (N streams from one prefill whose one-row cache is not needed
    again): unlike `fork`, no copy of the prefill stays beside the n rows while they are made. Returns `cache`."""
    if n > 1:
        cache.batch_repeat_interleave(n)
    return cache


def crop(cache: Cache, length: int) -> None:
    """Drop everything after the first `length` tokens."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
