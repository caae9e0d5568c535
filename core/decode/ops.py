"""The small ops of a decode step, each one C call: attention over an int8 cache layer, RMSNorm, SwiGLU.

Both decode paths run them, the fused step (core.decode.fused) and the lean layers (core.decode.lean_layers), so they
stay bit-identical. `decode_step` does rotary, appends the token to the int8 layer and attends, per (row, KV
head) in one pass over the int8 rows, without the dequantized float copy of the prefix that the torch ops make
every step (3 ms of a 15 ms 0.5B step at short context; at 2k tokens 0.16 ms a layer against 0.35).
`rms_norm` and `silu_mul` replace five and three torch ops (with their casts). `core/decode/_decode_ops.c` holds the
kernels; where it was not built, or `PONDER_DECODE_OPS=torch` is set, the same computations run as torch ops.
`layers_plan` / `layers_step` run every decoder layer of a fused step in one call (`core/decode/_layer_step.c`: the
same kernels and models._int4's matmul, no Python between them). `top_candidates` is the sampler's shortlist
(core.decode.sampling) in one scan of the logits.
"""
from __future__ import annotations

import os

import torch
from torch.nn import functional as F

from core.decode.cache import Int8KVLayer
from models import int4_kernel

try:
    from core.decode import _decode_ops
except ImportError:  # not built here (no C compiler at install)
    _decode_ops = None

ENABLED = _decode_ops is not None and os.environ.get("PONDER_DECODE_OPS", "").lower() != "torch"
if _decode_ops is not None and torch.backends.cpu.get_cpu_capability() != "AVX512":
    _decode_ops.use_avx512(False)  # as torch's own kernels do when ATEN_CPU_CAPABILITY lowers them (an AVX2 laptop)


def kernel_name() -> str:
    """Which decode ops run, for benchmarks."""
    if ENABLED:
        return "ponder"
    return "torch" if _decode_ops is not None else "torch (ponder kernel not built)"


def takes(layer) -> bool:
    """Whether `layer` is an int8 cache layer this step can append to."""
    return type(layer) is Int8KVLayer and layer.is_initialized


def _rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    x = x.reshape(x.shape[0], -1) if x.dim() != 2 else x
    if x.shape[0] != rows and x.shape[0] != 1:
        raise ValueError("rotary tables need one row or one per query row")
    return x if x.stride(-1) == 1 else x.contiguous()


