"""Feed-forward projections cut to the neurons a selection keeps (GRIFFIN, Caprese: core.sparse.ff): index copies of
the packed int4 weights, so they hold the same numbers and run on the same kernels.

- gate / up (int4 groups along the inputs): the kept rows are read out of the packed blocks and packed again
  with their own scales and zero points;
- down (int4 groups along the neurons): cutting columns would break a group, so each group keeps whole chunks
  of 32 of its best neurons (`choose_neurons`: as many as plain top-k gives it, rounded to a chunk) and the
  cut runs with group size 32, each chunk with its group's scales;
- any other layer (bf16 weights, shapes the packed kernel does not take): the dense weight's rows or columns
  in bf16.
LoRA adapters (peft, all linear layers) are cut the same way and follow the layer's active / disabled adapters
as `core.adapters.lora_fast` does; Caprese's low-rank branch folds into bf16 cuts (`fold_branch`).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from models import int4_grid
from models.int4_kernel import int4_mm
from models.quantization import dense_weight, unpack_matches_kernel

BLOCK = 64
"""Rows per block of torch's packed int4 CPU layout: kept neurons come in whole multiples of it."""
CHUNK = 32
"""The int4 kernel's smallest group: a cut down projection keeps columns in chunks of this many."""


def _is_packed_int4(base) -> bool:
    w = getattr(base, "weight", None)
    return (type(w).__name__ == "TinyGemmWeightQBitsTensor" and w.device.type == "cpu"
            and base.out_features % BLOCK == 0 and w._data._data.dtype == torch.uint8 and unpack_matches_kernel())


def packed_group(proj) -> int | None:
    base = getattr(proj, "base_layer", proj)
    return base.weight._group_size if _is_packed_int4(base) else None


def _dense_weight(base) -> torch.Tensor:
    w = base.weight
    if type(w).__name__ == "TinyGemmWeightQBitsTensor" and w._data._data.dtype == torch.int8:  # p32 (AVX2)
        return dense_weight(base)
    return (w.dequantize() if hasattr(w, "dequantize") else w.detach()).to(torch.bfloat16)


