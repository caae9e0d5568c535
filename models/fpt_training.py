"""Training FPTQuant° transforms (paper A.7) instead of grid-searching them, one decoder layer at a time.

Trained per layer: the logs of the attention and MLP input scales, the MLP scale and the value scale
(models/fpt.py); the key scale ρ stays as given. The loss is the paper's local one, as OmniQuant trains its
equivalent transforms: the layer with its seven linears on the int4 grid (min-max per 128 inputs, rounding with a
straight-through gradient) and its values rounded to int8 per (token, head) as the KV cache stores them, fed the
quantized layers' states, against the float layer fed the float states (mean squared output error, the first
position of each row left out: its outsized attention-sink activations would outweigh the rest). Rounding is to
nearest here; shipped weights are then rounded by GPTQ on the same transforms.

A layer keeps its trained scales only if they measure better than its start on held-out rows. After each layer
the spec and log are saved to `state` (atomically); a rerun with the same settings continues there.
"""
from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import torch
from torch import nn

from . import int4_grid
from .fpt import FptSpec, _head_dim, left, module_maps, right

GROUP = 128
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
TRAINED = ("attn_input_scale", "mlp_input_scale", "mlp_scale", "value_scale")
HELD_OUT = 8
"""One row in this many is held out of training and decides whether a layer keeps its trained scales."""


def _ste(x: torch.Tensor) -> torch.Tensor:
    return x + (x.round() - x).detach()


