"""Caprese's end-to-end stage: every layer's branch trained together so that the sparse model's next-token
distribution matches the dense model's, KL(p_dense ‖ p_sparse+branches), on teacher-forced math text.

The layer-wise fit (core.sparse.caprese) makes each block's output close to the dense block's on the dense model's
inputs; the errors it leaves still add up through 24 layers, and what each layer misses matters unequally for
the next token. This stage starts from those branches and descends on the output distribution (docs/algorithms.md
B.3, "E2E"). It runs on the weights the app serves, dequantized to their exact grid so backward runs on dense
bf16 kernels (as SFT does, QAMR), with the reasoning adapter on for the response as in Reason mode; the model's
weights and the adapter stay frozen, only the branches' L and R learn.

In training the sparse block is the masked dense one (the cut blocks of core.sparse.ff compute the same numbers,
tests/core/test_sparse_ff.py): GRIFFIN keeps the neurons the sequence's own prompt picks, in the same chunks the
packed int4 cut keeps; CATS zeroes |SiLU(gate)| under its layer's threshold.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F

from core.adapters import lora as adapters
from core.decode.cache import crop, new_cache
from core.sparse.caprese import Branches
from core.sparse.cut import choose_neurons
from core.sparse.ff import Scorer, SparsePlan, _layers, kept_count


def griffin_masks(scorer: Scorer, layers: int, group: int | None) -> list[torch.Tensor]:
    """Per layer, the 0/1 mask (I,) of the neurons GRIFFIN keeps for the one prompt `scorer` saw."""
    masks = []
    for i in range(layers):
        scores = scorer.sums[i][0]
        kept = choose_neurons(scores, kept_count(scores.numel(), scorer.keep), group)
        mask = torch.zeros(scores.numel())
        mask[kept] = 1
        masks.append(mask)
    return masks


def _sparse_mlp(mlp, up_param: torch.Tensor, down_param: torch.Tensor, mask=None, threshold=None):
    """A forward for `mlp`: its sparse block (neuron `mask` or CATS `threshold`) plus the branch L·(R·x), the
    branch in float32 (its parameters' dtype)."""
    def forward(x):
        h = mlp.act_fn(mlp.gate_proj(x))
        if threshold is not None:
            h = h.masked_fill(h.abs() < threshold, 0)
        z = h * mlp.up_proj(x)
        if mask is not None:
            z = z * mask.to(z.dtype)
        out = mlp.down_proj(z)
        return out + F.linear(F.linear(x.float(), up_param), down_param).to(out.dtype)
    return forward


@contextlib.contextmanager
def sparse_forward(model, up: list[torch.Tensor], down: list[torch.Tensor], masks=None, thresholds=None):
    """Inside, each layer's feed-forward runs sparse with its branch (up[i] = R, down[i] = L)."""
    layers = _layers(model)
    for i, layer in enumerate(layers):
        layer.mlp.forward = _sparse_mlp(layer.mlp, up[i], down[i], None if masks is None else masks[i],
                                        None if thresholds is None else thresholds[i])
    try:
        yield
    finally:
        for layer in layers:
            del layer.mlp.forward  # back to the class's forward


def sequence_kl(model, prompt: list[int], response: list[int], plan: SparsePlan, up, down,
                group: int | None = None) -> torch.Tensor:
    """Mean KL(dense ‖ sparse + branches) of the next-token distributions over the response tokens: the prompt
    by the base model (dense, where GRIFFIN scores its neurons), the response with the adapter on."""
    layers = len(_layers(model))
    cache = new_cache(model.config, "bf16")
    scorer = Scorer(plan.keep)
    with torch.no_grad(), adapters.base(model), (
            scorer.collect(model) if plan.kind == "griffin" else contextlib.nullcontext()):
        model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1)
    masks = griffin_masks(scorer, layers, group) if plan.kind == "griffin" else None
    return kl_after(model, cache, response[:-1], up, down, masks, plan.thresholds)


