"""FPTQuant° for Qwen2: function-preserving transforms merged into the weights before int4 quantization.

Mergeable transforms (paper A.7; the input scales are AWQ's), each an exact rewrite of the float model:
- residual rotation Q (a randomised Hadamard, d = 2^k·m as Hadamard ⊗ random orthogonal) with every RMSNorm
  weight folded into the linears that read it: embedding rows E·Q, readers W·diag(γ)·Q, writers Qᵀ·W;
- input scaling c per residual channel: RMSNorm weight ÷ c, the columns of the linears reading it × c;
- MLP scaling s: up_proj rows × s, down_proj columns ÷ s (the gate acts elementwise, so SiLU(g)·(s·u)/s = SiLU(g)·u);
- value scaling t per KV channel: v_proj rows × t, o_proj columns ÷ t (attention mixes values linearly);
- pre-RoPE key scaling ρ per (KV head, rotary pair): k_proj rows × ρ, q_proj rows ÷ ρ (RoPE rotates each pair
  by one angle, so a pair-wide scale commutes with it and q·k is unchanged).

Every linear then computes W' = L·W·R with per-module maps (`module_maps`); the same maps rewrite LoRA factors
(A' = A·R, B' = L·B) and the heads that read the final hidden state (`transform_head`), so adapters and heads
trained on the original basis keep working. The parameters are calibrated layer by layer (`calibrate`, in
models/fpt_calibration.py): s and t by a grid search over AWQ-style exponents that minimises the int4 output
error of down_proj / o_proj, ρ by the attention-logit error of the int8 key cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

SPEC_FILE = "fpt.safetensors"


def hadamard(n: int) -> torch.Tensor:
    """Sylvester Hadamard matrix of size n (a power of two), normalised to be orthogonal."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / h.shape[0] ** 0.5


def random_rotation(d: int, seed: int = 0) -> torch.Tensor:
    """An orthogonal d×d matrix: random signs · (random orthogonal m×m ⊗ Hadamard 2^k), d = 2^k·m, m odd."""
    gen = torch.Generator().manual_seed(seed)
    k = (d & -d)  # largest power of two dividing d
    m = d // k
    orth, r = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=torch.float64))
    orth = orth * torch.sign(torch.diagonal(r))  # a uniformly random orthogonal matrix
    signs = torch.randint(0, 2, (d,), generator=gen).to(torch.float64).mul_(2).sub_(1)
    return (signs[:, None] * torch.kron(orth.contiguous(), hadamard(k).double())).float()


