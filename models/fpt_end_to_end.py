"""The end-to-end stage of the FPTQuant° transforms (paper A.7): every layer's scales trained together so that the
quantized model's next-token distribution matches the float model's.

The layer-by-layer stage (models/fpt_training.py) brings each quantized layer's output close to the float layer's
on the calibration texts; that need not make the whole model answer better (dev GSM8K did not move with it on the
0.5B, docs/results.md). This stage optimises what the paper's second stage does, the model's output: the mean KL
from the float model's next-token distribution to the quantized model's (int4 weights with a straight-through
rounding, int8 values as the KV cache stores them; the LM head kept float, since no trained scale reaches it),
over the calibration rows, the first position of each row left out. Trained: the same four scales per layer, as
logs, with Adam. One row in eight is held out; the spec is kept only if it lowers their KL against the start.
The spec and log are saved every `save_every` steps (atomically); a rerun with the same settings continues from
the last save (Adam's moments start again there).
"""
from __future__ import annotations

import copy
import hashlib
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .fpt import FptSpec
from .fpt_training import GROUP, HELD_OUT, TRAINED, _save, chunks, layer_context, layer_params, resume, run_layer


def _student(model: nn.Module, spec: FptSpec, rows: torch.Tensor, context: tuple, kv8: bool = True) -> torch.Tensor:
    """Next-token log-probabilities of the quantized model with `spec` merged (differentiable in its scales).
    Each layer is recomputed in the backward pass instead of keeping its merged, rounded weights and activations
    (torch.utils.checkpoint): the graph then holds one layer's at a time, as the layer-by-layer stage does."""
    def layer_out(index: int, x: torch.Tensor, *scales: torch.Tensor) -> torch.Tensor:
        layer = model.model.layers[index]
        return run_layer(layer, layer_params(layer, spec, model.config, index, quantize=True), x, context, kv8=kv8)

    x = model.model.embed_tokens(rows)
    for index in range(len(model.model.layers)):
        scales = [getattr(spec, name)[index] for name in TRAINED]  # inputs, so that their gradients flow back
        x = checkpoint(layer_out, index, x, *scales, use_reentrant=False) if torch.is_grad_enabled() else \
            layer_out(index, x)
    return F.log_softmax(model.lm_head(model.model.norm(x)).float(), dim=-1)