def kl_after(model, cache, tokens: list[int], up, down, masks=None, thresholds=None) -> torch.Tensor:
    """Mean KL(dense ‖ sparse + branches) of the next-token distributions over `tokens` fed after what `cache`
    holds (adapters as they are set): once dense without gradient, then sparse from the same cache."""
    start = cache.get_seq_length()
    inputs = torch.tensor([tokens])
    with torch.no_grad():
        dense = F.log_softmax(model(input_ids=inputs, cache=cache, use_cache=True).logits[0].float(), dim=-1)
    crop(cache, start)
    with sparse_forward(model, up, down, masks, thresholds):
        logits = model(input_ids=inputs, cache=cache, use_cache=True).logits[0].float()
    return F.kl_div(F.log_softmax(logits, dim=-1), dense, log_target=True, reduction="batchmean")


def mean_kl(model, encoded, plan: SparsePlan, up, down, group: int | None = None) -> float:
    with torch.no_grad():
        return sum(sequence_kl(model, p, r, plan, up, down, group).item() for p, r in encoded) / max(len(encoded), 1)


def train_e2e(model, train_encoded, dev_encoded, branches: Branches, plan: SparsePlan, *, steps: int,
              lr: float = 5e-5, group: int | None = None, eval_every: int = 32, seed: int = 0,
              report: Callable[[dict], None] = lambda entry: None, should_stop=lambda: False
              ) -> tuple[Branches, dict]:
    """Train `branches` (in `model`'s basis) end to end for `steps` sequences of `train_encoded` ((prompt,
    response) token lists); keep the branches with the lowest dev KL seen (the start included). Ctrl+C (or
    `should_stop()`) ends the run early with what it has. Returns the kept branches and the run's stats."""
    up = [r.float().clone().requires_grad_(True) for r in branches.up]
    down = [low.float().clone().requires_grad_(True) for low in branches.down]
    zero_up = [torch.zeros_like(r) for r in up]
    zero_down = [torch.zeros_like(low) for low in down]
    optim = torch.optim.AdamW(up + down, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    order = [rng.randrange(len(train_encoded)) for _ in range(steps)]
    t0 = time.perf_counter()
    stats = {"dev_kl_sparse": mean_kl(model, dev_encoded, plan, zero_up, zero_down, group),
             "dev_kl_layerwise": mean_kl(model, dev_encoded, plan, up, down, group)}
    best = (stats["dev_kl_layerwise"], 0, [r.detach().clone() for r in up], [low.detach().clone() for low in down])
    report({"step": 0, **stats})
    log, done = [], 0
    try:
        for step, idx in enumerate(order, 1):
            if should_stop():
                break
            for g in optim.param_groups:  # warm up over the first 8 steps, then cosine to 10%
                g["lr"] = lr * min(1.0, step / 8) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
            prompt, response = train_encoded[idx]
            loss = sequence_kl(model, prompt, response, plan, up, down, group)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(up + down, 1.0)
            optim.step()
            done = step
            entry = {"step": step, "train_kl": round(loss.item(), 5), "seconds": round(time.perf_counter() - t0, 1)}
            if step % eval_every == 0 or step == steps:
                entry["dev_kl"] = mean_kl(model, dev_encoded, plan, up, down, group)
                if entry["dev_kl"] < best[0]:
                    best = (entry["dev_kl"], step, [r.detach().clone() for r in up],
                            [low.detach().clone() for low in down])
            log.append(entry)
            report(entry)
    except KeyboardInterrupt:
        report({"stopped": done})
    stats.update(dev_kl_e2e=best[0], best_step=best[1], steps_done=done, steps=steps, lr=lr,
                 e2e_seconds=round(time.perf_counter() - t0, 1), log=log)
    meta = {**branches.meta, "e2e": {k: v for k, v in stats.items() if k != "log"}}
    meta["method"] = (branches.meta.get("method", "layer-wise") + "; then end to end: AdamW on "
                      "KL(dense || sparse + branches) over response tokens, best dev KL kept")
    kept = Branches([r.to(torch.bfloat16) for r in best[2]], [low.to(torch.bfloat16) for low in best[3]], meta)
    return kept, stats
