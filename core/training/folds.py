"""Question-grouped folds and the pairwise AUC the heads are judged by (shared by the verifier, its combiner and the
benefit switcher)."""
from __future__ import annotations

import random

import torch


def pairwise_auc(s: torch.Tensor, y: torch.Tensor) -> float | None:
    """P(a right answer's score beats a wrong one's), ties half; None without both kinds."""
    pos, neg = s[y == 1], s[y == 0]
    if len(pos) == 0 or len(neg) == 0:
        return None
    return ((pos[:, None] > neg[None, :]).float().mean() + 0.5 * (pos[:, None] == neg[None, :]).float().mean()).item()


def question_folds(groups: torch.Tensor, folds: int, seed: int):
    """(train, held-out) index lists of k folds by question (a question's answers stay on one side); folds with
    nothing on either side are left out."""
    ids = sorted(set(groups.tolist()))
    random.Random(seed).shuffle(ids)
    for k in range(folds):
        held = set(ids[k::folds])
        va = [i for i, g in enumerate(groups.tolist()) if g in held]
        tr = [i for i, g in enumerate(groups.tolist()) if g not in held]
        if va and tr:
            yield tr, va
