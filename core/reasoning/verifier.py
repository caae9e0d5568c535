"""The verifier: P(this response is correct) from the generator's own hidden state at the end of a short
verification prompt appended to each stream (reusing that stream's cache). Never runs its own forward pass."""
from __future__ import annotations

from pathlib import Path

import torch

from models.heads import load_head


class Verifier:
    def __init__(self, head, config: dict):
        self.head = head.eval()
        self.config = config

    @classmethod
    def load(cls, folder: Path) -> Verifier:
        return cls(*load_head(folder, "verifier"))

    @torch.inference_mode()
    def scores(self, hidden: torch.Tensor) -> list[float]:
        """hidden: (B, H) states at the verification prompt's last token -> B probabilities (calibrated when the
        head was saved with a Platt scaling, core.training.heads.platt_scaling)."""
        logits = self.head(hidden.to(torch.float32))
        calibration = self.config.get("calibration")
        if calibration:
            logits = logits * calibration["scale"] + calibration["shift"]
        return torch.sigmoid(logits).tolist()
