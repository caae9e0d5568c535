"""The int4 matmul every decode step runs: Ponder's own kernel for decode rows and short prompts, torch's otherwise.

`models/_int4.c` reads torch's packed int4 layout as it is (no second copy of the weights) and computes x @ W.T for
1..16 bf16 rows; short prompts (up to CHUNKED_ROWS rows) run through it 16 rows at a time. torch packs one layout
per CPU capability, and the kernel has a path for each (see its header): AVX512-BF16; AVX-512 VNNI (int16
activations, exact integer sums) or plain AVX-512 (fp32) without BF16; AVX2 with AVX-VNNI (int16 activations, as
AVX-512 VNNI; Intel Core 12th gen and later), the same int16 arithmetic on plain AVX2 (`avx2-int16`), or AVX2 + FMA
in fp32. On AVX-512 it also unpacks a matrix
to bf16 in one pass (`unpack`), for long prompts. On AVX2 the int16 paths read Ponder's own layout (`p32`,
models/_int4_p32.c: no shuffles between the load and the multiply), which the weights are moved into once at load
(`to_p32`, in place; `PONDER_INT4_LAYOUT=torch` keeps torch's); a p32 matrix is marked by its dtype, int8 where
torch's packing is uint8, so that torch's kernel can never read it by mistake.
It is built at install as an optional C extension; where it could not be built, where torch packs a layout it has
no path for, or where `PONDER_INT4_KERNEL=torch` is set, every call goes to torch's `_weight_int4pack_mm_for_cpu`.
`PONDER_INT4_KERNEL=avx512-vnni|avx512|avx2-vnni|avx2-int16|avx2` forces a lower path (with
`ATEN_CPU_CAPABILITY=avx2`, an AVX2 laptop's layout); `PONDER_INT4_KERNEL=avx512-a8` or `avx2-a8` opts in to int8
activations (vpdpbusd / vpmaddubsw: twice the products an instruction).
Each row's arithmetic is the same whatever the number of rows, so batched and one-at-a-time decoding give the same
tokens on either kernel.
"""
from __future__ import annotations

import os
import threading

import torch

from models import int4_grid

try:
    from models import _int4
except ImportError:  # not built here (no C compiler at install): torch's kernel runs everything
    _int4 = None

MAX_ROWS = _int4.MAX_ROWS if _int4 is not None else 0


PATHS = {"AVX512": ("avx512-bf16", "avx512-vnni", "avx512"), "AVX2": ("avx2-vnni", "avx2-int16", "avx2")}
"""The kernel's paths that read the layout torch packs for each of its CPU capabilities, best first."""
OPT_IN = {"AVX512": ("avx512-a8",), "AVX2": ("avx2-a8",)}
"""Paths taken only when `PONDER_INT4_KERNEL` names them: `avx512-a8` rounds activations to int8 per group and
`avx2-a8` per 32 inputs (W4A8), so they change what the model computes; their effect on the model is measured
before one may become a default."""
_CODES = {"avx512-bf16": "ISA_BF16", "avx512-vnni": "ISA_VNNI", "avx512": "ISA_AVX512", "avx2-vnni": "ISA_AVXVNNI",
          "avx2-int16": "ISA_AVX2I16", "avx2": "ISA_AVX2", "avx512-a8": "ISA_A8",
          "avx2-a8": "ISA_AVX2A8"}
INT16_PATHS = ("avx512-vnni", "avx2-vnni", "avx2-int16")
"""Paths that hold activations as int16 per group (at most MAX_VNNI_GROUP inputs a group)."""


def _choose() -> str | None:
    """The kernel path for this CPU and this torch's packing, or None (torch's kernel runs everything)."""
    forced = os.environ.get("PONDER_INT4_KERNEL", "").lower()
    if _int4 is None or forced == "torch":
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    for name in PATHS.get(capability, ()) + (OPT_IN.get(capability, ()) if forced else ()):
        code = getattr(_int4, _CODES[name], None)
        if code is None:  # an extension built before this path existed
            continue
        if forced in ("", name) and _int4.features() >> code & 1 and _reads_this_torch_layout(code):
            return name
    return None