@dataclass
class FptSpec:
    """The transform parameters of one model: what `apply_fpt` merged and what adapters and heads need."""

    rotation: torch.Tensor | None  # (d, d) or None
    gamma_attn: list[torch.Tensor] = field(default_factory=list)  # input_layernorm weights folded, per layer
    gamma_mlp: list[torch.Tensor] = field(default_factory=list)  # post_attention_layernorm weights folded
    gamma_final: torch.Tensor | None = None
    mlp_scale: list[torch.Tensor] = field(default_factory=list)  # (intermediate,) per layer
    value_scale: list[torch.Tensor] = field(default_factory=list)  # (kv_heads * head_dim,) per layer
    key_scale: list[torch.Tensor] = field(default_factory=list)  # (kv_heads * head_dim / 2,) per layer
    attn_input_scale: list[torch.Tensor] = field(default_factory=list)  # (hidden,): q/k/v columns ×, norm ÷
    mlp_input_scale: list[torch.Tensor] = field(default_factory=list)  # (hidden,): gate/up columns ×, norm ÷

    @classmethod
    def identity(cls, config) -> FptSpec:
        """No transform at all (the starting point of calibration): unit scales, no rotation, norms kept."""
        n, kv, hd = config.num_hidden_layers, config.num_key_value_heads, _head_dim(config)
        ones = torch.ones
        return cls(None, [], [], None, [ones(config.intermediate_size) for _ in range(n)],
                   [ones(kv * hd) for _ in range(n)], [ones(kv * hd // 2) for _ in range(n)],
                   [ones(config.hidden_size) for _ in range(n)], [ones(config.hidden_size) for _ in range(n)])

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        tensors = {}
        if self.rotation is not None:
            tensors["rotation"] = self.rotation
        if self.gamma_final is not None:
            tensors["gamma_final"] = self.gamma_final
        for key in INDEXED:
            for i, t in enumerate(getattr(self, key)):
                tensors[f"{key}.{i}"] = t
        save_file({k: v.float().contiguous() for k, v in tensors.items()}, str(Path(folder) / SPEC_FILE))

    def same_transforms(self, other: FptSpec) -> bool:
        """Whether `other` merges the same scales and rotation (the folded norm weights, filled in while merging,
        are not compared)."""
        def listed(spec, key):
            return [t.float() for t in getattr(spec, key)]

        if (self.rotation is None) != (other.rotation is None) or (
                self.rotation is not None and not torch.equal(self.rotation.float(), other.rotation.float())):
            return False
        for key in ("mlp_scale", "value_scale", "key_scale", "attn_input_scale", "mlp_input_scale"):
            mine, theirs = listed(self, key), listed(other, key)
            if len(mine) != len(theirs) or not all(
                    a.shape == b.shape and torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)):
                return False
        return True

    @classmethod
    def load(cls, folder: Path) -> FptSpec | None:
        from safetensors.torch import load_file

        path = Path(folder) / SPEC_FILE
        if not path.is_file():
            return None
        t = load_file(str(path))

        def listed(key):
            return [t[f"{key}.{i}"] for i in range(sum(k.startswith(key + ".") for k in t))]

        return cls(t.get("rotation"), listed("gamma_attn"), listed("gamma_mlp"), t.get("gamma_final"),
                   listed("mlp_scale"), listed("value_scale"), listed("key_scale"), listed("attn_input_scale"),
                   listed("mlp_input_scale"))


INDEXED = ("gamma_attn", "gamma_mlp", "mlp_scale", "value_scale", "key_scale", "attn_input_scale", "mlp_input_scale")


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _pairs_to_dims(rho: torch.Tensor, heads_per_kv: int, half: int, kv: int) -> torch.Tensor:
    """(kv · half,) pair scales -> (kv · heads_per_kv · 2·half,) per output row of q_proj (heads_per_kv > 1)
    or k_proj (heads_per_kv = 1): dims j and j + half of a head share their pair's scale."""
    per_head = rho.view(kv, 1, half).repeat(1, 1, 2)  # rotate_half pairs dim j with j + half
    return per_head.expand(kv, heads_per_kv, 2 * half).reshape(-1)


Map = torch.Tensor | None  # a vector = diagonal matrix; a 2-D tensor = dense; None = identity


def module_maps(spec: FptSpec, config, name: str) -> tuple[Map, Map]:
    """(L, R) of one linear, by its dotted name: the transformed weight is L·W·R and its bias L·b."""
    parts = name.split(".")
    leaf = parts[-1]
    if leaf == "lm_head":
        return None, _reader(spec.gamma_final, spec.rotation)
    i = int(parts[parts.index("layers") + 1])
    kv, hd = config.num_key_value_heads, _head_dim(config)
    group = config.num_attention_heads // kv
    if leaf in ("q_proj", "k_proj", "v_proj"):
        right = _reader(spec.gamma_attn[i] if spec.gamma_attn else None, spec.rotation, spec.attn_input_scale[i])
        if leaf == "q_proj":
            return 1.0 / _pairs_to_dims(spec.key_scale[i], group, hd // 2, kv), right
        if leaf == "k_proj":
            return _pairs_to_dims(spec.key_scale[i], 1, hd // 2, kv), right
        return spec.value_scale[i], right
    if leaf == "o_proj":
        inv = (1.0 / spec.value_scale[i]).view(kv, 1, hd).expand(kv, group, hd).reshape(-1)
        return _writer(spec.rotation), inv
    if leaf in ("gate_proj", "up_proj"):
        right = _reader(spec.gamma_mlp[i] if spec.gamma_mlp else None, spec.rotation, spec.mlp_input_scale[i])
        return (spec.mlp_scale[i] if leaf == "up_proj" else None), right
    if leaf == "down_proj":
        return _writer(spec.rotation), 1.0 / spec.mlp_scale[i]
    raise ValueError(f"no transform known for module {name!r}")


def _reader(gamma: torch.Tensor | None, rotation: torch.Tensor | None, scale: torch.Tensor | None = None) -> Map:
    """R of a linear reading a (folded) RMSNorm: diag(γ)·Q·diag(c) with a rotation, diag(c) without one."""
    if rotation is None:
        return scale
    m = rotation if gamma is None else gamma[:, None] * rotation
    return m if scale is None else m * scale


def _writer(rotation: torch.Tensor | None) -> Map:
    return None if rotation is None else rotation.t()


def left(m: Map, w: torch.Tensor) -> torch.Tensor:
    """L·w for w of shape (out, ...) ."""
    if m is None:
        return w
    if m.dim() == 1:
        return w * m.view(-1, *([1] * (w.dim() - 1)))
    return m @ w


def right(w: torch.Tensor, m: Map) -> torch.Tensor:
    """w·R for w of shape (..., in)."""
    if m is None:
        return w
    return w * m if m.dim() == 1 else w @ m


LINEAR_LEAVES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@torch.no_grad()
def apply_fpt(model: nn.Module, spec: FptSpec) -> nn.Module:
    """Rewrite the model's weights in place (float32 math, stored back in their dtype); returns the model.

    With a rotation the RMSNorm weights become ones (folded, their values kept in `spec`) and the LM head is
    untied from the embedding (the two now hold different matrices)."""
    config = model.config
    inner = model.model
    if spec.rotation is not None:
        spec.gamma_attn = [layer.input_layernorm.weight.detach().float().clone() for layer in inner.layers]
        spec.gamma_mlp = [layer.post_attention_layernorm.weight.detach().float().clone() for layer in inner.layers]
        spec.gamma_final = inner.norm.weight.detach().float().clone()
        head = model.lm_head.weight.detach().float().clone()
        emb = inner.embed_tokens.weight
        emb.copy_((emb.float() @ spec.rotation).to(emb.dtype))
        model.lm_head.weight = nn.Parameter(right(head, module_maps(spec, config, "lm_head")[1]).to(emb.dtype),
                                            requires_grad=False)
        config.tie_word_embeddings = False
        if hasattr(model, "_tied_weights_keys"):
            model._tied_weights_keys = None
        for norm in [inner.norm] + [n for layer in inner.layers for n in (layer.input_layernorm,
                                                                           layer.post_attention_layernorm)]:
            norm.weight.fill_(1.0)
    for i in range(len(inner.layers)):
        merge_layer(model, spec, i)
    model.ponder_fpt = spec
    return model


@torch.no_grad()
def merge_layer(model: nn.Module, spec: FptSpec, index: int) -> None:
    """One decoder layer's share of `apply_fpt` (its two norms and seven linears), in float32 math, stored back in
    the layer's dtype: W4-FPT preparation merges and rounds one layer at a time (`gptq_layers`' `before`)."""
    layer = model.model.layers[index]
    for norm, scale in ((layer.input_layernorm, spec.attn_input_scale[index]),  # the norms emit x / c,
                        (layer.post_attention_layernorm, spec.mlp_input_scale[index])):  # the readers take c
        norm.weight.copy_((norm.weight.float() / scale).to(norm.weight.dtype))
    for name, module in layer.named_modules():
        if name.rpartition(".")[2] not in LINEAR_LEAVES or not isinstance(module, nn.Linear):
            continue
        lmap, rmap = module_maps(spec, model.config, f"model.layers.{index}.{name}")
        w = module.weight
        w.copy_(left(lmap, right(w.float(), rmap)).to(w.dtype))
        if module.bias is not None:
            module.bias.copy_(left(lmap, module.bias.float()).to(module.bias.dtype))


def invert(m: Map) -> Map:
    if m is None:
        return None
    return 1.0 / m if m.dim() == 1 else torch.linalg.inv(m.double()).float()


def fpt_of(model: nn.Module) -> FptSpec | None:
    """The transform merged into `model` (or into the base of a peft model), None for an untransformed one."""
    for m in (model, getattr(model, "base_model", None), getattr(getattr(model, "base_model", None), "model", None)):
        spec = getattr(m, "ponder_fpt", None) if m is not None else None
        if spec is not None:
            return spec
    return None


def transform_lora_state(state: dict[str, torch.Tensor], spec: FptSpec, config,
                         inverse: bool = False) -> dict[str, torch.Tensor]:
    """LoRA factors of an adapter trained on the original basis, moved to the transformed one:
    A' = A·R, B' = L·B for every adapted linear (keys as peft saves them, `...q_proj.lora_A.weight`);
    `inverse` moves factors trained on the transformed model back (A = A'·R⁻¹, B = L⁻¹·B'), the form saved."""
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        kind = next((p for p in parts if p in ("lora_A", "lora_B")), None)
        module = next((p for p in parts if p in LINEAR_LEAVES), None)
        if kind is None or module is None:
            out[key] = value
            continue
        name = ".".join(parts[: parts.index(module) + 1])
        lmap, rmap = module_maps(spec, config, name)
        if inverse:
            lmap, rmap = invert(lmap), invert(rmap)
        v = value.float()
        out[key] = (right(v, rmap) if kind == "lora_A" else left(lmap, v)).to(value.dtype).contiguous()
    return out


@torch.no_grad()
def transform_head(head: nn.Module, spec: FptSpec) -> nn.Module:
    """A switcher/verifier head (Standardize then Linear on the final normed hidden state) rewritten in place to
    read the transformed model's state: x_old = x_new·Fᵀ with F = diag(γ_final)·Q, so the first linear becomes
    W·diag(1/σ)·F, the mean μ·F⁻ᵀ and σ = 1. Exact up to float rounding. (Heads trained on a transformed model
    are trained on features mapped back first: core.training.heads.original_basis.)"""
    if spec.rotation is None:
        return head
    feature = spec.gamma_final[:, None] * spec.rotation  # F
    first = next(m for m in head.modules() if isinstance(m, nn.Linear))
    norm = head.norm
    first.weight.copy_((first.weight.float() / norm.std.float()) @ feature)
    norm.mean.copy_(norm.mean.float() @ (spec.rotation / spec.gamma_final[:, None]))  # μ·diag(1/γ)·Q = μ·F⁻ᵀ
    norm.std.fill_(1.0)
    return head
