"""Caprese: low-rank branches beside GRIFFIN's cut feed-forward blocks that give back what the cut drops.

Per layer, a rank-r branch L·(R·x) runs beside the cut block (x: the block's input after the norm), so a decode
step computes FF_cut(x) + L·R·x (docs/algorithms.md B.3; the weights of the model stay as they are). Where the cut
projections are bf16 the branch is folded into them (`core.sparse.cut.fold_branch`: R as more rows of up, L as more
columns of down), so it costs no pass of its own; packed int4 ones take it rounded to int4 (when the rank is a
multiple of 64). Layer-wise training: on teacher-forced math text, with each sequence's own GRIFFIN selection
taken from its prompt (as at inference), the residual y = FF_dense(x) − FF_cut(x) of every response token is
recorded, and L·R is the rank-r least-squares fit of y from x — in closed form rather than by SGD: with S_xx = Σ
x·xᵀ and S_yx = Σ y·xᵀ, the full-rank fit is W = S_yx·(S_xx + λI)⁻¹, and the best rank-r one keeps W's outputs on
the top-r eigenvectors U of W·S_xx·Wᵀ (reduced-rank regression): L = U, R = Uᵀ·W. The sums come from teacher
inputs of the quantized model the app serves (QAMR), with the reasoning adapter on for the response as in Reason
mode. The end-to-end stage (a KL loss through the whole model) follows in core.sparse.caprese_e2e; `ponder train caprese`
runs both.

Branches are saved in the untransformed basis (like adapters and heads): on a W4-FPT model R reads the
transformed norm output and L writes the rotated residual, so both are mapped at save and load (models/fpt.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F

from core.sparse.ff import SparsePlan, _layers, teacher_forced
from models.fpt import fpt_of, invert, left, module_maps, right

WEIGHTS_FILE = "caprese.safetensors"
META_FILE = "caprese.json"


@dataclass
class Branches:
    """One model's Caprese branches: `down[i]` = L (hidden, r), `up[i]` = R (r, hidden) of layer i, in the
    basis of the model they are attached to; `meta` says what they were fitted for."""

    up: list[torch.Tensor]
    down: list[torch.Tensor]
    meta: dict = field(default_factory=dict)

    def __call__(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.up[layer]), self.down[layer])

    @property
    def keep(self) -> float:
        return float(self.meta.get("ff_keep", 0.5))


class Moments:
    """Running sums for one layer's least-squares fit: S_xx, S_yx, Σ|y|², Σ|dense|², tokens."""

    def __init__(self, hidden: int):
        self.xx = torch.zeros(hidden, hidden, dtype=torch.float64)
        self.yx = torch.zeros(hidden, hidden, dtype=torch.float64)
        self.yy = self.dd = 0.0
        self.tokens = 0

    def add(self, x: torch.Tensor, y: torch.Tensor, dense: torch.Tensor) -> None:
        x, y = x.reshape(-1, x.shape[-1]).double(), y.reshape(-1, y.shape[-1]).double()
        self.xx += x.t() @ x
        self.yx += y.t() @ x
        self.yy += float(y.square().sum())
        self.dd += float(dense.double().square().sum())
        self.tokens += x.shape[0]

    def error(self, w: torch.Tensor | None) -> float:
        """Σ|y − W·x|² / Σ|dense|²: the cut's feed-forward error left after the branch W (None: no branch)."""
        if w is None:
            return self.yy / max(self.dd, 1e-12)
        w = w.double()
        rest = self.yy - 2 * float((w * self.yx).sum()) + float((w @ self.xx * w).sum())
        return max(rest, 0.0) / max(self.dd, 1e-12)


