"""A candidate's confidence from its own token log-probs (DeepConf, Fu et al., 2025): no extra model, no forward.

The decode loop records each sampled token's log-prob (`Row.logprobs`). Two summaries per candidate:
- `mean`: the mean log-prob of its sampled tokens (thinking and answer), a length-free average confidence;
- `lowest`: the lowest mean over any `WINDOW` consecutive tokens (DeepConf's lowest group confidence): one
  confused stretch marks a trace as doubtful even when the rest reads fluently.
Weights for a vote are exp() of either: a geometric-mean token probability in (0, 1].
"""
from __future__ import annotations

import math
from collections.abc import Sequence

WINDOW = 16
"""Tokens per window of the lowest-window confidence (DeepConf uses 2,048 on traces of thousands of tokens; ours
are a few hundred)."""


def token_confidence(logprobs: Sequence[float | None], window: int = WINDOW) -> tuple[float, float] | None:
    """(mean, lowest window mean) of the recorded log-probs (None/NaN entries skipped); None when there are none.
    A candidate shorter than the window has its mean as its lowest window."""
    values = [v for v in logprobs if v is not None and not math.isnan(v)]
    if not values:
        return None
    mean = sum(values) / len(values)
    if len(values) <= window:
        return mean, mean
    run = sum(values[:window])
    lowest = run
    for i in range(window, len(values)):
        run += values[i] - values[i - window]
        lowest = min(lowest, run)
    return mean, lowest / window
