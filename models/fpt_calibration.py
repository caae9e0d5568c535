"""Calibrating FPTQuant° parameters on a small text set, one layer at a time (no end-to-end training).

The inputs of down_proj and o_proj and the keys are the same before and after the residual rotation, so one
pass of the original model collects them all. Per layer:
- MLP scale s: down_proj columns are multiplied by a^α (a = mean |input| per channel, AWQ's saliency) and the
  inputs divided by it; α ∈ {0, 0.1, …, 1} is the one whose int4 (group-wise, min-max) output error is least.
- value scale t: the same search on o_proj, over KV channels (a query group shares its KV head's scale), with
  the error of an int8 per-(token, head) rounding of the scaled values added, as the KV cache stores them.
- reader input scale c: the same search on q/k/v (and on gate/up) together, c divided out of the RMSNorm weight.
- key scale ρ: per rotary pair, ρ = m^−α (m = RMS of the pair's key values); α is the one whose int8
  per-(token, head) key rounding changes the attention logits q·k least.
α = 0 is the identity, so a layer never gets a transform that measures worse than none.
"""
from __future__ import annotations

import torch
from torch import nn

from . import int4_grid
from .fpt import FptSpec, _head_dim, apply_fpt, merge_layer, random_rotation

ALPHAS = tuple(i / 10 for i in range(11))
KEY_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
ROWS_KEPT = 1024


def fake_int4(w: torch.Tensor, group: int) -> torch.Tensor:
    """Asymmetric min-max int4 rounding per `group` inputs of each output row (how the W4 layers are stored)."""
    return int4_grid.fake_quantize(w, group)


def fake_int8_rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """Symmetric absmax int8 per consecutive `width` values of each row (the KV cache's per-(token, head) rounding)."""
    g = x.reshape(*x.shape[:-1], -1, width)
    scale = g.abs().amax(-1, keepdim=True).clamp_(min=1e-8) / 127
    return ((g / scale).round_().clamp_(-127, 127) * scale).reshape(x.shape)


def _normalised(v: torch.Tensor) -> torch.Tensor:
    """Scales with geometric mean 1 (so the weights keep their overall magnitude)."""
    return v / v.log().mean().exp()


SITES = {"down": ("mlp.down_proj", True), "o": ("self_attn.o_proj", True), "q": ("self_attn.q_proj", False),
         "k": ("self_attn.k_proj", False), "attn_in": ("self_attn.q_proj", True), "mlp_in": ("mlp.gate_proj", True)}
"""What is collected per layer: name -> (module, its input (True) or output)."""


