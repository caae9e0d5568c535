"""The fused decode step: one token per row through a packed-int4 Qwen2 model as one plain function.

transformers' model forward, even with the lean layers (core.decode.lean_layers), spends about as long around the int4
kernels as in them on a 2-core CPU: seven linear modules a layer, the quanto wrappers, rotary and mask
helpers, the cache's bookkeeping and ~1,400 small ops a step. `FusedDecoder` runs the same computation on the
same packed weights with fewer, larger ops: q/k/v and gate/up each one int4 matmul over weights concatenated
once at load (the modules' own packed tensors become views into them, so no weight is stored twice), rotary
from a cos/sin pair computed once per step, and core.decode.ops' C kernels for RMSNorm, SwiGLU and the
attention over the int8 cache (core.decode.cache.Int8KVLayer: rotary, quantize and write the token in place, attend).
The lean layers (core.decode.lean_layers) call the same kernels, so results equal the module path's bit for bit
(tests/core/test_fused_decode.py). For one request's rows without an adapter, every decoder layer runs in one C call
(core/decode/_layer_step.c, the same kernels back to back: the Python between ~170 small calls was a third of an AVX2
0.5B step); joint steps of several requests and adapter steps drive the layers from here.

The engine uses it for steps of one token per row over an int8 cache, with no padding mask, no sparse
feed-forward and no hidden states wanted (verifier scoring), for the base model and for a plain LoRA adapter
(`with_adapter`: each projection's `B·A·x·scaling` added to its slice of the fused output, as
core.adapters.lora_fast adds it); every other step takes transformers' path.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from core.decode.cache import Int8KVLayer
from core.decode.ops import decode_step, decode_steps, layers_plan, layers_step, plan_fits, rms_norm, silu_mul
from models.int4_kernel import CHUNKED_ROWS, decode_isa, int4_mm

_LAYER_PARTS = (("qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                ("o", ("self_attn.o_proj",)), ("gate_up", ("mlp.gate_proj", "mlp.up_proj")),
                ("down", ("mlp.down_proj",)))


def _base_linear(module):
    """The quantized linear under a peft LoRA wrapper (or the module itself)."""
    return getattr(module, "base_layer", module)


def _packed_int4(module) -> bool:
    from optimum.quanto.nn import QLinear
    from optimum.quanto.tensor.weights.tinygemm import TinyGemmWeightQBitsTensor

    w = getattr(module, "weight", None)
    return (isinstance(module, QLinear) and isinstance(w, TinyGemmWeightQBitsTensor) and w.device.type == "cpu"
            and module.out_features % 64 == 0)


class _Packed:
    """Several int4 linears reading the same input, as one packed matrix (output columns side by side)."""

    def __init__(self, modules: list):
        group = {m.weight._group_size for m in modules}
        if len(group) != 1:
            raise ValueError("linears with different group sizes cannot share a matrix")
        self.group_size = group.pop()
        self.sizes = [m.out_features for m in modules]
        datas = [m.weight._data._data for m in modules]
        if len({d.dtype for d in datas}) != 1:  # uint8: torch's packing; int8: p32 (models.int4_kernel.to_p32)
            raise ValueError("linears packed in different layouts cannot share a matrix")
        if len(modules) == 1:
            self.data = datas[0]
        else:
            self.data = torch.cat(datas, 0)
            start = 0
            for m, d in zip(modules, datas, strict=True):  # the modules read views of the one copy kept
                m.weight._data._data = self.data[start:start + d.shape[0]]
                start += d.shape[0]
        self.scales = torch.cat([m.weight._scale_shift for m in modules], 1).contiguous()
        biases = [m.bias for m in modules]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases]).contiguous()

    def __call__(self, x: torch.Tensor, lora: tuple | None = None) -> torch.Tensor:
        return self.add_lora(self.base(x), x, lora)

    def base(self, x: torch.Tensor) -> torch.Tensor:
        out = int4_mm(x, self.data, self.group_size, self.scales)
        if self.bias is not None:
            out.add_(self.bias)
        return out

    def add_lora(self, out: torch.Tensor, x: torch.Tensor, lora: tuple | None) -> torch.Tensor:
        """out (the base output for x's rows, or a view of it) plus the adapter's `B·A·x·scaling`, in place."""
        if lora is None:
            return out
        start = 0
        for factors, size in zip(lora, self.sizes, strict=True):
            if factors is not None:  # core.adapters.lora_fast's sum, in the adapter's dtype, cast back
                a, b, bias, scaling = factors
                delta = F.linear(F.linear(x.to(a.dtype), a), b, bias) * scaling
                out[:, start:start + size] = (out[:, start:start + size] + delta).to(out.dtype)
            start += size
        return out

    def grouped(self, x: torch.Tensor, bounds: list[tuple[int, int]], loras: list) -> torch.Tensor:
        """One int4 matmul over every group's rows, then each group's own adapter on its rows (`bounds`)."""
        out = self.base(x)
        for (lo, hi), lora in zip(bounds, loras, strict=True):
            if lora is not None:
                self.add_lora(out[lo:hi], x[lo:hi], lora)
        return out


def _lora_factors(module, name: str):
    """(A, B, B's bias, scaling) of adapter `name` on a plain peft LoRA linear, None where it has none; raises
    LookupError for what the fused step does not compute (DoRA and other variants, merged weights)."""
    from peft.tuners.lora.layer import Linear

    if module is _base_linear(module):
        return None
    if type(module) is not Linear or module.merged or module.lora_variant.get(name) is not None:
        raise LookupError(name)
    if name not in module.lora_A:
        return None
    a, b = module.lora_A[name], module.lora_B[name]
    return a.weight, b.weight, b.bias, module.scaling[name]


class _AdapterStep:
    """The fused step with one LoRA adapter on (FusedDecoder.with_adapter)."""

    def __init__(self, decoder: FusedDecoder, lora: list[dict]):
        self.decoder, self.lora = decoder, lora
        self.takes = decoder.takes

    def step(self, tokens: torch.Tensor, cache) -> torch.Tensor:
        return self.decoder.step(tokens, cache, self.lora)


class FusedDecoder:
    """Decode steps of one packed-int4 Qwen2 causal LM (`build` returns None for any other model)."""

    def __init__(self, model):
        inner = model.model
        config = model.config
        self.eps = config.rms_norm_eps
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.intermediate = config.intermediate_size
        self.embed = inner.embed_tokens.weight
        self.layers = []
        for layer in inner.layers:
            parts = {name: _Packed([_base_linear(layer.get_submodule(p)) for p in paths]) for name, paths in _LAYER_PARTS}
            parts["norm_in"] = layer.input_layernorm.weight.detach()
            parts["norm_post"] = layer.post_attention_layernorm.weight.detach()
            self.layers.append(parts)
        self.norm = inner.norm.weight.detach()
        self.head = _Packed([_base_linear(model.lm_head)])
        self.inv_freq = inner.rotary_emb.inv_freq.float()
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self.model = model
        self.plan = self._plan()

    def _plan(self):
        """The C step's plan of the decoder layers (core.decode.ops.layers_plan), or None where it cannot run (a
        shape outside its range, a matrix torch's kernel would compute). Sets `plan_rows`: the most rows it takes,
        those for which every matrix runs on Ponder's kernel as `int4_mm` would run it."""
        self.plan_rows = CHUNKED_ROWS  # torch's layout: above CHUNKED_ROWS rows int4_mm takes torch's kernel
        if self.heads % self.kv_heads or not plan_fits(self.heads // self.kv_heads, self.head_dim):
            return None
        spec = [len(self.layers), self.embed.shape[1], self.heads, self.kv_heads, self.head_dim, self.intermediate]
        for parts in self.layers:
            norms = (parts["norm_in"], parts["norm_post"])
            if not all(w.dtype == torch.bfloat16 and w.is_contiguous() for w in norms):
                return None
            spec += [w.data_ptr() for w in norms]
            for name, _ in _LAYER_PARTS:
                part = parts[name]
                isa = decode_isa(part.data, part.group_size, part.scales)
                bias = part.bias
                if isa is None or (bias is not None and bias.dtype != torch.bfloat16):
                    return None
                spec += [part.data.data_ptr(), part.scales.data_ptr(), 0 if bias is None else bias.data_ptr(),
                         part.data.shape[0], part.data.shape[1] * 2, part.group_size, isa]
        if self.embed.dtype != torch.bfloat16:
            return None
        if all(part.data.dtype == torch.int8 for parts in self.layers for part in parts.values()
               if isinstance(part, _Packed)):
            self.plan_rows = None  # p32 runs on Ponder's kernel whatever the number of rows
        return layers_plan(spec, self.eps, self.head_dim ** -0.5)

    def with_adapter(self, name: str) -> _AdapterStep | None:
        """The step with peft adapter `name` on, or None when a layer runs it in a way this step does not."""
        inner = self.model.model
        try:
            lora = [{part: tuple(_lora_factors(layer.get_submodule(p), name) for p in paths)
                     for part, paths in _LAYER_PARTS} for layer in inner.layers]
        except LookupError:
            return None
        return _AdapterStep(self, lora)

    @classmethod
    def build(cls, model) -> FusedDecoder | None:
        """A decoder for `model` when it is a Qwen2 causal LM whose every linear is packed int4, else None."""
        model = model.get_base_model() if hasattr(model, "get_base_model") else model
        inner = getattr(model, "model", None)
        if getattr(model.config, "model_type", None) != "qwen2" or inner is None or not hasattr(inner, "layers"):
            return None
        if getattr(model.config, "sliding_window", None) and getattr(model.config, "use_sliding_window", False):
            return None
        linears = [_base_linear(layer.get_submodule(p)) for layer in inner.layers for _, paths in _LAYER_PARTS
                   for p in paths] + [_base_linear(model.lm_head)]
        if not all(_packed_int4(m) for m in linears):
            return None
        return cls(model)

    def parts(self) -> list[_Packed]:
        """Every packed matrix a step reads, LM head included."""
        return [part for layer in self.layers for part in layer.values() if isinstance(part, _Packed)] + [self.head]

    @staticmethod
    def takes(cache) -> bool:
        """Whether a step over `cache` can run here: int8 layers holding tokens, no GRIFFIN selection."""
        layers = getattr(cache, "layers", None)
        return (bool(layers) and getattr(cache, "ff_selection", None) is None
                and all(type(layer) is Int8KVLayer and layer.is_initialized for layer in layers))

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.eps)

    def _rotary(self, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = pos * self.inv_freq
        angles = torch.cat((freqs, freqs))
        dtype = self.embed.dtype  # rotary in the activations' dtype, as transformers applies it
        return (angles.cos() * self.rope_scale).to(dtype), (angles.sin() * self.rope_scale).to(dtype)

    def step(self, tokens: torch.Tensor, cache, lora: list[dict] | None = None) -> torch.Tensor:
        """tokens (B,) at the cache's next position (every row the same length) → next-token logits (B, V), as the
        model's LM head gives them. Appends the tokens' keys and values to `cache`. lora: per layer, each part's
        adapter factors (`with_adapter`)."""
        return self.step_many([(tokens, cache, lora)])[0]

    @torch.inference_mode()
    def step_many(self, items: list[tuple[torch.Tensor, object, list[dict] | None]]) -> list[torch.Tensor]:
        """One step of several groups of rows, each (tokens (B_i,), its own cache, its adapter factors or None), as
        one pass over the weights: the int4 matmuls take every group's rows at once, attention and adapters run per
        group. Each group's logits equal what `step` gives it alone (the int4 kernel computes each row the same
        whatever the rows beside it; core.decode.joint relies on this)."""
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        q_end, k_end = heads * dim, (heads + kv_heads) * dim
        bounds, start = [], 0
        for tokens, _, _ in items:
            bounds.append((start, start + tokens.shape[0]))
            start += tokens.shape[0]
        rotary = [self._rotary(cache.layers[0].length) for _, cache, _ in items]
        h = self.embed[torch.cat([tokens for tokens, _, _ in items]) if len(items) > 1 else items[0][0]]
        if (len(items) == 1 and items[0][2] is None and self.plan is not None  # one C call for the layers
                and (self.plan_rows is None or h.shape[0] <= self.plan_rows)):
            if layers_step(self.plan, h, items[0][1].layers, *rotary[0]):
                return self._logits(h, bounds)
        for i, parts in enumerate(self.layers):
            adapters = [lora[i] if lora is not None else {} for _, _, lora in items]
            qkv = parts["qkv"].grouped(self._rms(h, parts["norm_in"]), bounds, [a.get("qkv") for a in adapters])
            if len(items) == 1:
                cos, sin = rotary[0]
                attn = decode_step(items[0][1].layers[i], qkv[:, :q_end], qkv[:, q_end:k_end], qkv[:, k_end:], cos,
                                   sin, heads, kv_heads, dim ** -0.5)
            else:  # one C call for every request's attention
                attn = decode_steps([cache.layers[i] for _, cache, _ in items], qkv, bounds, rotary, heads,
                                    kv_heads, dim ** -0.5)
            h = h + parts["o"].grouped(attn, bounds, [a.get("o") for a in adapters])
            gate_up = parts["gate_up"].grouped(self._rms(h, parts["norm_post"]), bounds,
                                               [a.get("gate_up") for a in adapters])
            act = silu_mul(gate_up[:, : self.intermediate], gate_up[:, self.intermediate:])
            h = h + parts["down"].grouped(act, bounds, [a.get("down") for a in adapters])
        return self._logits(h, bounds)

    def _logits(self, h: torch.Tensor, bounds: list[tuple[int, int]]) -> list[torch.Tensor]:
        # the final norm as transformers' Qwen2RMSNorm computes it: the module path runs that module itself
        logits = self.head(self.norm * F.rms_norm(h.float(), (h.shape[-1],), eps=self.eps).to(h.dtype))
        return [logits[lo:hi] for lo, hi in bounds]