def spec_sha256(spec: FptSpec) -> str:
    """A fingerprint of the scales a run starts from (part of its settings: a rerun from another start is refused)."""
    h = hashlib.sha256()
    for name in TRAINED:
        for t in getattr(spec, name):
            h.update(t.float().contiguous().numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def _teacher(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(model(input_ids=rows).logits.float(), dim=-1)


def _kl(teacher: torch.Tensor, student: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean KL(teacher || student) per position, the first position of each row left out; with `weights` (rows'
    shape), the weighted mean over every position instead (weight 0: not scored)."""
    if weights is not None:
        return ((teacher.exp() * (teacher - student)).sum(-1) * weights).sum() / weights.sum()
    t, s = teacher[:, 1:], student[:, 1:]
    return (t.exp() * (t - s)).sum(-1).mean()


def _spec_of(spec: FptSpec, logs: dict[str, list[torch.Tensor]]) -> FptSpec:
    view = copy.copy(spec)
    for name, values in logs.items():
        setattr(view, name, [v.exp() for v in values])
    return view


def held_kl(model: nn.Module, spec: FptSpec, rows: torch.Tensor, batch: int, weights: torch.Tensor | None = None,
            kv8: bool = True) -> float:
    """Mean KL of the quantized model with `spec` to the float model over `rows` (weighted by position: `weights`)."""
    total, count = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            part, w = rows[i:i + batch], None if weights is None else weights[i:i + batch]
            context = layer_context(model, model.model.embed_tokens(part))
            n = len(part) if w is None else float(w.sum())
            total += float(_kl(_teacher(model, part), _student(model, spec, part, context, kv8), w)) * n
            count += n
    return total / count


def train_end_to_end(model: nn.Module, batches: list[torch.Tensor], spec: FptSpec, *, length: int = 256,
                     steps: int = 60, batch: int = 2, lr: float = 2e-3, seed: int = 0, save_every: int = 5,
                     state: Path | None = None, report=None, texts: str = "shipped",
                     rows: tuple[torch.Tensor, torch.Tensor] | None = None, kv8: bool = True) -> tuple[FptSpec, dict]:
    """Train all layers' scales of `model` (untransformed) from `spec` (no rotation) against the float model's
    outputs; returns the spec kept (trained if it beats `spec` on the held-out rows, else `spec`) and the log.
    `texts` names the texts `batches` hold (a run resumes only on the same). `rows`: (token rows, per-position
    weights of their predictions) to train on instead of `batches` cut into rows of `length`; `kv8` False keeps
    the values in float (a bf16 cache) instead of rounding them as the int8 cache does."""
    if spec.rotation is not None:
        raise ValueError("trained transforms start from a spec without the residual rotation")
    config = model.config
    settings = {"stage": "end-to-end", "length": length, "steps": steps, "batch": batch, "lr": lr, "seed": seed,
                "group": GROUP, "start_sha256": spec_sha256(spec)}
    if texts != "shipped":  # the settings of runs on the shipped texts alone stay as they were (they resume)
        settings["texts"] = texts
    if rows is not None:  # likewise: added only where they differ from the runs before them
        digest = hashlib.sha256(rows[0].numpy().tobytes() + rows[1].float().numpy().tobytes())
        settings["weighted_rows"] = digest.hexdigest()  # a rerun on other rows or weights is refused
    if not kv8:
        settings["kv8"] = False
    start_spec, done, losses, seconds = copy.deepcopy(spec), 0, [], 0.0
    saved = resume(state, settings)
    if saved is not None:
        spec, record = saved
        done, losses, seconds = record["steps_done"], record["losses"], record.get("seconds", 0.0)
    model.float().requires_grad_(False)
    if rows is None:
        rows, weights = chunks(batches, length, config.eos_token_id if isinstance(config.eos_token_id, int) else 0), None
    else:
        rows, weights = rows
    held = torch.arange(len(rows)) % HELD_OUT == HELD_OUT - 1
    train_rows, held_rows = rows[~held], rows[held]
    train_w, held_w = (None, None) if weights is None else (weights[~held], weights[held])
    if len(held_rows) == 0 or len(train_rows) < batch:
        raise ValueError(f"the calibration texts make {len(rows)} rows of {length} tokens: too few to hold one in "
                         f"{HELD_OUT} out and train on {batch} a step")
    logs = {name: [v.float().log().clone().requires_grad_(True) for v in getattr(spec, name)] for name in TRAINED}
    opt = torch.optim.Adam([v for values in logs.values() for v in values], lr=lr)
    context = layer_context(model, model.model.embed_tokens(train_rows[:batch]))
    gen = torch.Generator().manual_seed(seed)
    order = [torch.randperm(len(train_rows), generator=gen)[:batch] for _ in range(steps)]  # the same on a rerun
    t = time.perf_counter()
    for step in range(done, steps):
        part, w = train_rows[order[step]], None if train_w is None else train_w[order[step]]
        loss = _kl(_teacher(model, part), _student(model, _spec_of(spec, logs), part, context, kv8), w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 6))
        if report:
            report({"step": step + 1, "kl": losses[-1], "seconds": round(time.perf_counter() - t, 1)})
        if state is not None and ((step + 1) % save_every == 0 or step + 1 == steps):
            with torch.no_grad():
                _save(state, _spec_of(spec, logs), {"settings": settings, "steps_done": step + 1, "losses": losses,
                                                    "seconds": round(seconds + time.perf_counter() - t, 1)})
    with torch.no_grad():
        trained = _spec_of(spec, logs)
        for name in TRAINED:
            setattr(trained, name, [v.detach() for v in getattr(trained, name)])
    before = held_kl(model, start_spec, held_rows, batch, held_w, kv8)
    after = held_kl(model, trained, held_rows, batch, held_w, kv8)
    log = {"steps": steps, "losses": losses, "held_kl_start": before, "held_kl_trained": after,
           "kept": after < before, "seconds": round(seconds + time.perf_counter() - t, 1)}
    return (trained if after < before else start_spec), log