def fit(m: Moments, rank: int, ridge: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """(R (r, hidden), L (hidden, r)): the rank-r least-squares branch for these sums (reduced-rank regression)."""
    hidden = m.xx.shape[0]
    reg = ridge * float(torch.diagonal(m.xx).mean()) + 1e-8
    w = torch.linalg.solve(m.xx + reg * torch.eye(hidden, dtype=torch.float64), m.yx.t()).t()  # S_yx (S_xx+λI)⁻¹
    _, vecs = torch.linalg.eigh(w @ m.xx @ w.t())
    u = vecs[:, -rank:]  # top-r directions of the fitted outputs
    return (u.t() @ w).float(), u.float()


def collect(engine, examples, plan: SparsePlan, report=lambda i, n: None) -> list[Moments]:
    """Per-layer sums of (x, FF_dense(x) − FF_sparse(x)) over the response tokens of `examples` (SftExample), the
    sparse blocks those `plan` gives the sequence (GRIFFIN: cut by its own prompt), the reasoning adapter on for
    the response."""
    layers = _layers(engine.model)
    moments = [Moments(engine.model.config.hidden_size) for _ in layers]

    def hooks(selection):
        blocks = selection.blocks[0]
        return [layer.mlp.register_forward_hook(_recorder(moments[i], blocks[i]))
                for i, layer in enumerate(layers) if blocks[i] is not None]

    for n, ex in enumerate(examples):
        teacher_forced(engine, ex, hooks, plan)
        report(n + 1, len(examples))
    return moments


def _recorder(moments: Moments, block):
    """A forward hook on a dense feed-forward block adding (x, dense − cut) to `moments`."""
    def hook(_module, args, output):
        moments.add(args[0], output - block(args[0]), output)
    return hook


def _maps(model, i: int):
    spec = fpt_of(model)
    if spec is None:
        return None, None
    _, reads = module_maps(spec, model.config, f"model.layers.{i}.mlp.gate_proj")
    writes, _ = module_maps(spec, model.config, f"model.layers.{i}.mlp.down_proj")
    return reads, writes


def save(branches: Branches, model, folder: Path) -> Path:
    """Write the branches (mapped back to the untransformed basis) and their meta into `folder`, atomically."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i, (r, low) in enumerate(zip(branches.up, branches.down, strict=True)):
        reads, writes = _maps(model, i)
        tensors[f"layers.{i}.R"] = right(r.float(), invert(reads)).to(torch.bfloat16).contiguous()
        tensors[f"layers.{i}.L"] = left(invert(writes), low.float()).to(torch.bfloat16).contiguous()
    tmp = folder / (WEIGHTS_FILE + ".part")
    save_file(tensors, str(tmp))
    tmp.replace(folder / WEIGHTS_FILE)
    meta_tmp = folder / (META_FILE + ".part")
    meta_tmp.write_text(json.dumps(branches.meta, indent=2))
    meta_tmp.replace(folder / META_FILE)
    return folder


def load(folder: Path, model) -> Branches:
    """Branches saved by `save`, mapped into `model`'s basis; safetensors only. Raises ValueError when they do
    not fit the model (layer count, hidden size)."""
    from safetensors.torch import load_file

    meta = json.loads((folder / META_FILE).read_text())
    tensors = load_file(str(folder / WEIGHTS_FILE))
    layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
    up, down = [], []
    for i in range(layers):
        r, low = tensors.get(f"layers.{i}.R"), tensors.get(f"layers.{i}.L")
        if r is None or low is None or r.shape[1] != hidden or low.shape[0] != hidden or r.shape[0] != low.shape[1]:
            raise ValueError(f"{folder / WEIGHTS_FILE} does not fit this model (layer {i})")
        reads, writes = _maps(model, i)
        up.append(right(r.float(), reads).to(torch.bfloat16).contiguous())
        down.append(left(writes, low.float()).to(torch.bfloat16).contiguous())
    return Branches(up, down, meta)


def train(engine, train_examples, dev_examples, *, rank: int, plan: SparsePlan, report=print
          ) -> tuple[Branches, dict]:
    """Fit rank-`rank` branches for the sparse blocks of `plan` on `train_examples`; measure on `dev_examples`."""
    t = time.perf_counter()
    train_m = collect(engine, train_examples, plan, lambda i, n: report(f"train sequence {i}/{n}"))
    dev_m = collect(engine, dev_examples, plan, lambda i, n: report(f"dev sequence {i}/{n}")) if dev_examples else []
    up, down, per_layer = [], [], []
    for i, m in enumerate(train_m):
        r, low = fit(m, rank)
        up.append(r.to(torch.bfloat16))
        down.append(low.to(torch.bfloat16))
        w = low @ r
        row = {"layer": i, "train_error_sparse": m.error(None), "train_error_caprese": m.error(w)}
        if dev_m:
            row.update(dev_error_sparse=dev_m[i].error(None), dev_error_caprese=dev_m[i].error(w))
        per_layer.append(row)
    stats = {"layers": per_layer, "train_tokens": train_m[0].tokens, "dev_tokens": dev_m[0].tokens if dev_m else 0,
             "seconds": round(time.perf_counter() - t, 1)}
    for key in ("train_error_sparse", "train_error_caprese", "dev_error_sparse", "dev_error_caprese"):
        if per_layer and key in per_layer[0]:
            stats["mean_" + key] = sum(r[key] for r in per_layer) / len(per_layer)
    meta = {"rank": rank, "sparse": plan.kind, "ff_keep": plan.keep if plan.kind == "griffin" else None,
            "precision": engine.precision, "model": engine.model_id,
            "method": "layer-wise reduced-rank least squares on teacher inputs (closed form)", **stats}
    return Branches(up, down, meta), meta
