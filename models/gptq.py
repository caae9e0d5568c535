"""Error-compensating int4 rounding (GPTQ) onto torch's packed CPU int4 layout, one decoder layer at a time.

Round-to-nearest treats every weight alone; GPTQ rounds one input column at a time and moves the rounding
error onto the columns not yet rounded, weighted by the inverse Hessian H = XᵀX of the layer's calibration
inputs, so the layer's *output* error is what gets minimised. Groups are the kernel's (one bf16 scale and zero
point per `group` inputs of an output row, w = (q − 8)·scale + zero); each group's grid is fitted when the
algorithm reaches it, with its range clipped by the ratio that minimises the Hessian-diagonal-weighted error.

Cost on 2 cores is what the first launch waits for, so (as in the reference implementation, arXiv 2210.17323):
- the column loop runs inside one group at a time and the rest of the matrix gets one lazy GEMM per group;
- rows are independent given H, so linears that read one input are rounded together (q/k/v, gate/up) and very
  wide ones (the LM head) in row chunks that stay in cache;
- H⁻¹'s upper Cholesky factor U is never formed: errors are carried through H's own factor T = U⁻¹ (one
  Cholesky), and only U's diagonal blocks (128 × 128 inverses) are needed inside the groups;
- XᵀX is one product over all calibration tokens, summed over its upper blocks only;
- calibration runs the decoder one layer at a time (`gptq_layers`): a layer's Hessians live only while that
  layer is rounded, and nothing computes the vocabulary logits.
Used by `w4-fpt` after the FPTQuant° transforms (the paper trains its grids end to end; this is our stand-in).
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from . import int4_grid
from .gram import add_gram
from .scratch import reusing, scratch

try:
    from models import _gptq  # the column loop in C (models/_gptq.c), built at install where a compiler is
except ImportError:
    _gptq = None

CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8)
DAMP = 0.01
ROW_CHUNK = 8192
"""Rows rounded together: a group's block (ROW_CHUNK × group floats, 4 MiB at group 128) stays in cache."""
ROW_CHUNK_C = 16384
"""Rows per call of the C loop (which keeps its own row blocks of 256 in cache): rows are independent given H, so
the LM head's 151,936 rows need not be copied and widened all at once (2.8 GB for the 1.5B)."""
def _grid(w: torch.Tensor, importance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of w (n, group): bf16-exact (scale, zero) of the clipped min-max grid with least weighted error."""
    best = None
    for ratio in CLIP_RATIOS:
        scale, zero = int4_grid.minmax(w, ratio, bf16=True)
        err = ((int4_grid.dequantize(int4_grid.codes(w, scale, zero), scale, zero) - w).pow(2) * importance).sum(1)
        if best is None:
            best = [err, scale, zero]
        else:
            better = err < best[0]
            best = [torch.where(better, e, b) for e, b in zip((err, scale, zero), best, strict=True)]
    return best[1], best[2]


def upper_factor(h: torch.Tensor) -> torch.Tensor:
    """T upper-triangular with T·Tᵀ = H: with J the order reversal, J·H·J = L·Lᵀ gives T = J·L·J (one Cholesky).
    H's storage is overwritten (L is written there).

    GPTQ reads its error weights from U = T⁻¹ (Uᵀ·U = H⁻¹), but only U's diagonal blocks are needed when the
    rounding errors are carried forward through T itself (`_round_rows`), which saves the triangular inverse:
    2.7 of the 4.1 s that the 1.5B's down_proj (n = 8960) spent on H on a 2-core EPYC."""
    n = h.shape[0]
    flipped = scratch("flipped", (n, n), h.dtype)
    np.copyto(flipped.numpy(), h.numpy()[::-1, ::-1])  # into reused pages (torch's flip takes fresh ones)
    low = h.t()  # column-major, as LAPACK writes it: no copy of its own
    torch.linalg.cholesky(flipped, out=low)
    np.copyto(flipped.numpy(), low.numpy()[::-1, ::-1])
    return flipped


def _prepared_hessian(hessian: torch.Tensor, overwrite: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Dampened H in float32 (dead inputs given a unit diagonal) and the mask of dead inputs; `overwrite`: in the
    given float32 tensor itself (no 320 MB copy for n = 8960; a fresh identity to add cost 0.6 s in page faults)."""
    h = hessian if overwrite and hessian.dtype == torch.float32 else hessian.float().clone()
    diagonal = torch.diagonal(h)
    dead = diagonal == 0
    diagonal[dead] = 1
    diagonal.add_(DAMP * diagonal.mean())
    return h, dead


def _round_rows(wt: torch.Tensor, t: torch.Tensor, diag: torch.Tensor, group: int, codes: torch.Tensor,
                scales: torch.Tensor, zeros: torch.Tensor) -> None:
    """GPTQ of some rows of W, given transposed (`wt`: (k, rows) float32, so that a column of W is a contiguous
    row here) into `codes` (k, rows), `scales`, `zeros` (rows, k / group); `t` the upper factor of H (`upper_factor`).

    Once the columns F before a group are rounded to q_F, GPTQ's running weights of the later columns R are the
    least-squares correction w_R + (w − q)_F·H_FR·H_RR⁻¹ = w_R + (w − q)_F·T_FR·T_RR⁻¹. Of T_RR⁻¹ the group's own
    columns need only its diagonal block, T_gg⁻¹ = U_gg, so the group starts from w_g + A_g·U_gg with
    A = Σ (w − q)_F·T_F· summed lazily, one product per group as in the reference (same products as its U-form),
    and inside the group the reference column loop runs with U_gg. The codes are GPTQ's, up to float rounding."""
    k, rows = wt.shape
    carried = scratch("carried", (k, rows), zero=True)  # Aᵀ: Tᵀ·(w − q)ᵀ over the groups rounded so far
    errors = torch.empty(group, rows)
    q = torch.empty(rows)
    eye = torch.eye(group)
    for g, i1 in enumerate(range(0, k, group)):
        i2 = i1 + group
        h = torch.linalg.solve_triangular(t[i1:i2, i1:i2], eye, upper=True)  # U_gg
        block = wt[i1:i2].clone() if g == 0 else torch.addmm(wt[i1:i2], h.t(), carried[i1:i2])
        if _gptq is not None:
            scale, zero, importance = torch.empty(rows), torch.empty(rows), diag[i1:i2].contiguous()
            _gptq.group_grid(block.data_ptr(), importance.data_ptr(), scale.data_ptr(), zero.data_ptr(), rows, group)
        else:
            scale, zero = _grid(block.t(), diag[i1:i2])
        scales[:, g], zeros[:, g] = scale, zero
        if _gptq is not None:
            h = h.contiguous()
            _gptq.group_columns(block.data_ptr(), h.data_ptr(), scale.data_ptr(), zero.data_ptr(),
                                codes[i1:i2].data_ptr(), errors.data_ptr(), rows, group)
        else:
            pivots = torch.diagonal(h).tolist()
            for i in range(group):
                col, err = block[i], errors[i]
                torch.sub(col, zero, out=q).div_(scale).add_(8).round_().clamp_(0, 15)
                codes[i1 + i] = q
                torch.sub(col, q.sub_(8).mul_(scale).add_(zero), out=err).div_(pivots[i])
                if i + 1 < group:
                    block[i + 1:].addr_(h[i, i + 1:], err, alpha=-1)
        if i2 < k:
            rounded = codes[i1:i2].float().sub_(8).mul_(scale).add_(zero)
            carried[i2:].addmm_(t[i1:i2, i2:].t(), wt[i1:i2] - rounded)


@torch.no_grad()
def gptq_int4(w: torch.Tensor, hessian: torch.Tensor, group: int,
              overwrite: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes (n, k) uint8 in 0..15, scale and zero (n, k / group) bf16 for weight w (n, k) given H (k, k);
    `overwrite`: H may be changed (the caller drops it)."""
    n, k = w.shape
    h, dead = _prepared_hessian(hessian, overwrite)
    diag = torch.diagonal(h).clone()
    t = upper_factor(h)  # h is spent
    codes = torch.empty(n, k, dtype=torch.uint8)  # kept for every layer until the model is packed
    scales = torch.empty(n, k // group)
    zeros = torch.empty(n, k // group)
    chunk = ROW_CHUNK_C if _gptq is not None else ROW_CHUNK
    for r1 in range(0, n, chunk):
        r2 = min(n, r1 + chunk)
        wt = scratch("weights", (k, r2 - r1)).copy_(w[r1:r2].t())
        wt[dead] = 0
        block = scratch("codes", (k, r2 - r1), torch.int32)
        _round_rows(wt, t, diag, group, block, scales[r1:r2], zeros[r1:r2])
        codes[r1:r2] = block.t()
    return codes, scales.to(torch.bfloat16), zeros.to(torch.bfloat16)


def codes_fingerprint(codes: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> str:
    """sha256 of the int4 codes and grids in a layout that no CPU changes (torch's packing does): the weights an
    adapter was trained on are these exact numbers, and GPTQ's float sums can round a few differently elsewhere."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(codes):
        q, scale, zero = codes[name]
        add_to_fingerprint(digest, name, [q], scale, zero)
    return digest.hexdigest()


def add_to_fingerprint(digest, name: str, q_rows, scale: torch.Tensor, zero: torch.Tensor) -> None:
    """One matrix's part of `codes_fingerprint` (matrices in name order), its codes given as consecutive row
    slices, for callers that see one matrix, or a part of one, at a time."""
    digest.update(name.encode())
    for q in q_rows:
        digest.update(q.to(torch.uint8).contiguous().numpy())
    for t in (scale, zero):
        digest.update(t.contiguous().view(torch.int16).numpy())


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> torch.Tensor:
    """The (n, k) float weight the codes stand for, as the kernel computes it."""
    s = scale.float().repeat_interleave(group, 1)
    z = zero.float().repeat_interleave(group, 1)
    return (codes.float() - int4_grid.MID) * s + z


def calibration_dtype() -> torch.dtype:
    """What the calibration forward computes in: bf16 where the CPU multiplies it natively (AVX512-BF16 or AMX;
    3.7x float32's rate on a 2-core EPYC, 730 against 196 GFLOP/s), as the app's own forward does, else float32
    (bf16 would be emulated there, several times slower). The Hessians are summed in float32 either way."""
    from .quantization import _native_bf16

    return torch.bfloat16 if _native_bf16() else torch.float32


def _input_sites(names: list[str]) -> dict[str, list[str]]:
    """Linears that read the same input share one Hessian: site (first name) -> every name reading it."""
    sites: dict[str, list[str]] = {}
    for name in names:
        parts = name.rsplit(".", 1)
        share = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(parts[-1])
        key = f"{parts[0]}.{share}" if share and f"{parts[0]}.{share}" in names else name
        sites.setdefault(key, []).append(name)
    return sites


def _round_site(modules: dict[str, nn.Module], names: list[str], hessian: torch.Tensor, group: int, out: dict) -> None:
    """One GPTQ over the stacked rows of every linear reading this input (rows are independent given H)."""
    weights = [modules[name].weight for name in names]
    if len(weights) > 1:
        stacked = scratch("stacked", (sum(w.shape[0] for w in weights), weights[0].shape[1]), weights[0].dtype)
        weights = [torch.cat(weights, out=stacked)]
    codes, scale, zero = gptq_int4(weights[0], hessian, group, overwrite=True)
    start = 0
    for name in names:
        end = start + modules[name].weight.shape[0]
        out[name] = (codes[start:end], scale[start:end], zero[start:end])
        start = end


def _keep(inputs: dict, filled: dict, site: str, x: torch.Tensor) -> None:
    """Copy a site's input rows into its buffer: one Gram product over all tokens afterwards beats one per batch."""
    x = x.reshape(-1, x.shape[-1])
    inputs[site][filled[site]:filled[site] + x.shape[0]].copy_(x)
    filled[site] += x.shape[0]


class _Stop(Exception):
    pass


def _layer_inputs(model: nn.Module, batches: list[torch.Tensor]) -> list[tuple[tuple, dict]]:
    """What the first decoder layer is called with for each batch (hidden states, mask, rotary embeddings):
    the forward stops there, so no layer runs twice and no logits are computed."""
    taken = []

    def catch(module, args, kwargs):
        taken.append((args, kwargs))
        raise _Stop

    handle = model.model.layers[0].register_forward_pre_hook(catch, with_kwargs=True)
    try:
        for ids in batches:
            try:
                model(input_ids=ids.view(1, -1), use_cache=False)
            except _Stop:
                pass
    finally:
        handle.remove()
    return taken


def _cast(value, dtype: torch.dtype):
    """Floating tensors in `value` (nested tuples, lists, dicts) cast to `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def progress_steps(model: nn.Module, names: list[str]) -> int:
    """How many `report` steps `gptq_layers` takes: per decoder layer its forward and each input site, then the
    LM head."""
    sites = [site for site in _input_sites(names) if site != "lm_head"]
    return len(model.model.layers) + len(sites) + (1 if "lm_head" in names else 0)


@torch.no_grad()
def gptq_layers(model: nn.Module, batches: list[torch.Tensor], names: list[str], group: int,
                report=None, dtype: torch.dtype | None = None, before=None,
                after=None) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """GPTQ codes for the named linears of a float model (already transformed): name -> (codes, scale, zero).

    The calibration batches (1-D id tensors) run through the decoder one layer at a time; each layer's Hessians
    are collected from its inputs, its linears rounded, and the Hessians dropped before the next layer. The
    forward and the Gram products compute in `dtype` (default `calibration_dtype()`; for bf16 on a bf16 copy of
    each layer, the float32 weights being what is rounded). The LM head's Hessian comes from the final norm's
    output. `report(done, total)` after each layer's forward and after each of its inputs is rounded (q/k/v, o,
    gate/up, down: the 1.5B's bar moves every 0.3-5 s, not every 9 s; `progress_steps` counts them);
    `before(index)` and `after(index)` around each layer's turn (W4-FPT merges a layer in float32 just before
    and drops it back to bf16 just after: one float32 layer at a time)."""
    with reusing():  # one set of scratch tensors for every layer, dropped at the end
        return _gptq_layers(model, batches, names, group, report, dtype, before, after)


def _gptq_layers(model, batches, names, group, report, dtype, before, after):
    dtype = dtype or calibration_dtype()
    modules = dict(model.named_modules())
    sites = _input_sites(names)
    layers = model.model.layers
    steps, done = progress_steps(model, names), 0
    out: dict[str, tuple] = {}
    embed = model.get_input_embeddings()
    weight = embed.weight.data
    embed.weight.data = weight.to(dtype)  # the first layer's inputs (hidden states, rotary tables) in `dtype`
    try:
        calls = [_cast(call, dtype) for call in _layer_inputs(model, batches)]
    finally:
        embed.weight.data = weight
    tokens = sum(args[0].shape[0] * args[0].shape[1] for args, _ in calls)
    buffers: dict[str, torch.Tensor] = {}
    for index, layer in enumerate(layers):
        if before:
            before(index)
        prefix = f"model.layers.{index}."
        mine = {site: readers for site, readers in sites.items() if site.startswith(prefix)}
        for site in mine:  # the same buffers every layer: fresh ones cost page faults
            if site[len(prefix):] not in buffers:
                buffers[site[len(prefix):]] = torch.empty(tokens, modules[site].in_features, dtype=dtype)
        inputs = {site: buffers[site[len(prefix):]] for site in mine}
        filled = dict.fromkeys(mine, 0)
        runner = layer if dtype == torch.float32 else copy.deepcopy(layer).to(dtype)
        hooks = [runner.get_submodule(site[len(prefix):]).register_forward_hook(
            lambda mod, args, output, site=site, inputs=inputs, filled=filled: _keep(inputs, filled, site, args[0]))
            for site in mine]
        try:
            for i, (args, kwargs) in enumerate(calls):
                hidden = runner(*args, **kwargs)
                hidden = hidden[0] if isinstance(hidden, tuple) else hidden
                calls[i] = ((hidden, *args[1:]), kwargs)
        finally:
            for h in hooks:
                h.remove()
        del runner
        done += 1
        if report:
            report(done, steps)
        for site, readers in mine.items():
            x = inputs.pop(site)
            gram = scratch("gram", (x.shape[1], x.shape[1]), zero=True)
            add_gram(gram, x)
            del x
            _round_site(modules, readers, gram, group, out)
            done += 1
            if report:
                report(done, steps)
        if after:
            after(index)
    if "lm_head" in names:
        acc = scratch("gram", (model.lm_head.in_features, model.lm_head.in_features), zero=True)
        norm = copy.deepcopy(model.model.norm).to(dtype)
        for args, _ in calls:
            hidden = norm(args[0])
            add_gram(acc, hidden.reshape(-1, hidden.shape[-1]))
        _round_site(modules, ["lm_head"], acc, group, out)
        if report:
            report(steps, steps)
    return out
