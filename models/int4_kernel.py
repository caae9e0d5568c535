"""The int4 matmul every decode step runs: Ponder's own kernel for up to 16 rows, torch's packed kernel otherwise.

`models/_int4.c` reads torch's packed int4 layout as it is (no second copy of the weights) and computes
x @ W.T for 1..16 bf16 rows with AVX512-BF16 (see its header). It is built at install as an optional C
extension; where it could not be built, where the CPU lacks AVX512-BF16/VBMI, or where `PONDER_INT4_KERNEL=torch`
is set, every call goes to torch's `_weight_int4pack_mm_for_cpu`. Each row's arithmetic is the same whatever
the number of rows, so batched and one-at-a-time decoding give the same tokens on either kernel.
"""
from __future__ import annotations

import os

import torch

try:
    from models import _int4
except ImportError:  # not built here (no C compiler at install): torch's kernel runs everything
    _int4 = None

MAX_ROWS = _int4.MAX_ROWS if _int4 is not None else 0


def _wanted() -> bool:
    if _int4 is None or os.environ.get("PONDER_INT4_KERNEL", "").lower() == "torch":
        return False
    return bool(_int4.supported()) and _reads_this_torch_layout()


def _reads_this_torch_layout() -> bool:
    """torch packs int4 per CPU capability (e.g. `ATEN_CPU_CAPABILITY=avx2` changes it): check once, on a small
    random matrix, that the kernel reads what torch packs here as torch's own kernel does."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (128, 256), dtype=torch.int32, generator=gen)
    scales = (torch.rand(2, 128, 2, generator=gen) * 0.02).to(torch.bfloat16)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    x = torch.randn(2, 256, generator=gen).to(torch.bfloat16)
    out = torch.empty(2, 128, dtype=torch.bfloat16)
    _int4.mm(packed.data_ptr(), scales.data_ptr(), x.data_ptr(), out.data_ptr(), 2, 128, 256, 128)
    reference = torch._weight_int4pack_mm_for_cpu(x, packed, 128, scales)
    return bool(torch.allclose(out.float(), reference.float(), atol=0.05, rtol=0.02))


ENABLED = _wanted()


def kernel_name() -> str:
    """Which int4 kernel decode rows run on, for benchmarks and `ponder info`."""
    if ENABLED:
        return "ponder avx512-bf16"
    if _int4 is None:
        return "torch (ponder kernel not built)"
    return "torch"


def runs_rows(rows: int, out_features: int, group_size: int) -> bool:
    """Whether Ponder's kernel takes a matmul of this shape."""
    return ENABLED and 1 <= rows <= MAX_ROWS and out_features % 64 == 0 and group_size % 4 == 0


def int4_mm(x: torch.Tensor, data: torch.Tensor, group_size: int, scales: torch.Tensor) -> torch.Tensor:
    """x (M, K) bf16 @ W.T for W packed by `torch._convert_weight_to_int4pack_for_cpu` → (M, N) bf16."""
    rows, n = x.shape[0], data.shape[0]
    if (runs_rows(rows, n, group_size) and x.dtype == torch.bfloat16 and x.is_contiguous()
            and data.is_contiguous() and scales.is_contiguous() and scales.dtype == torch.bfloat16):
        out = torch.empty(rows, n, dtype=torch.bfloat16)
        _int4.mm(data.data_ptr(), scales.data_ptr(), x.data_ptr(), out.data_ptr(), rows, n, x.shape[1], group_size)
        return out
    return torch._weight_int4pack_mm_for_cpu(x, data, group_size, scales)