def fake_int4_ste(w: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """w rounded to its min-max int4 grid per `group` inputs (models.int4_grid's convention), differentiable:
    the rounding passes gradients straight through, the grid's min and max pass theirs as computed."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / int4_grid.LEVELS).clamp(min=int4_grid.MIN_SCALE)
    zero = lo + int4_grid.MID * scale
    q = _ste((g - zero) / scale + int4_grid.MID).clamp(0, int4_grid.LEVELS)
    return ((q - int4_grid.MID) * scale + zero).reshape(n, k)


def fake_int8_ste(x: torch.Tensor, width: int) -> torch.Tensor:
    """Symmetric absmax int8 per `width` values of each row (the KV cache's per-(token, head) rounding)."""
    g = x.reshape(*x.shape[:-1], -1, width)
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
    return (_ste(g / scale).clamp(-127, 127) * scale).reshape(x.shape)


def chunks(batches: list[torch.Tensor], length: int, eos: int) -> torch.Tensor:
    """The calibration texts joined (an end-of-text token between them) and cut into rows of `length` tokens."""
    stream = torch.cat([torch.cat((b.view(-1), torch.tensor([eos]))) for b in batches])
    n = stream.numel() // length
    if n < 2:
        raise ValueError(f"the calibration texts hold {stream.numel()} tokens: too few for rows of {length}")
    return stream[: n * length].view(n, length)


def layer_params(layer: nn.Module, spec: FptSpec, config, index: int, quantize: bool) -> dict[str, torch.Tensor]:
    """The layer's weights with `spec`'s transforms merged as `merge_layer` merges them (float32, differentiable
    in the spec's tensors), each linear rounded to int4 when `quantize`: a dict for torch.func.functional_call."""
    out = {}
    for path in LINEARS:
        module = layer.get_submodule(path)
        lmap, rmap = module_maps(spec, config, f"model.layers.{index}.{path}")
        w = left(lmap, right(module.weight.float(), rmap))
        out[f"{path}.weight"] = fake_int4_ste(w) if quantize else w
        if module.bias is not None:
            out[f"{path}.bias"] = left(lmap, module.bias.float())
    out["input_layernorm.weight"] = layer.input_layernorm.weight.float() / spec.attn_input_scale[index]
    out["post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight.float() / spec.mlp_input_scale[index]
    return out


def run_layer(layer: nn.Module, params: dict, x: torch.Tensor, context: tuple, kv8: bool = False) -> torch.Tensor:
    """The decoder layer on rows x (n, length, hidden) with `params` in place of its own, causally masked;
    `context` = (cos, sin, mask, head dim) for at least n rows; `kv8`: values rounded as the int8 KV cache stores them."""
    n = len(x)
    cos, sin, mask, head_dim = context
    hook = layer.self_attn.v_proj.register_forward_hook(lambda m, a, out: fake_int8_ste(out, head_dim)) if kv8 else None
    try:
        return torch.func.functional_call(layer, params, (x,), {"position_embeddings": (cos[:n], sin[:n]),
                                                                "attention_mask": mask[:n]})
    finally:
        if hook is not None:
            hook.remove()


def layer_context(model: nn.Module, x: torch.Tensor) -> tuple:
    """(cos, sin, additive causal mask, head dim) for rows shaped like x (batch, length, hidden)."""
    b, length = x.shape[:2]
    cos, sin = model.model.rotary_emb(x, torch.arange(length).view(1, -1).expand(b, -1))
    mask = torch.full((length, length), float("-inf")).triu(1).expand(b, 1, length, length)
    return cos, sin, mask, _head_dim(model.config)


def _with(spec: FptSpec, index: int, values: dict[str, torch.Tensor]) -> FptSpec:
    """A shallow copy of `spec` whose layer `index` holds `values` (name -> tensor) for the trained scales."""
    view = copy.copy(spec)
    for name, v in values.items():
        lst = list(getattr(spec, name))
        lst[index] = v
        setattr(view, name, lst)
    return view


class LayerFit:
    """One layer's training problem: the quantized layer on `xq` against the float layer's `target`."""

    def __init__(self, layer, spec: FptSpec, config, index: int, xq, target, context, batch: int):
        self.layer, self.spec, self.config, self.index = layer, spec, config, index
        self.xq, self.target, self.context, self.batch = xq, target, context, batch

    def loss(self, rows: torch.Tensor, scales: dict, params: dict | None = None) -> torch.Tensor:
        params = params or layer_params(self.layer, _with(self.spec, self.index, scales), self.config, self.index,
                                        quantize=True)
        out = run_layer(self.layer, params, self.xq[rows], self.context, kv8=True)
        return (out - self.target[rows])[:, 1:].pow(2).mean()

    @torch.no_grad()
    def measure(self, rows: torch.Tensor, scales: dict) -> float:
        params = layer_params(self.layer, _with(self.spec, self.index, scales), self.config, self.index, True)
        parts = [rows[i:i + self.batch] for i in range(0, len(rows), self.batch)]
        return sum(float(self.loss(p, scales, params)) * len(p) for p in parts) / len(rows)

    def train(self, steps: int, lr: float, seed: int) -> tuple[dict, dict]:
        """Adam on the log-scales; returns (scales kept, log row): the trained ones if they beat the start on
        the held-out rows, else the start."""
        held = torch.arange(len(self.xq)) % HELD_OUT == HELD_OUT - 1
        train_rows, held_rows = torch.nonzero(~held).view(-1), torch.nonzero(held).view(-1)
        start = {name: getattr(self.spec, name)[self.index].float() for name in TRAINED}
        logs = {name: v.log().clone().requires_grad_(True) for name, v in start.items()}
        opt = torch.optim.Adam(logs.values(), lr=lr)
        gen = torch.Generator().manual_seed(seed + self.index)
        for _ in range(steps):
            rows = train_rows[torch.randperm(len(train_rows), generator=gen)[: self.batch]]
            loss = self.loss(rows, {k: v.exp() for k, v in logs.items()})
            opt.zero_grad()
            loss.backward()
            opt.step()
        trained = {k: v.detach().exp() for k, v in logs.items()}
        before, after = self.measure(held_rows, start), self.measure(held_rows, trained)
        kept = after < before
        return (trained if kept else start), {"layer": self.index, "held_loss_start": before,
                                              "held_loss_trained": after, "kept": kept}


@torch.no_grad()
def _outputs(layer, spec: FptSpec | None, config, index, x, context, batch) -> torch.Tensor:
    """The layer on every row of x: quantized with `spec` merged (int8 values), or the float layer (spec None)."""
    quantize = spec is not None
    params = layer_params(layer, spec if quantize else FptSpec.identity(config), config, index, quantize)
    out = torch.empty_like(x)
    for i in range(0, len(x), batch):
        out[i:i + batch] = run_layer(layer, params, x[i:i + batch], context, kv8=quantize)
    return out


def _save(state: Path, spec: FptSpec, record: dict) -> None:
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / "next"
    tmp.mkdir(exist_ok=True)
    spec.save(tmp)
    os.replace(tmp / "fpt.safetensors", state / "fpt.safetensors")
    (tmp / "log.json").write_text(json.dumps(record, indent=1))
    os.replace(tmp / "log.json", state / "log.json")  # the log last: a layer counts once both are written
    tmp.rmdir()


def resume(state: Path | None, settings: dict) -> tuple[FptSpec, dict] | None:
    """(spec, log record) saved in `state` by an earlier run with these `settings`; None when there is none.
    Raises ValueError for a run with other settings, or a log without its spec."""
    if state is None or not (state / "log.json").is_file():
        return None
    record = json.loads((state / "log.json").read_text())
    if record.get("settings") != settings:
        raise ValueError(f"{state} holds a run with other settings ({record.get('settings')}); use another")
    spec = FptSpec.load(state)
    if spec is None:
        raise ValueError(f"{state} has a log but no spec: remove the folder to start again")
    return spec, record


def train_transforms(model: nn.Module, batches: list[torch.Tensor], spec: FptSpec | None = None, *,
                     length: int = 256, steps: int = 60, batch: int = 4, lr: float = 5e-3, seed: int = 0,
                     state: Path | None = None, report=None) -> tuple[FptSpec, list[dict]]:
    """Train every layer's scales of `model` (untransformed) in turn from `spec` (None: identity; no rotation);
    returns the spec and a log row per layer. `state`: a folder the spec and log are saved in after each layer;
    a rerun with the same settings continues there (other settings are refused)."""
    config = model.config
    spec = copy.deepcopy(spec) if spec is not None else FptSpec.identity(config)
    if spec.rotation is not None:
        raise ValueError("trained transforms start from a spec without the residual rotation")
    settings = {"length": length, "steps": steps, "batch": batch, "lr": lr, "seed": seed, "group": GROUP}
    log: list[dict] = []
    saved = resume(state, settings)
    if saved is not None:
        spec, log = saved[0], saved[1]["layers"]
    model.float().requires_grad_(False)
    rows = chunks(batches, length, config.eos_token_id if isinstance(config.eos_token_id, int) else 0)
    with torch.no_grad():
        x = model.model.embed_tokens(rows)
        context = layer_context(model, x[:batch])
    xq, xf = x.clone(), x
    for index, layer in enumerate(model.model.layers):
        t = time.perf_counter()
        target = _outputs(layer, None, config, index, xf, context, batch)
        if index >= len(log):
            fit = LayerFit(layer, spec, config, index, xq, target, context, batch)
            scales, row = fit.train(steps, lr, seed)
            for name, v in scales.items():
                getattr(spec, name)[index] = v
            log.append({**row, "seconds": round(time.perf_counter() - t, 1)})
            if state is not None:
                _save(state, spec, {"settings": settings, "layers": log})
            if report:
                report(log[-1])
        xq, xf = _outputs(layer, spec, config, index, xq, context, batch), target
    return spec, log
