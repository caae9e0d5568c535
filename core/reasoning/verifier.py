"""The verifier: P(this response is correct) from the generator's own hidden state at the end of a short
verification prompt appended to each stream (reusing that stream's cache). Never runs its own forward pass.

A verifier saved with a `combiner` (`core.training.combiner`) also weighs what the N candidates say of themselves:
its own score's logit, the candidate's mean and lowest-window token log-prob (`core.reasoning.confidence`) and
its vote share (the fraction of the N candidates giving the same final answer), through a logistic regression
fitted on out-of-fold scores."""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from core.reasoning.voting import same_answer
from models.heads import load_head

COMBINED_FEATURES = ("verifier_logit", "logprob_mean", "logprob_lowest", "vote_share")


def vote_shares(answers: Sequence[str | None]) -> list[float]:
    """Each candidate's share of all candidates in its answer's group (0 without an answer), the groups formed as
    `vote` forms them: each answer joins the first earlier group whose first answer it equals (math-verify)."""
    firsts: list[str] = []
    group: list[int | None] = []
    for a in answers:
        if a is None:
            group.append(None)
            continue
        g = next((i for i, first in enumerate(firsts) if same_answer(first, a)), None)
        if g is None:
            firsts.append(a)
            g = len(firsts) - 1
        group.append(g)
    sizes = [group.count(g) for g in range(len(firsts))]
    return [0.0 if g is None else sizes[g] / len(answers) for g in group]


def combined_features(score: float, mean: float, lowest: float, share: float) -> list[float]:
    """One candidate's combiner inputs, in COMBINED_FEATURES order (the score as a clipped logit)."""
    p = min(max(score, 1e-6), 1 - 1e-6)
    return [math.log(p / (1 - p)), mean, lowest, share]


class Verifier:
    def __init__(self, head, config: dict):
        self.head = head.eval()
        self.config = config
        self.vote = config.get("vote", "weighted")
        """How parallel answers are voted: "weighted" by the scores (the default), or "majority" where the saved
        head records that a plain vote was measured better on its model (`bench.vote_rules`); scores still shown."""
        if self.vote not in ("weighted", "majority"):
            raise ValueError(f"verifier head.json: vote must be 'weighted' or 'majority', not {self.vote!r}")

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

    @property
    def combiner(self) -> dict | None:
        return self.config.get("combiner")

    def combines(self, temperature: float | None) -> bool:
        """Whether the combiner applies to answers sampled at `temperature`: its log-prob inputs shift with it, so
        only near the temperature its training answers were sampled at (±0.1)."""
        c = self.combiner
        if not c:
            return False
        trained = c.get("temperature")
        return trained is None or (temperature is not None and abs(temperature - trained) <= 0.1)

    def combine(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """P(correct) of each candidate from its `combined_features` row, by the saved logistic regression."""
        c = self.combiner
        x = (torch.tensor(rows, dtype=torch.float64) - torch.tensor(c["mean"], dtype=torch.float64)) / torch.tensor(
            c["std"], dtype=torch.float64)
        z = x @ torch.tensor(c["coef"], dtype=torch.float64) + c["intercept"]
        return torch.sigmoid(z).tolist()
