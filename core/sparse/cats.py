"""CATS: a per-layer threshold on |SiLU(gate)| that zeroes the weakest feed-forward activations of each token.

Calibration (docs/algorithms.md B.2): over the response tokens of calibration text (math solutions and chat replies),
layer ℓ's threshold t_ℓ is the `sparsity`-quantile of |SiLU(W_gate·x)|; at decode, h = SiLU(W_gate·x) with
h[|h| < t_ℓ] = 0, and FF(x) = W_down·(h ⊙ W_up·x). Prefill stays dense. The paper turns the zeros into speed
with a custom sparse GEMV; torch's packed int4 kernels on the CPU have none, so here CATS still reads every
weight: it is offered to measure what the thresholding costs in accuracy (and what Caprese gives back), not
for speed. Thresholds are saved per model as the `cats` component (cats.json), with the weights they were
calibrated on.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.nn import functional as F

from core.sparse.ff import _layers, teacher_forced

META_FILE = "cats.json"
SAMPLE = 1 << 20
"""Activations kept per layer for the quantile (a uniform sample of all tokens × neurons)."""


def thresholds_for(samples: list[torch.Tensor], sparsity: float) -> list[float]:
    """The `sparsity`-quantile of each layer's |SiLU(gate)| samples."""
    if not 0 <= sparsity < 1:
        raise ValueError("sparsity must be in [0, 1)")
    out = []
    for s in samples:
        if sparsity == 0 or s.numel() == 0:
            out.append(0.0)
            continue
        k = max(1, min(s.numel(), round(sparsity * s.numel())))
        out.append(float(s.kthvalue(k).values))
    return out


def calibrate(engine, examples, sparsity: float, report=lambda i, n: None, seed: int = 0) -> list[float]:
    """Per-layer thresholds from |SiLU(gate)| on the response tokens of `examples` (SftExample), run as in
    Reason mode: the prompt by the base model, the response with the reasoning adapter."""
    layers = _layers(engine.model)
    gen = torch.Generator().manual_seed(seed)
    seen: list[list[torch.Tensor]] = [[] for _ in layers]
    per_sequence = max(1, SAMPLE // max(1, len(examples)))

    def recorder(i):
        def hook(_module, _args, output):
            a = F.silu(output.float()).abs().flatten()
            pick = torch.randint(0, a.numel(), (min(per_sequence, a.numel()),), generator=gen)
            seen[i].append(a[pick])
        return hook

    for n, ex in enumerate(examples):
        teacher_forced(engine, ex, lambda _selection: [layer.mlp.gate_proj.register_forward_hook(recorder(i))
                                                      for i, layer in enumerate(layers)])
        report(n + 1, len(examples))
    return thresholds_for([torch.cat(s) if s else torch.empty(0) for s in seen], sparsity)


def save(folder: Path, thresholds: list[float], meta: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (META_FILE + ".part")
    tmp.write_text(json.dumps({**meta, "thresholds": thresholds}, indent=2))
    tmp.replace(folder / META_FILE)
    return folder


def load(folder: Path, layers: int) -> dict:
    """cats.json as saved; ValueError when it does not fit a model of `layers` layers."""
    meta = json.loads((folder / META_FILE).read_text())
    t = meta.get("thresholds")
    if not isinstance(t, list) or len(t) != layers or not all(isinstance(v, int | float) and v >= 0 for v in t):
        raise ValueError(f"{folder / META_FILE} holds no thresholds for {layers} layers")
    return meta
