"""Decode attention: the attention function every engine model runs, registered with transformers as "ponder".

A decode step asks one query token per row against the whole cache. torch's CPU flash-attention kernel, which
transformers' SDPA path calls, is built for long queries and takes ~3.3 ms per layer for one token at 4k
context on a 2-core EPYC (0.32 ms at 300 tokens); two small float32 matmuls grouped by KV head (no
`repeat_kv` copy) take 0.30 ms and 0.06 ms with the same error against a float64 reference.
`python -m bench.attention` measures both on the machine at hand. Prompts and training (several query tokens)
go to transformers' SDPA unchanged.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "ponder"


def decode_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query (B, Hq, 1, D) against key/value (B, Hkv, T, D) → ((B, 1, Hq, D), None), as transformers expects.

    attention_mask: SDPA's mask (bool, True = attend, or additive float), (B, 1, 1, T), or None."""
    batch, heads, q_len, dim = query.shape
    if q_len != 1 or dropout or kwargs.get("position_bias") is not None or torch.is_grad_enabled():
        key, value = key.to(query.dtype), value.to(query.dtype)  # an int8 cache may hand decode-time float32
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    kv_heads = key.shape[1]
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim).float()  # query heads grouped by their KV head
    scores = torch.matmul(q, key.float().transpose(-1, -2))  # (B, Hkv, groups, T)
    scores.mul_(scaling if scaling is not None else dim ** -0.5)
    if attention_mask is not None:
        mask = attention_mask[..., -key.shape[-2]:]
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask)
    out = torch.matmul(scores.softmax(-1), value.float())  # (B, Hkv, groups, D)
    return out.to(query.dtype).reshape(batch, 1, heads, dim), None


def use_decode_attention(model) -> None:
    """Switch a transformers model that runs SDPA to the "ponder" attention (same masks, faster decode)."""
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    config = model.config
    if getattr(config, "_attn_implementation", None) in ("sdpa", NAME):
        config._attn_implementation = NAME
