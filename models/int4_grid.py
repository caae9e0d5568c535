"""The int4 group grid every int4 weight in Ponder is rounded to: one convention, one place.

A group of `group` consecutive inputs of one output row shares a (scale, zero): a weight w is stored as a code
q in 0..15 and stands for (q − 8)·scale + zero, which is what torch's packed int4 kernels and Ponder's own
(models/_int4.c) compute. Codes round to nearest, `round((w − zero) / scale + 8)`, clamped to 0..15. The grid of
a group is min-max (scale = (max − min) / 15, zero = min + 8·scale), optionally clipped toward its midpoint
(GPTQ searches the clip) and made bf16-exact (the kernels read scale and zero in bf16, so codes are chosen
against the values that will be used). torch's CPU packing is `pack`, the (scale, zero) tensor it reads
`scales_zeros`. Users: GPTQ (models.gptq), FPTQuant's calibration objective (models.fpt_calibration) and
Caprese branches folded into packed blocks (core.sparse.ff); quanto's W4 rounding (plain W4) is min-max too.
"""
from __future__ import annotations

import torch

LEVELS = 15
"""Largest code: 16 levels, 0..15."""
MID = 8
"""The code that stands for `zero`."""
MIN_SCALE = 1e-8


def minmax(g: torch.Tensor, clip: float | None = None, *, bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) of each row of g (..., group): the min-max grid, its range scaled by `clip` about its
    midpoint when given (GPTQ's search, models/_gptq.c computes the same); with `bf16`, both rounded to bfloat16
    values (kept as float32)."""
    lo, hi = g.amin(-1), g.amax(-1)
    if clip is not None:
        mid = (lo + hi) / 2
        lo, hi = mid + (lo - mid) * clip, mid + (hi - mid) * clip
    scale = ((hi - lo) / LEVELS).clamp(min=MIN_SCALE)
    if bf16:
        scale = scale.to(torch.bfloat16).float()
    zero = lo + MID * scale
    if bf16:
        zero = zero.to(torch.bfloat16).float()
    return scale, zero


def codes(g: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 (float) of g (..., group) on the grid (scale, zero) of shape (...)."""
    return ((g - zero[..., None]) / scale[..., None] + MID).round_().clamp_(0, LEVELS)


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """What codes q (..., group) stand for on the grid (scale, zero) of shape (...)."""
    return (q - MID) * scale[..., None] + zero[..., None]


def fake_quantize(w: torch.Tensor, group: int) -> torch.Tensor:
    """w (n, k) rounded to its min-max int4 grid per `group` inputs and back, in float."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    scale, zero = minmax(g)
    return dequantize(codes(g, scale, zero), scale, zero).reshape(n, k)


def pack(q: torch.Tensor) -> torch.Tensor:
    """Codes (n, k) in torch's packed CPU layout for this CPU's capability (what both int4 kernels read)."""
    return torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)


PACKINGS = {"AVX512": (64, True), "AVX2": (32, True), "DEFAULT": (32, False)}
"""torch's int4 CPU packing per CPU capability in its x86-64 builds other than Windows' (`weight_to_int4pack_kernel`
in ATen's int4mm_kernel.cpp; MSVC builds and ARM pack otherwise): outputs in blocks of `block`, each block's inputs
one line after another, a line holding the block's width / 2 bytes. A whole block of a vectorized capability (the
flag) holds output j in byte j's low nibble and output j + block / 2 in its high one; every other block (a shorter
last one, or any block of the plain build) holds outputs 2m and 2m + 1 in byte m. A slice of whole blocks is packed
on its own exactly as within the matrix, so a matrix can be moved block-row by block-row."""


def packings_known() -> bool:
    """Whether PACKINGS describes this build's packing: x86-64 outside Windows, and `unpack` reads what `pack`
    writes here (a matrix with a shorter last block, checked once)."""
    import platform
    import sys

    if sys.platform == "win32" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in PACKINGS:
        return False
    q = torch.randint(0, 16, (80, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    return torch.equal(unpack(pack(q), 80, 64, capability).int(), q)


def unpack(packed: torch.Tensor, n: int, k: int, capability: str) -> torch.Tensor:
    """Codes (n, k) uint8 of a matrix that `pack` packed under `capability` (one of PACKINGS): how a prepared
    model moves to a CPU whose kernels read another packing without being prepared again."""
    if packed.dtype == torch.int8:
        raise ValueError("int4 codes in Ponder's p32 layout: read models.int4_kernel.torch_layout(...) instead")
    block, split = PACKINGS[capability]
    flat = packed.reshape(-1)
    if n % 16 or k % 2 or flat.numel() != n * k // 2:
        raise ValueError(f"not a packed int4 matrix of {n} x {k}")
    whole = n // block if split else 0
    parts = []
    if whole:
        lines = flat[: whole * block * k // 2].view(whole, k, block // 2)
        parts.append(torch.cat([lines & 15, lines >> 4], 2).transpose(1, 2).reshape(whole * block, k))
    for start in range(whole * block, n, block):
        width = min(block, n - start)
        lines = flat[start * k // 2: (start + width) * k // 2].view(k, width // 2)
        parts.append(torch.stack([lines & 15, lines >> 4], 2).reshape(k, width).t())
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)


def scales_zeros(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """(n, k / group) scales and zeros as the kernels read them: (k / group, n, 2) bf16."""
    return torch.stack((scale.t(), zero.t()), -1).to(torch.bfloat16).contiguous()


def quantize_packed(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes, scales and zeros) of float w (n, k) on its bf16-exact min-max grid per `group` inputs."""
    n, k = w.shape
    g = w.float().view(n, k // group, group)
    scale, zero = minmax(g, bf16=True)
    return pack(codes(g, scale, zero).view(n, k)), scales_zeros(scale, zero)