def _reads_this_torch_layout(code: int) -> bool:
    """torch packs int4 per CPU capability (e.g. `ATEN_CPU_CAPABILITY=avx2` changes it): check once, on a small
    random matrix, that the kernel reads what torch packs here as torch's own kernel does. On one thread, so that
    the importing thread starts no OpenMP team of its own (why that matters: core.decode.joint)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        q = torch.randint(0, 16, (128, 256), dtype=torch.int32, generator=gen)
        scales = (torch.rand(2, 128, 2, generator=gen) * 0.02).to(torch.bfloat16)
        packed = int4_grid.pack(q)
        x = torch.randn(2, 256, generator=gen).to(torch.bfloat16)
        out = torch.empty(2, 128, dtype=torch.bfloat16)
        _int4.mm(packed.data_ptr(), scales.data_ptr(), x.data_ptr(), out.data_ptr(), 2, 128, 256, 128, code)
        reference = torch._weight_int4pack_mm_for_cpu(x, packed, 128, scales)
    finally:
        torch.set_num_threads(threads)
    return bool(torch.allclose(out.float(), reference.float(), atol=0.05, rtol=0.02))


PATH = _choose()
ENABLED = PATH is not None
ISA = getattr(_int4, _CODES[PATH]) if ENABLED else -1
UNPACKS = PATH in PATHS["AVX512"]
"""Whether `unpack` runs here (the AVX-512 paths)."""
_P32_CODES = {"avx2-int16": "ISA_P32I16", "avx2-vnni": "ISA_P32VNNI"}
P32_ISA = getattr(_int4, _P32_CODES.get(PATH, ""), -1) if ENABLED else -1
P32 = P32_ISA >= 0 and os.environ.get("PONDER_INT4_LAYOUT", "").lower() != "torch"
"""Whether int4 weights move into Ponder's AVX2 layout at load (the int16 AVX2 paths, where it is built)."""


def p32_fits(n: int, k: int, group_size: int) -> bool:
    """Whether an (n, k) int4 matrix with this group size can move into p32 (blocks of 32 outputs, 8 inputs a step)."""
    return P32 and n % 32 == 0 and k % group_size == 0 and group_size % 8 == 0 and group_size <= _int4.MAX_VNNI_GROUP