class CutLinear:
    """One projection cut to the kept neurons: its base kernel call plus its adapters' cut LoRA weights."""

    def __init__(self, kind: str, weight: torch.Tensor, *, group: int = 0, scales: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, peft=None, lora: dict | None = None):
        self.kind, self.weight, self.group, self.scales, self.bias = kind, weight, group, scales, bias
        self.peft, self.lora = peft, lora or {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        if self.kind == "int4":
            out = int4_mm(x2d, self.weight, self.group, self.scales)
        elif self.kind == "int8":
            out = torch._weight_int8pack_mm(x2d, self.weight, self.scales)
        else:
            out = F.linear(x2d, self.weight.to(x2d.dtype))
        if self.bias is not None:
            out = out + self.bias
        if self.peft is not None and not self.peft._disable_adapters:
            dtype = out.dtype
            for name in self.peft.active_adapters:
                if name in self.lora:
                    a, b, b_bias, scaling = self.lora[name]
                    xa = x2d.to(a.dtype)
                    out = out + F.linear(F.linear(xa, a), b, b_bias) * scaling
            out = out.to(dtype)
        return out.view(*x.shape[:-1], out.shape[-1])


def _lora_parts(proj, rows: torch.Tensor | None, cols: torch.Tensor | None) -> tuple[object, dict] | None:
    """(peft layer, {adapter: (A, B, B bias, scaling)}) cut to output `rows` / input `cols`; (None, {}) for a plain
    layer; None when the layer is one the cut cannot follow (merged weights, DoRA or other variants)."""
    if not hasattr(proj, "lora_A"):
        return None, {}
    if proj.merged or getattr(proj, "lora_variant", None):
        return None
    parts = {}
    for name in proj.lora_A:
        a, b = proj.lora_A[name].weight.detach(), proj.lora_B[name]
        b_w, b_bias = b.weight.detach(), (b.bias.detach() if b.bias is not None else None)
        if cols is not None:
            a = a[:, cols].contiguous()
        if rows is not None:
            b_w = b_w[rows].contiguous()
            b_bias = b_bias[rows] if b_bias is not None else None
        parts[name] = (a, b_w, b_bias, proj.scaling[name])
    return proj, parts


def _packed_rows(w, n: int, k: int, rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` (a multiple of 64) of a packed int4 weight (n, k), packed again in the kernel's layout:
    block b of 64 rows is (k, 32) bytes, byte [b, j, l] = row 64b+l (low nibble) | row 64b+32+l (high)."""
    planes = w._data._data.view(n // BLOCK, k, BLOCK // 2).transpose(1, 2)  # (blocks, 32, k), a view
    q = planes[rows // BLOCK, rows % (BLOCK // 2)]  # (n', k): the byte holding each kept row's nibble
    q = torch.where((rows % BLOCK >= BLOCK // 2).view(-1, 1), q >> 4, q & 0xF)
    q = q.view(-1, 2, BLOCK // 2, k)
    return (q[:, 0] | (q[:, 1] << 4)).transpose(1, 2).contiguous().view(len(rows), k // 2)


def cut_rows(proj, rows: torch.Tensor) -> CutLinear | None:
    """gate / up kept to output `rows` (sorted): packed int4 rows are repacked exactly."""
    lora = _lora_parts(proj, rows, None)
    if lora is None:
        return None
    base = getattr(proj, "base_layer", proj)
    bias = base.bias.detach()[rows] if base.bias is not None else None
    if _is_packed_int4(base) and len(rows) % BLOCK == 0:
        w = base.weight
        packed = _packed_rows(w, base.out_features, base.in_features, rows)
        return CutLinear("int4", packed, group=w._group_size, scales=w._scale_shift[:, rows].contiguous(),
                         bias=bias, peft=lora[0], lora=lora[1])
    return CutLinear("dense", _dense_weight(base)[rows].contiguous(), bias=bias, peft=lora[0], lora=lora[1])


def cut_columns(proj, cols: torch.Tensor) -> CutLinear | None:
    """down kept to input `cols` (sorted). Packed int4: whole chunks of 32 columns from one scale group each
    (`choose_neurons` picks them so), kept as int4 with group size 32 and each chunk's own group's scales —
    the same numbers, exactly; other layers in bf16."""
    lora = _lora_parts(proj, None, cols)
    if lora is None:
        return None
    base = getattr(proj, "base_layer", proj)
    bias = base.bias.detach() if base.bias is not None else None
    if _is_packed_int4(base) and _whole_chunks(cols, base.weight._group_size):
        w, n, k = base.weight, base.out_features, base.in_features
        packed = w._data._data.view(n // BLOCK, k, BLOCK // 2).index_select(1, cols).view(n, len(cols) // 2)
        scales = w._scale_shift.index_select(0, cols[::CHUNK] // w._group_size).contiguous()
        return CutLinear("int4", packed, group=CHUNK, scales=scales, bias=bias, peft=lora[0], lora=lora[1])
    return CutLinear("dense", _dense_weight(base)[:, cols].contiguous(), bias=bias, peft=lora[0], lora=lora[1])


def _whole_chunks(cols: torch.Tensor, group: int) -> bool:
    """Whether sorted `cols` come in runs of CHUNK that each lie inside one scale group."""
    if len(cols) % CHUNK or group % CHUNK:
        return False
    chunks = cols.view(-1, CHUNK) // group
    return bool((chunks == chunks[:, :1]).all())


def choose_neurons(scores: torch.Tensor, n: int, group: int | None = None) -> torch.Tensor:
    """The `n` neurons to keep (sorted), the highest `scores`. With `group` (the int4 group size of a packed down
    projection), each group keeps a multiple of CHUNK neurons — its own best ones, as many as the plain top-n
    gives it, rounded to a chunk — so the cut down projection stays exact int4 (see `cut_columns`)."""
    top = scores.topk(n).indices
    if group is None or group % CHUNK or n % CHUNK or scores.numel() % group:
        return top.sort().values
    groups, per_group = scores.numel() // group, group // CHUNK
    counts = torch.bincount(top // group, minlength=groups).float()
    chunks = (counts / CHUNK).round().long()
    for _ in range(abs(n // CHUNK - int(chunks.sum()))):  # a few chunks off the total: move the closest calls
        short = n // CHUNK > chunks.sum()
        gap = counts - chunks * CHUNK if short else chunks * CHUNK - counts
        gap[(chunks == per_group) if short else (chunks == 0)] = float("-inf")
        chunks[int(gap.argmax())] += 1 if short else -1
    rank = scores.view(groups, group).argsort(dim=1, descending=True).argsort(dim=1)  # 0 = a group's best
    keep = rank < (chunks * CHUNK).view(-1, 1)
    return keep.flatten().nonzero().flatten()


class CutFF:
    """One layer's feed-forward block on the kept neurons, down(act(gate(x)) · up(x)), plus `branch(x)` when it
    has one (Caprese's low-rank recovery, core.sparse.caprese)."""

    def __init__(self, gate: CutLinear, up: CutLinear, down: CutLinear, act, kept: torch.Tensor, branch=None):
        self.gate, self.up, self.down, self.act, self.kept, self.branch = gate, up, down, act, kept, branch
        self.folded = 0
        """Rank of a Caprese branch folded into up / down (`fold_branch`); 0: none."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.folded:  # up(x) ends with the branch's R·x, which down's last columns (L) read as they are
            u = self.up(x)
            r = self.folded
            return self.down(torch.cat([self.act(self.gate(x)) * u[..., :-r], u[..., -r:]], dim=-1))
        out = self.down(self.act(self.gate(x)) * self.up(x))
        return out if self.branch is None else out + self.branch(x)


def _foldable_int4(u: CutLinear, d: CutLinear, rank: int, hidden: int) -> bool:
    return (u.kind == "int4" and d.kind == "int4" and d.group == CHUNK and rank % BLOCK == 0
            and hidden % u.group == 0 and hidden % BLOCK == 0)


def fold_branch(block: CutFF, up: torch.Tensor, down: torch.Tensor) -> bool:
    """Fold a Caprese branch L·(R·x) (`up` = R (r, H), `down` = L (H, r)) into the cut block's own passes: R
    becomes r more output rows of up, L r more input columns of down, so one down pass adds both and the branch
    costs no pass of its own (adapters get zero rows / columns there, so they are unchanged). bf16 projections
    take the branch as it is; packed int4 ones take it rounded to int4 (R in up's groups, L in groups of 32) when
    r is a multiple of 64, the kernel's block. Returns whether it folded (else it stays beside the block)."""
    u, d = block.up, block.down
    r, hidden = up.shape
    if u.kind == "dense" and d.kind == "dense":
        up_weight, down_weight = torch.cat([u.weight, up.to(u.weight.dtype)]), torch.cat(
            [d.weight, down.to(d.weight.dtype)], dim=1)
        up_scales = down_scales = None
    elif _foldable_int4(u, d, r, hidden):
        packed_r, scales_r = int4_grid.quantize_packed(up, u.group)
        packed_l, scales_l = int4_grid.quantize_packed(down, CHUNK)
        up_weight, up_scales = torch.cat([u.weight, packed_r]), torch.cat([u.scales, scales_r], dim=1)
        cols = d.weight.numel() * 2 // hidden
        down_weight = torch.cat([d.weight.view(hidden // BLOCK, cols, BLOCK // 2),
                                 packed_l.view(hidden // BLOCK, r, BLOCK // 2)], dim=1).view(hidden, (cols + r) // 2)
        down_scales = torch.cat([d.scales, scales_l])
    else:
        return False
    up_lora = {name: (a, torch.cat([b, b.new_zeros(r, b.shape[1])]),
                      None if b_bias is None else torch.cat([b_bias, b_bias.new_zeros(r)]), scaling)
               for name, (a, b, b_bias, scaling) in u.lora.items()}
    down_lora = {name: (torch.cat([a, a.new_zeros(a.shape[0], r)], dim=1), b, b_bias, scaling)
                 for name, (a, b, b_bias, scaling) in d.lora.items()}
    bias = None if u.bias is None else torch.cat([u.bias, u.bias.new_zeros(r)])
    block.up = CutLinear(u.kind, up_weight, group=u.group, scales=up_scales, bias=bias, peft=u.peft, lora=up_lora)
    block.down = CutLinear(d.kind, down_weight, group=d.group, scales=down_scales, bias=d.bias, peft=d.peft,
                           lora=down_lora)
    block.folded, block.branch = r, None
    return True


def cut_layer(mlp, kept: torch.Tensor) -> CutFF | None:
    """`mlp` (a Qwen2 MLP) cut to neurons `kept`; None when one of its projections cannot be cut."""
    kept = kept.sort().values
    parts = cut_rows(mlp.gate_proj, kept), cut_rows(mlp.up_proj, kept), cut_columns(mlp.down_proj, kept)
    return None if any(p is None for p in parts) else CutFF(*parts, mlp.act_fn, kept)
