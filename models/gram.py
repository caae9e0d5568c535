"""XᵀX of GPTQ's calibration inputs (the Hessians), the products that dominate its cost on 2 cores.

Only the blocks on and above the diagonal are computed. Where the CPU's int8 products are exact (VNNI), x is
written as two int8 digits per value and column and XᵀX comes from four exact int32 products, at about 8x
float32's rate each on a 2-core EPYC; elsewhere the product is float32.
"""
from __future__ import annotations

import functools

import torch

from .scratch import scratch

try:
    from models import _gptq  # the digits in C (models/_gptq.c), built at install where a compiler is
except ImportError:
    _gptq = None

GRAM_BLOCK = 1024
"""XᵀX of wider inputs is summed over blocks of this many columns, the upper ones only (down_proj: 62% of a GEMM)."""
GRAM_TOKENS = 65536
"""int8 products of XᵀX sum at most this many tokens (each within int32: 65536·127² < 2³¹)."""


def add_gram(acc: torch.Tensor, x: torch.Tensor) -> None:
    """acc += xᵀx (acc symmetric, float32), computing only the blocks on and above the diagonal.

    Where the CPU's int8 products are exact and fast (VNNI: 1.7 TOP/s on a 2-core EPYC against float32's 0.2
    TFLOP/s), x is written as two int8 digits per value and column, x = s·(q₁ + q₂/254) (|x − that| ≤ max|x|/64516),
    and xᵀx = s·(q₁ᵀq₁ + (q₁ᵀq₂ + q₂ᵀq₁)/254 + q₂ᵀq₂/254²)·s from four exact int32 sums (the last is not
    negligible for a column whose values are mostly far below its largest). Elsewhere the product is float32.
    torch's bf16 products are not used: they round their output to bf16, noise as large as GPTQ's damping,
    which can leave H not positive definite."""
    if int8_gram_exact():
        for t in range(0, x.shape[0], GRAM_TOKENS):
            _add_upper_int8(acc, x[t:t + GRAM_TOKENS])
    else:
        _add_upper(acc, x.float())
    d = x.shape[1]
    for i in range(GRAM_BLOCK, d, GRAM_BLOCK):  # mirror the upper blocks into the lower ones
        acc[i:i + GRAM_BLOCK, :i] = acc[:i, i:i + GRAM_BLOCK].t()


def _add_upper(acc: torch.Tensor, x: torch.Tensor) -> None:
    d = x.shape[1]
    xt = x.t().contiguous() if d > GRAM_BLOCK else x.t()
    for i in range(0, d, GRAM_BLOCK):
        acc[i:i + GRAM_BLOCK, i:].addmm_(xt[i:i + GRAM_BLOCK], x[:, i:])


def int8_digits(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q₁, q₂ int8, s float32 per column) with x ≈ s·(q₁ + q₂/254); in C where built (two passes over x
    instead of ten), the same digits."""
    if _gptq is not None and hasattr(_gptq, "int8_digits") and x.dtype in (torch.float32, torch.bfloat16):
        x = x.contiguous()
        n, d = x.shape
        q1, q2 = scratch("digits1", (n, d), torch.int8), scratch("digits2", (n, d), torch.int8)
        scale = torch.empty(d)
        _gptq.int8_digits(x.data_ptr(), int(x.dtype == torch.bfloat16), n, d, scale.data_ptr(), q1.data_ptr(),
                          q2.data_ptr())
        return q1, q2, scale
    x = x.float()
    scale = x.abs().amax(0).clamp_(min=1e-30) / 127
    r = x / scale
    q1 = r.round()
    q2 = r.sub_(q1).mul_(254).round_()
    return q1.to(torch.int8), q2.to(torch.int8), scale


def _add_upper_int8(acc: torch.Tensor, x: torch.Tensor) -> None:
    """The four products take the column blocks as transposed views (oneDNN reads them at the same speed; copying
    q₁ᵀ and q₂ᵀ cost 0.5 s for the 1.5B's down_proj) and sum in int32 where that is exact (the two cross terms:
    2·65536·127² < 2³¹), converting to float once per product pair."""
    q1, q2, scale = int8_digits(x)
    d = x.shape[1]
    for i in range(0, d, GRAM_BLOCK):  # the products go to reused buffers (fresh pages cost: models/scratch.py)
        a1, a2 = q1[:, i:i + GRAM_BLOCK].t(), q2[:, i:i + GRAM_BLOCK].t()
        shape = (a1.shape[0], d - i)
        p1, p2 = scratch("gram_p1", shape, torch.int32), scratch("gram_p2", shape, torch.int32)
        block, outer = scratch("gram_block", shape), scratch("gram_outer", shape)
        block.copy_(torch._int_mm(a1, q1[:, i:], out=p1))
        torch._int_mm(a1, q2[:, i:], out=p1)
        block.add_(p1.add_(torch._int_mm(a2, q1[:, i:], out=p2)), alpha=1 / 254)
        block.add_(torch._int_mm(a2, q2[:, i:], out=p2), alpha=1 / (254 * 254))
        torch.mul(scale[i:i + GRAM_BLOCK, None], scale[None, i:], out=outer)
        acc[i:i + GRAM_BLOCK, i:] += block.mul_(outer)  # symmetric


@functools.cache
def int8_gram_exact() -> bool:
    """Whether torch's int8 products are exact here, checked on full-range values (`PONDER_GPTQ_INT8=0`: never).
    On x86 CPUs without VNNI oneDNN sums u8·s8 pairs in saturating int16 and is not; with VNNI they are exact
    and four of them take half a float32 product's time (3.1 against 5.2 s for the 1.5B's down_proj)."""
    import os

    if os.environ.get("PONDER_GPTQ_INT8", "1") == "0":
        return False
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (512, 2048), dtype=torch.int8, generator=gen)
    b = torch.randint(-127, 128, (2048, 512), dtype=torch.int8, generator=gen)
    a[0], b[:, 0] = 127, 127  # the extreme pair sums too
    try:
        got = torch._int_mm(a, b)
    except RuntimeError:
        return False
    return torch.equal(got, (a.to(torch.int32) @ b.to(torch.int32)))