@torch.no_grad()
def collect(model: nn.Module, batches: list[torch.Tensor], rows: int = ROWS_KEPT, seed: int = 0) -> list[dict]:
    """Per layer, the same `rows` random token positions of: down_proj and o_proj inputs, q_proj and k_proj
    outputs, and the inputs of q_proj and gate_proj (the two RMSNorm outputs). Sampled batch by batch."""
    gen = torch.Generator().manual_seed(seed)
    layers = model.model.layers
    taken: list[dict[str, list[torch.Tensor]]] = [{k: [] for k in SITES} for _ in layers]
    pick: list[torch.Tensor] = []
    hooks = []
    for i, layer in enumerate(layers):
        for key, (path, use_input) in SITES.items():
            def hook(mod, args, output, i=i, key=key, use_input=use_input):
                x = args[0] if use_input else output
                taken[i][key].append(x.detach().reshape(-1, x.shape[-1])[pick[0]].float())
            hooks.append(layer.get_submodule(path).register_forward_hook(hook))
    per_batch = max(1, rows // len(batches))
    try:
        for ids in batches:
            pick[:] = [torch.randperm(ids.numel(), generator=gen)[:per_batch]]
            model(input_ids=ids.view(1, -1), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return [{k: torch.cat(v) for k, v in per.items()} for per in taken]


def _best_scale(x: torch.Tensor, w: torch.Tensor, saliency: torch.Tensor, expand, group: int,
                kv_width: int | None = None) -> torch.Tensor:
    """The column multiplier c (per saliency channel) minimising ‖x·wᵀ − (x/c)·int4(w·c)ᵀ‖², c = a^α."""
    reference = x @ w.t()
    best, best_err = torch.ones_like(saliency), None
    for alpha in ALPHAS:
        c = _normalised(saliency.clamp(min=1e-6) ** alpha)
        col = expand(c)
        xs = x / col
        if kv_width:  # the values are stored in int8: round them as the cache would (scaled by 1/c)
            xs = fake_int8_rows(xs, kv_width)
        err = float(((xs @ fake_int4(w * col, group).t()) - reference).pow(2).sum())
        if best_err is None or err < best_err:
            best, best_err = c, err
    return best


def _best_key_scale(q: torch.Tensor, k: torch.Tensor, kv: int, group: int, hd: int) -> torch.Tensor:
    """ρ per (kv head, pair) minimising the change of q·k when the scaled keys are rounded to int8 per head."""
    half = hd // 2
    kh = k.view(-1, kv, 2, half)  # (n, kv, 2, half): dims j and j + half of each head
    rms = kh.pow(2).mean((0, 2)).sqrt().clamp(min=1e-6)  # (kv, half)
    qh = q.view(-1, kv, group, 2, half)
    reference = torch.einsum("nkgph,mkph->kgnm", qh, kh)
    best, best_err = torch.ones(kv, half), None
    for alpha in KEY_ALPHAS:
        rho = torch.stack([_normalised(r) for r in rms ** -alpha])  # (kv, half)
        ks = fake_int8_rows((kh * rho[None, :, None, :]).reshape(-1, kv * hd), hd).view(-1, kv, 2, half)
        qs = qh / rho[None, :, None, None, :]
        err = float((torch.einsum("nkgph,mkph->kgnm", qs, ks) - reference).pow(2).sum())
        if best_err is None or err < best_err:
            best, best_err = rho, err
    return best.reshape(-1)


@torch.no_grad()
def calibrate(model: nn.Module, batches: list[torch.Tensor], group: int = 128, rotate: bool = True,
              scales: bool = True, seed: int = 0) -> FptSpec:
    """The FptSpec for `model` (untransformed) from calibration token batches (1-D id tensors)."""
    config = model.config
    spec = FptSpec.identity(config)
    spec.rotation = random_rotation(config.hidden_size, seed) if rotate else None
    if not scales:
        return spec
    kv, hd = config.num_key_value_heads, _head_dim(config)
    heads_per_kv = config.num_attention_heads // kv
    stats = collect(model, batches, seed=seed)
    for i, (layer, s) in enumerate(zip(model.model.layers, stats, strict=True)):
        rot_t = spec.rotation.t() if spec.rotation is not None else None
        for key, norm, names, out in (("attn_in", layer.input_layernorm, ("q_proj", "k_proj", "v_proj"),
                                       spec.attn_input_scale),
                                      ("mlp_in", layer.post_attention_layernorm, ("gate_proj", "up_proj"),
                                       spec.mlp_input_scale)):
            parent = layer.self_attn if key == "attn_in" else layer.mlp
            w = torch.cat([getattr(parent, n).weight.float() for n in names])
            x = s[key]
            if spec.rotation is not None:  # the readers see (x / γ)·Q and hold W·diag(γ)·Q
                gamma = norm.weight.float()
                x, w = (x / gamma) @ spec.rotation, (w * gamma) @ spec.rotation
            out[i] = _best_scale(x, w, x.abs().mean(0), lambda c: c, group)
        down = layer.mlp.down_proj.weight.float()
        down = rot_t @ down if rot_t is not None else down
        col = _best_scale(s["down"], down, s["down"].abs().mean(0), lambda c: c, group)
        spec.mlp_scale[i] = 1.0 / col
        o = layer.self_attn.o_proj.weight.float()
        o = rot_t @ o if rot_t is not None else o
        sal = s["o"].abs().mean(0).view(kv, heads_per_kv, hd).mean(1).reshape(-1)

        def expand(c):
            return c.view(kv, 1, hd).expand(kv, heads_per_kv, hd).reshape(-1)

        col = _best_scale(s["o"], o, sal, expand, group, kv_width=hd)
        spec.value_scale[i] = 1.0 / col
        spec.key_scale[i] = _best_key_scale(s["q"], s["k"], kv, heads_per_kv, hd)
    return spec


def quantize_w4_fpt(model: nn.Module, batches: list[torch.Tensor], head_bits: int = 4, group: int = 128,
                    rotate: bool = False, report=None, spec: FptSpec | None = None,
                    gptq_tokens: int | None = None, layer_by_layer: bool = True) -> nn.Module:
    """`w4-fpt`: merge the transforms into `model` (bf16, untransformed) in float32, round every int4 layer by GPTQ
    on the transformed weights, and pack (returns the quantized model, its spec attached). `spec`: the transforms
    fitted once for this model and shipped (none: calibrate them here first, a further pass over the texts).
    `gptq_tokens`: GPTQ's Hessians see each text's first this many tokens (None: all of each batch).
    `report(done, total)` follows the steps (calibration if any, then GPTQ's: `models.gptq.progress_steps`).
    `layer_by_layer`: merge each layer in float32 just before it is rounded, the rest staying bf16, instead of
    the whole model at once (a rotation needs the latter: it rewrites the embedding and head too). It is the
    faster path as well as the leaner one: converting the 1.5B to float32 whole took 12-20 s of fresh pages on a
    2-core EPYC, and the 0.5B prepared in 63 s against 72 (one run each); the 1.5B peaks at 9.0 GiB (9,457,220 KiB).
    The codes are the same."""
    from .gptq import codes_fingerprint, gptq_layers, progress_steps
    from .quantization import packs_int4, quantize_model

    first, before, after = 0, None, None
    if spec is None:
        model.float()
        spec = calibrate(model, batches, group=group, rotate=rotate)
        first = 1
    if spec.rotation is None and layer_by_layer:  # one layer in float32 at a time
        layers, home = model.model.layers, model.model.norm.weight.dtype

        def before(i):
            layers[i].float()
            merge_layer(model, spec, i)

        def after(i):
            layers[i].to(home)  # quantize_model casts it to bf16 anyway: the codes are taken by then
        model.ponder_fpt = spec
    else:  # the whole model in float32: a rotation rewrites the embedding and head too
        model.float()
        apply_fpt(model, spec)
    names = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and packs_int4(m, group)
             and (name != "lm_head" or head_bits == 4)]
    if report and first:
        report(1, progress_steps(model, names) + 2)
    gptq_batches = [b[:gptq_tokens] for b in batches] if gptq_tokens else batches
    codes = gptq_layers(model, gptq_batches, names, group,
                        report and (lambda d, t: report(first + d, first + t + 1)), before=before, after=after)
    quantized = quantize_model(model, 4, head_bits, group, int4_codes=codes)
    quantized.ponder_codes = codes_fingerprint(codes)
    return quantized