def to_p32(data: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Move a matrix in torch's AVX2 packing (uint8 (n, k / 2)) into p32, in place; returns it viewed as int8."""
    if data.dtype != torch.uint8 or tuple(data.shape) != (n, k // 2) or not data.is_contiguous():
        raise ValueError(f"not a contiguous packed int4 matrix of {n}x{k}")
    _int4.p32(data.data_ptr(), n, k, 1)
    return data.view(torch.int8)


def torch_layout(data: torch.Tensor) -> torch.Tensor:
    """The packed matrix in torch's layout: `data` itself, or a copy moved back from p32 (int8)."""
    if data.dtype != torch.int8:
        return data
    out = data.view(torch.uint8).clone()
    _int4.p32(out.data_ptr(), out.shape[0], out.shape[1] * 2, 0)
    return out


def kernel_name() -> str:
    """Which int4 kernel decode rows run on, for benchmarks and `ponder info`."""
    if ENABLED:
        return f"ponder {PATH}"
    if _int4 is None:
        return "torch (ponder kernel not built)"
    return "torch"


CHUNKED_ROWS = 64 if PATH in ("avx512-bf16", "avx2", "avx2-vnni", "avx2-int16") else MAX_ROWS
"""Up to this many rows go through Ponder's kernel MAX_ROWS at a time (each row computes the same either way):
at 16 rows it takes half torch's time (1.56 against 3.32 ms for 9728×896 on a 2-core EPYC). Longer prompts
unpack to bf16 (models.quantization.prefill_rows) or run on torch's kernel. The AVX-512 paths without bf16
(VNNI, plain AVX-512) are compute-bound from a few rows: there a prompt of 17+ rows runs on torch's kernel (a
~50-token prompt of the 0.5B on a 2-core Xeon without AVX512-BF16: 0.93 s in chunks, 0.37 s on torch's)."""


def runs_rows(rows: int, out_features: int, group_size: int) -> bool:
    """Whether Ponder's kernel takes a matmul of this shape."""
    return (ENABLED and 1 <= rows <= CHUNKED_ROWS and out_features % 64 == 0 and group_size % 4 == 0
            and (PATH not in INT16_PATHS or group_size <= _int4.MAX_VNNI_GROUP)
            and (PATH != "avx2-a8" or group_size % 32 == 0))


def int4_mm(x: torch.Tensor, data: torch.Tensor, group_size: int, scales: torch.Tensor) -> torch.Tensor:
    """x (M, K) bf16 @ W.T for W packed by `torch._convert_weight_to_int4pack_for_cpu` → (M, N) bf16; W in p32
    (int8, `to_p32`) runs on Ponder's kernel whatever the number of rows."""
    rows, n = x.shape[0], data.shape[0]
    if data.dtype == torch.int8:
        if not (P32 and data.is_contiguous() and scales.is_contiguous() and scales.dtype == torch.bfloat16):
            raise ValueError("int4 weights in Ponder's p32 layout need its kernel (models._int4) and contiguous scales")
        if x.dtype != torch.bfloat16 or not x.is_contiguous():
            x = x.to(torch.bfloat16).contiguous()
        return _rows(x, data, group_size, scales, P32_ISA)
    if (runs_rows(rows, n, group_size) and x.dtype == torch.bfloat16 and x.is_contiguous()
            and data.is_contiguous() and scales.is_contiguous() and scales.dtype == torch.bfloat16):
        return _rows(x, data, group_size, scales, ISA)
    return torch._weight_int4pack_mm_for_cpu(x, data, group_size, scales)


def decode_isa(data: torch.Tensor, group_size: int, scales: torch.Tensor) -> int | None:
    """The instruction set Ponder's kernel computes decode rows of this matrix with, as `int4_mm` would (any number
    of rows in p32, up to CHUNKED_ROWS in torch's layout); None where `int4_mm` would call torch's kernel."""
    if not (data.is_contiguous() and scales.is_contiguous() and scales.dtype == torch.bfloat16):
        return None
    if data.dtype == torch.int8:
        return P32_ISA if P32 else None
    return ISA if runs_rows(1, data.shape[0], group_size) else None


def mm_api():
    """The capsule through which other C extensions call this kernel (models/_int4_api.h), or None."""
    return getattr(_int4, "mm_api", None) if ENABLED else None


def _rows(x: torch.Tensor, data: torch.Tensor, group_size: int, scales: torch.Tensor, isa: int) -> torch.Tensor:
    """Ponder's kernel over x's rows, MAX_ROWS at a time (each row computes the same either way)."""
    rows, n = x.shape[0], data.shape[0]
    out = torch.empty(rows, n, dtype=torch.bfloat16)
    k, x_row, out_row = x.shape[1], x.stride(0) * x.element_size(), n * out.element_size()
    for start in range(0, rows, MAX_ROWS):
        m = min(MAX_ROWS, rows - start)
        _int4.mm(data.data_ptr(), scales.data_ptr(), x.data_ptr() + start * x_row, out.data_ptr() + start * out_row,
                 m, n, k, group_size, isa)
    return out


_SCRATCH = threading.local()
SCRATCH_LIMIT = 64 * 2**20
"""Unpacked weights up to this many elements go to one buffer per thread that is kept between calls: a fresh
55 MB tensor per call (the 1.5B's gate/up) costs ~27 ms of page faults, more than unpacking it."""


def _buffer(numel: int) -> torch.Tensor:
    if numel > SCRATCH_LIMIT:
        return torch.empty(numel, dtype=torch.bfloat16)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _SCRATCH.buf = torch.empty(numel, dtype=torch.bfloat16)
    return buf[:numel]


def unpack(data: torch.Tensor, scales: torch.Tensor, group_size: int, in_features: int,
           scratch: bool = False) -> torch.Tensor | None:
    """The bf16 weight (in, out) of a matrix packed by `torch._convert_weight_to_int4pack_for_cpu`, computed as
    models.quantization.unpack_int4 computes it, in one pass; None where Ponder's kernel does not run.
    scratch: write it into this thread's reused buffer (valid until the next scratch unpack on the thread)."""
    n = data.shape[0]
    if not (ENABLED and UNPACKS and n % 64 == 0 and in_features % group_size == 0 and data.is_contiguous()
            and scales.is_contiguous() and scales.dtype == torch.bfloat16):
        return None
    out = (_buffer(in_features * n) if scratch else torch.empty(in_features * n, dtype=torch.bfloat16))
    out = out.view(in_features, n)
    _int4.unpack(data.data_ptr(), scales.data_ptr(), out.data_ptr(), n, in_features, group_size)
    return out
