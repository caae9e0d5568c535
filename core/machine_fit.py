"""Which model this machine runs well: the first-launch choice between the 1.5B and the embedded 0.5B.

"Runs well" is judged on two things measured here, before anything is downloaded:
- memory: the 1.5B's one-time conversion holds its weights in float32 (about `conversion_peak_bytes`, 9.7 GB)
  and its W4-FPT preparation peaks at 9.0 GiB (it merges one layer at a time:
  models.fpt_calibration.quantize_w4_fpt), so it is chosen only where 9.7 GB are available now;
- decode speed: the 1.5B's int4 matrix-vector products, on weights of its exact shapes packed as the app packs
  them and run by the kernel the app runs (models.int4_kernel), timed for a few tokens. Those products are
  nearly all of a decode step (the rest, attention over a short context, norms and sampling, is about a tenth),
  so tokens per second is estimated as 0.9 / (seconds of one token's products). The 1.5B is chosen at
  MIN_TOK_S or more: faster than people read (about 5 words, 7 tokens, a second).
On the 2-core machines this project measures on, the 1.5B decodes at 14.9 (Intel Xeon) to 38.5 tok/s (AMD
EPYC) and is right twice as often on GSM8K as the 0.5B: both pick the 1.5B. A laptop with 8 GB picks the 0.5B.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import psutil
import torch

from models.registry import DEFAULT_MODEL_ID, KNOWN_MODELS, ModelSpec

LARGER_MODEL_ID = "qwen2.5-coder-1.5b-instruct"
MIN_TOK_S = 8.0
"""Estimated decode speed from which the 1.5B is chosen."""
STEP_SHARE = 0.9
"""Share of a decode step spent in the int4 products (the rest: attention, norms, sampling)."""
GROUP = 128


@dataclass(frozen=True)
class ModelChoice:
    model_id: str
    reason: str
    """One sentence for the window: which model, and the measurements that chose it."""
    estimated_tok_s: float | None
    available_bytes: int


def intermediate_size(spec: ModelSpec) -> int:
    """The feed-forward width, from the parameter count (Qwen2: q/k/v biases, two norms a layer, tied head)."""
    h, kv = spec.hidden_size, spec.num_kv_heads * spec.head_dim
    per_layer = (spec.params - spec.embedding_params) // spec.num_layers
    attention = 2 * h * h + 2 * h * kv + h + 2 * kv + 2 * h
    return round((per_layer - attention) / (3 * h))


def _packed(out_features: int, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int4 weights of this shape in the app's packed layout (the values do not change a product's cost)."""
    from models import int4_kernel

    data = torch.full((out_features, in_features // 2), 0x5A, dtype=torch.uint8)
    scales = torch.full((in_features // GROUP, out_features, 2), 0.01, dtype=torch.bfloat16)
    if int4_kernel.p32_fits(out_features, in_features, GROUP):  # AVX2: the layout the weights move into at load
        data = data.view(torch.int8)  # constant bytes: their values do not change the cost
    return data, scales


def estimate_tok_s(spec: ModelSpec, seconds: float = 1.0, clock=time.perf_counter) -> float:
    """Estimated decode tokens/s of `spec` at W4 on this machine: its int4 products timed for `seconds` of `clock`
    (wall time; a test on a shared machine passes `time.process_time`, which other jobs on the cores do not move)."""
    from models.int4_kernel import int4_mm

    h, kv, inter = spec.hidden_size, spec.num_kv_heads * spec.head_dim, intermediate_size(spec)
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (inter, h), (inter, h), (h, inter)] * spec.num_layers
    shapes.append((spec.vocab_size, h))
    weights = [_packed(o, i) for o, i in shapes]
    x = {i: torch.full((1, i), 0.5, dtype=torch.bfloat16) for i in (h, inter)}

    def token():
        for (_, i), (data, scales) in zip(shapes, weights, strict=True):
            int4_mm(x[i], data, GROUP, scales)

    token()
    tokens, start = 0, clock()
    while tokens < 3 or clock() - start < seconds:
        token()
        tokens += 1
    return STEP_SHARE * tokens / (clock() - start)


def choose_model(available: int | None = None, estimate=estimate_tok_s) -> ModelChoice:
    """The model to start with on this machine, and why (see the module docstring for the thresholds)."""
    available = psutil.virtual_memory().available if available is None else available
    larger, default = KNOWN_MODELS[LARGER_MODEL_ID], KNOWN_MODELS[DEFAULT_MODEL_ID]
    need = larger.conversion_peak_bytes()
    gib = 2**30
    if available < need:
        return ModelChoice(DEFAULT_MODEL_ID, f"{default.display_name}: this computer has {available / gib:.1f} GiB "
                           f"of memory free and the 1.5B needs {need / gib:.1f} GiB to prepare.", None, available)
    tok_s = estimate(larger)
    if tok_s < MIN_TOK_S:
        return ModelChoice(DEFAULT_MODEL_ID, f"{default.display_name}: the 1.5B would decode at about "
                           f"{tok_s:.0f} tokens/s on this CPU (measured), under {MIN_TOK_S:.0f}.", tok_s, available)
    return ModelChoice(LARGER_MODEL_ID, f"{larger.display_name}: it decodes at about {tok_s:.0f} tokens/s on this "
                       f"CPU (measured) with {available / gib:.0f} GiB of memory free, and answers math questions "
                       "right about twice as often as the 0.5B.", tok_s, available)
