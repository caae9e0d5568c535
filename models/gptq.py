"""Error-compensating int4 rounding (GPTQ) onto torch's packed CPU int4 layout.

Round-to-nearest treats every weight alone; GPTQ rounds one input column at a time and moves the rounding
error onto the columns not yet rounded, weighted by the inverse Hessian H = XᵀX of the layer's calibration
inputs, so the layer's *output* error is what gets minimised. Groups are the kernel's (one bf16 scale and zero
point per `group` inputs of an output row, w = (q − 8)·scale + zero); each group's grid is fitted when the
algorithm reaches it, with its range clipped by the ratio that minimises the Hessian-diagonal-weighted error.
Used by `w4-fpt` after the FPTQuant° transforms (the paper trains its grids end to end; this is our stand-in).
"""
from __future__ import annotations

import torch
from torch import nn

CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8)
DAMP = 0.01


def _grid(w: torch.Tensor, importance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of w (n, group): bf16-exact (scale, zero) of the clipped min-max grid with least weighted error."""
    lo, hi = w.amin(1), w.amax(1)
    mid = (lo + hi) / 2
    best = None
    for ratio in CLIP_RATIOS:
        clo, chi = mid + (lo - mid) * ratio, mid + (hi - mid) * ratio
        scale = ((chi - clo) / 15).clamp(min=1e-8).to(torch.bfloat16).float()
        zero = (clo + 8 * scale).to(torch.bfloat16).float()
        q = ((w - zero[:, None]) / scale[:, None] + 8).round_().clamp_(0, 15)
        err = (((q - 8) * scale[:, None] + zero[:, None] - w).pow(2) * importance).sum(1)
        if best is None:
            best = [err, scale, zero]
        else:
            better = err < best[0]
            best = [torch.where(better, e, b) for e, b in zip((err, scale, zero), best, strict=True)]
    return best[1], best[2]


@torch.no_grad()
def gptq_int4(w: torch.Tensor, hessian: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes (n, k) int32 in 0..15, scale and zero (n, k / group) bf16 for weight w (n, k) given H (k, k)."""
    W = w.float().clone()
    n, k = W.shape
    H = hessian.double().clone()
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += DAMP * torch.diagonal(H).mean() * torch.eye(k, dtype=H.dtype)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True).float()
    diag = torch.diagonal(H).float()
    codes = torch.empty(n, k, dtype=torch.int32)
    scales = torch.empty(n, k // group)
    zeros = torch.empty(n, k // group)
    for g, i1 in enumerate(range(0, k, group)):
        i2 = i1 + group
        block, errors, h = W[:, i1:i2].clone(), torch.empty(n, group), hinv[i1:i2, i1:i2]
        scale, zero = _grid(block, diag[i1:i2])
        scales[:, g], zeros[:, g] = scale, zero
        for i in range(group):
            col = block[:, i]
            q = ((col - zero) / scale + 8).round_().clamp_(0, 15)
            codes[:, i1 + i] = q.to(torch.int32)
            err = (col - ((q - 8) * scale + zero)) / h[i, i]
            block[:, i:] -= err[:, None] * h[i, i:][None, :]
            errors[:, i] = err
        W[:, i2:] -= errors @ hinv[i1:i2, i2:]
    return codes, scales.to(torch.bfloat16), zeros.to(torch.bfloat16)


def set_int4(module: nn.Module, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> None:
    """Replace the packed int4 weight of a quantized linear (torch's CPU layout) by these codes and grid."""
    w = module.weight
    w._data._data = torch._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
    w._scale_shift = torch.stack((scale.t(), zero.t()), -1).contiguous()  # (k / group, n, 2)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> torch.Tensor:
    """The (n, k) float weight the codes stand for, as the kernel computes it."""
    s = scale.float().repeat_interleave(group, 1)
    z = zero.float().repeat_interleave(group, 1)
    return (codes.float() - 8) * s + z


def _input_sites(model: nn.Module, names: list[str]) -> dict[str, list[str]]:
    """Linears that read the same input share one Hessian: site (first name) -> every name reading it."""
    sites: dict[str, list[str]] = {}
    for name in names:
        parts = name.rsplit(".", 1)
        leaf = parts[-1]
        share = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(leaf)
        key = f"{parts[0]}.{share}" if share and f"{parts[0]}.{share}" in names else name
        sites.setdefault(key, []).append(name)
    return sites


@torch.no_grad()
def hessians(model: nn.Module, batches: list[torch.Tensor], sites: list[str]) -> dict[str, torch.Tensor]:
    """XᵀX (float32) of the inputs of each named linear over all calibration tokens."""
    modules = dict(model.named_modules())
    acc = {name: torch.zeros(modules[name].in_features, modules[name].in_features) for name in sites}
    hooks = []
    for name in sites:
        def hook(mod, args, output, name=name):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            acc[name].addmm_(x.t(), x)
        hooks.append(modules[name].register_forward_hook(hook))
    try:
        for ids in batches:
            model(input_ids=ids.view(1, -1), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return acc


HESSIAN_BUDGET = 3 * 2**30
"""Bytes of Hessians held at once; a model needing more is calibrated in several passes of the text set."""


@torch.no_grad()
def gptq_round(model: nn.Module, batches: list[torch.Tensor], names: list[str], group: int,
               report=None) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """GPTQ codes for the named linears of a float model (already transformed): name -> (codes, scale, zero).
    The Hessians are collected in passes whose size HESSIAN_BUDGET bounds; `report(done, total)` per input site."""
    modules = dict(model.named_modules())
    sites = _input_sites(model, names)
    order = list(sites)
    out = {}
    while order:
        chunk, size = [], 0
        while order and (not chunk or size + modules[order[0]].in_features ** 2 * 4 <= HESSIAN_BUDGET):
            size += modules[order[0]].in_features ** 2 * 4
            chunk.append(order.pop(0))
        found = hessians(model, batches, chunk)
        for site in chunk:
            h = found.pop(site)
            for name in sites[site]:
                out[name] = gptq_int4(modules[name].weight.float(), h, group)
            if report:
                report(len(sites) - len(order) - len(found), len(sites))
        del found
    return out
