"""The switcher: P(reasoning needed) from the base model's prefill hidden states, and a threshold.

Receives the hidden states the engine's prefill already computed; never runs a forward pass of its own.
"""
from __future__ import annotations

from pathlib import Path

import torch

from models.heads import chunk_ema, load_head


class Router:
    def __init__(self, head, config: dict):
        self.head = head.eval()
        self.config = config
        self.threshold = float(config.get("threshold", 0.5))
        self.chunk = int(config.get("chunk", 128))
        self.alpha = float(config.get("alpha", 0.5))

    @classmethod
    def load(cls, folder: Path) -> Router:
        return cls(*load_head(folder, "switcher"))

    @torch.inference_mode()
    def probability(self, hidden: torch.Tensor) -> float:
        """hidden: (1, T, H) last-layer prefill states -> P(reasoning needed)."""
        pooled = chunk_ema(hidden[0], self.chunk, self.alpha)
        return float(torch.sigmoid(self.head(pooled.unsqueeze(0).to(torch.float32)))[0])