def _kernel_args(layer: Int8KVLayer, q, k, v, cos, sin, heads: int, kv_heads: int, out: torch.Tensor,
                 keep: list) -> list[int] | None:
    """The C attend's 18 integer arguments for one request's rows, or None when the kernel cannot read them.
    Grows `layer` to hold one more token; tensors made here go to `keep` (alive until the call)."""
    rows, dim = q.shape[0], q.shape[1] // heads
    pos = layer.length
    layer._ensure_capacity(pos + 1)
    cos, sin = _rows(cos.reshape(-1, dim), rows), _rows(sin.reshape(-1, dim), rows)
    if not (ENABLED and q.dtype == k.dtype == v.dtype == cos.dtype == sin.dtype == torch.bfloat16
            and all(t.stride(-1) == 1 for t in (q, k, v)) and layer.q.is_contiguous() and layer.s.is_contiguous()
            and heads // kv_heads <= _decode_ops.MAX_GROUP and dim <= _decode_ops.MAX_DIM):
        return None
    keep += (cos, sin)
    cs_stride = 0 if cos.shape[0] == 1 else cos.stride(0)
    return [q.data_ptr(), k.data_ptr(), v.data_ptr(), cos.data_ptr(), sin.data_ptr(), layer.q.data_ptr(),
            layer.s.data_ptr(), out.data_ptr(), q.stride(0), k.stride(0), v.stride(0), cs_stride, rows, heads,
            kv_heads, dim, layer.q.shape[-2], pos]


def decode_step(layer: Int8KVLayer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, heads: int, kv_heads: int, scaling: float) -> torch.Tensor:
    """q (B, Hq*D), k and v (B, Hkv*D) bf16 before rotary; cos and sin (D,), (1, D) or (B, D). Writes the token's
    rotated key and its value into `layer` at its length, then attends over everything stored →
    (B, Hq*D) in q's dtype."""
    out, keep = torch.empty(q.shape[0], q.shape[1], dtype=torch.bfloat16), []
    args = _kernel_args(layer, q, k, v, cos, sin, heads, kv_heads, out, keep)
    if args is not None:
        _decode_ops.attend(*args, float(scaling))
    else:
        dim = q.shape[1] // heads
        out = _torch_step(layer, q, k, v, _rows(cos.reshape(-1, dim), q.shape[0]),
                          _rows(sin.reshape(-1, dim), q.shape[0]), heads, kv_heads, scaling, layer.length)
    layer.length += 1
    return out


def decode_steps(layers: list[Int8KVLayer], qkv: torch.Tensor, bounds: list[tuple[int, int]], rotary: list,
                 heads: int, kv_heads: int, scaling: float) -> torch.Tensor:
    """`decode_step` for the requests of a joint step (core.decode.joint): request j's rows are
    qkv[lo_j:hi_j] (q | k | v), its cache `layers[j]`, its rotary tables `rotary[j]` ((D,) each); one C call
    attends for all of them, each exactly as `decode_step` would. Returns the outputs in qkv's row order."""
    dim = qkv.shape[1] // (heads + 2 * kv_heads)
    q_end, k_end = heads * dim, (heads + kv_heads) * dim
    usable = (ENABLED and qkv.dtype == torch.bfloat16 and qkv.stride(-1) == 1 and heads // kv_heads <= _decode_ops.MAX_GROUP
              and dim <= _decode_ops.MAX_DIM and all(c.dtype == s.dtype == torch.bfloat16 and c.dim() == 1
                                                     and c.is_contiguous() and s.is_contiguous() for c, s in rotary)
              and all(layer.q.is_contiguous() and layer.s.is_contiguous() for layer in layers))
    if not usable:
        return torch.cat([decode_step(layer, qkv[lo:hi, :q_end], qkv[lo:hi, q_end:k_end], qkv[lo:hi, k_end:], cos, sin,
                                      heads, kv_heads, scaling)
                          for layer, (lo, hi), (cos, sin) in zip(layers, bounds, rotary, strict=True)])
    out = torch.empty(qkv.shape[0], heads * dim, dtype=torch.bfloat16)
    base, row, size = qkv.data_ptr(), qkv.stride(0), qkv.element_size()
    out_base, out_row = out.data_ptr(), heads * dim * size
    args = []
    for layer, (lo, hi), (cos, sin) in zip(layers, bounds, rotary, strict=True):
        pos = layer.length
        layer._ensure_capacity(pos + 1)
        q = base + lo * row * size
        args += [q, q + q_end * size, q + k_end * size, cos.data_ptr(), sin.data_ptr(), layer.q.data_ptr(),
                 layer.s.data_ptr(), out_base + lo * out_row, row, row, row, 0, hi - lo, heads, kv_heads, dim,
                 layer.q.shape[-2], pos]
    _decode_ops.attend_many(args, float(scaling))
    for layer in layers:
        layer.length += 1
    return out


def plan_fits(group: int, head_dim: int) -> bool:
    """Whether the C step's attention takes this many query heads a KV head and this head size."""
    return (_decode_ops is not None and 1 <= group <= _decode_ops.MAX_GROUP and 2 <= head_dim <= _decode_ops.MAX_DIM
            and head_dim % 2 == 0)


def layers_plan(spec: list[int], eps: float, scaling: float):
    """The C step's plan of a model's decoder layers (spec: `core/decode/_layer_step.c`), or None where that step
    cannot run here (the kernels not built or turned off). Raises ValueError for a spec outside its range."""
    api = int4_kernel.mm_api()
    if not ENABLED or api is None or not hasattr(_decode_ops, "layers_plan"):
        return None
    return _decode_ops.layers_plan(api, spec, float(eps), float(scaling))


def layers_step(plan, h: torch.Tensor, layers: list, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Every decoder layer of one step over h (rows, hidden) bf16, in place, appending the token to each int8 cache
    layer; False (nothing done) where the C step cannot read these tensors."""
    rows, pos = h.shape[0], layers[0].length
    if not (h.dim() == 2 and h.dtype == torch.bfloat16 and h.is_contiguous() and cos.dtype == sin.dtype == torch.bfloat16
            and cos.is_contiguous() and sin.is_contiguous()
            and all(type(layer) is Int8KVLayer and layer.length == pos and layer.q.shape[1] == rows
                    for layer in layers)):
        return False
    addresses = []
    for layer in layers:
        layer._ensure_capacity(pos + 1)
        if not (layer.q.is_contiguous() and layer.s.is_contiguous()):
            return False
        addresses += (layer.q.data_ptr(), layer.s.data_ptr(), layer.q.shape[-2])
    _decode_ops.layers_step(plan, h.data_ptr(), rows, addresses, pos, cos.data_ptr(), sin.data_ptr())
    for layer in layers:
        layer.length += 1
    return True


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def _torch_step(layer, q, k, v, cos, sin, heads, kv_heads, scaling, pos) -> torch.Tensor:
    rows, dim = q.shape[0], q.shape[1] // heads
    cos, sin = cos.view(-1, 1, dim), sin.view(-1, 1, dim)
    q = _rotate(q.reshape(rows, heads, dim), cos, sin)
    k = _rotate(k.reshape(rows, kv_heads, dim), cos, sin)
    kv = torch.stack((k, v.reshape(rows, kv_heads, dim))).float()  # (2, B, Hkv, D), as Int8KVLayer.update
    scale = kv.abs().amax(-1, keepdim=True).clamp_(min=1e-8).div_(127.0)
    layer.q[:, :, :, pos] = kv.div_(scale).round_().clamp_(-127, 127).to(torch.int8)
    layer.s[:, :, :, pos] = scale.to(torch.bfloat16)
    stored = layer.q[:, :, :, : pos + 1].float().mul_(layer.s[:, :, :, : pos + 1].float())
    grouped = q.float().view(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, stored[0].transpose(-1, -2)).mul_(scaling)
    return torch.matmul(scores.softmax(-1), stored[1]).to(q.dtype).reshape(rows, heads * dim)


def _bf16_rows(x: torch.Tensor) -> torch.Tensor | None:
    """x as (rows, n) with unit column stride, or None when the kernels cannot read it."""
    if not ENABLED or x.dtype != torch.bfloat16 or x.stride(-1) != 1:
        return None
    flat = x.view(-1, x.shape[-1]) if x.dim() != 2 else x
    return flat


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm's result: x normalised in float32, cast back, times the weight (x's shape and dtype)."""
    rows = _bf16_rows(x) if x.is_contiguous() else None
    if rows is None or weight.dtype != torch.bfloat16 or not weight.is_contiguous():
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    _decode_ops.rms_norm(rows.data_ptr(), weight.data_ptr(), out.data_ptr(), rows.shape[0], rows.shape[1],
                         rows.stride(0), float(eps))
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, each rounded to the activations' dtype as torch's ops round them."""
    g, u = _bf16_rows(gate), _bf16_rows(up)
    if g is None or u is None or gate.dim() != 2 or up.shape != gate.shape:
        return F.silu(gate) * up
    out = torch.empty(gate.shape, dtype=torch.bfloat16)
    _decode_ops.silu_mul(g.data_ptr(), u.data_ptr(), out.data_ptr(), g.shape[0], g.shape[1], g.stride(0), u.stride(0))
    return out


def top_candidates(x: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's c highest values of x (B, V) float32 with unit column stride, and their ids ((B, c) float32,
    (B, c) int64), highest first, equal values in id order (`core/decode/_sampling.c`). None where the C op is not
    built (or built before it existed) or turned off, for rows it cannot read, and when a row holds a NaN (torch's
    ops then fail on it as before)."""
    rows, vocab = x.shape
    if not (ENABLED and hasattr(_decode_ops, "top_candidates") and x.dtype == torch.float32 and x.stride(-1) == 1
            and rows >= 1 and (rows == 1 or x.stride(0) >= vocab) and 1 <= c <= vocab):
        return None
    values, ids = torch.empty(rows, c, dtype=torch.float32), torch.empty(rows, c, dtype=torch.int64)
    if not _decode_ops.top_candidates(x.data_ptr(), rows, vocab, max(x.stride(0), vocab), c, values.data_ptr(),
                                      ids.data_ptr()):
        return None
    return values, ids
