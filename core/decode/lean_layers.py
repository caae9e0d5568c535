"""One-token decode steps through a Qwen2 decoder layer in one function.

transformers' `Qwen2DecoderLayer` runs a decode step through eleven module calls (attention, MLP, two RMSNorms,
seven linears), two deprecation wrappers and an attention-function lookup, and its RMSNorm is eight small ops.
`install(model)` gives each decoder layer a forward that, for one query token per row with no gradient, does the
same computation directly: RMSNorm and SwiGLU as core.decode.ops computes them (the fused step's own kernels), the
projections' own forwards (quantized kernels, LoRA fast path), and for an int8 cache core.decode.ops' attention
step (rotary, append, attend); for other caches, or with a padding mask, transformers' rotary function, the cache's
`update` and `core.decode.attention.decode_attention`. The feed-forward block is cut to the prompt's neurons when the
cache carries a GRIFFIN selection (core.sparse.ff). Prompts, training and anything unusual take transformers'
forward. The layer module itself is still called, so its hooks (hidden-state capture for the verifier) still run.
"""
from __future__ import annotations

import types

import torch
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, apply_rotary_pos_emb

from core.decode import ops as decode_ops
from core.decode.attention import decode_attention


def rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Qwen2RMSNorm's result: normalised in float32, cast back, times the weight."""
    return decode_ops.rms_norm(x, norm.weight, norm.variance_epsilon)


def _lean_forward(self, hidden_states: torch.Tensor, attention_mask=None, position_ids=None, cache=None,
                  use_cache=False, position_embeddings=None, **kwargs) -> torch.Tensor:
    if (hidden_states.shape[1] != 1 or cache is None or position_embeddings is None or torch.is_grad_enabled()
            or self.training or kwargs.get("output_attentions")):
        return self._hf_forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    attn, mlp = self.self_attn, self.mlp
    rows, dim = hidden_states.shape[0], attn.head_dim
    x = rms_norm(hidden_states, self.input_layernorm)
    q, k, v = attn.q_proj.forward(x), attn.k_proj.forward(x), attn.v_proj.forward(x)
    cos, sin = position_embeddings
    layers = getattr(cache, "layers", None)
    if attention_mask is None and layers is not None and decode_ops.takes(layers[attn.layer_idx]):
        # an int8 cache: the fused step's own attention (core.decode.ops), so both paths agree bit for bit
        out = decode_ops.decode_step(layers[attn.layer_idx], q.view(rows, -1), k.view(rows, -1), v.view(rows, -1),
                                       cos, sin, q.shape[-1] // dim, k.shape[-1] // dim, attn.scaling)
    else:
        q, k = apply_rotary_pos_emb(q.view(rows, 1, -1, dim).transpose(1, 2), k.view(rows, 1, -1, dim).transpose(1, 2),
                                    cos, sin)
        k, v = cache.update(k, v.view(rows, 1, -1, dim).transpose(1, 2), attn.layer_idx)
        out, _ = decode_attention(attn, q, k, v, attention_mask, scaling=attn.scaling)
    hidden_states = hidden_states + attn.o_proj.forward(out.reshape(rows, 1, -1))
    x = rms_norm(hidden_states, self.post_attention_layernorm)
    selection = getattr(cache, "ff_selection", None)  # GRIFFIN: this prompt's cut feed-forward (core.sparse.ff)
    if selection is not None:
        return hidden_states + selection.forward(attn.layer_idx, x, lambda h, sink=None: _dense_ff(mlp, h, sink))
    return hidden_states + _dense_ff(mlp, x)


def _dense_ff(mlp, x: torch.Tensor, sink: list | None = None) -> torch.Tensor:
    """The dense feed-forward; `sink` (a list), when given, receives the down projection's input."""
    gate, up = mlp.gate_proj.forward(x), mlp.up_proj.forward(x)
    if isinstance(mlp.act_fn, torch.nn.SiLU) and gate.shape[1] == 1:  # the fused step's SwiGLU (core.decode.ops)
        z = decode_ops.silu_mul(gate[:, 0], up[:, 0]).unsqueeze(1)
    else:
        z = mlp.act_fn(gate) * up
    if sink is not None:
        sink.append(z)
    return mlp.down_proj.forward(z)


def install(model) -> int:
    """Give every Qwen2 decoder layer of `model` the lean decode forward (once); return how many."""
    count = 0
    for module in model.modules():
        if type(module) is Qwen2DecoderLayer and "_hf_forward" not in module.__dict__:
            module._hf_forward = module.forward
            module.forward = types.MethodType(_lean_forward, module)
            count += 1
    return count
