"""bench.vote_bound: the vectorised vote is the app's vote, and a better simulated verifier never votes worse."""
from __future__ import annotations

import json
import random

import pytest
import torch

from bench import vote_bound
from core.reasoning.voting import vote
from tests.core.test_vote_rules import _ranked_cache


def _rows(questions: int = 40, seed: int = 0) -> list[dict]:
    """Random answers among three values (and some without one); "2" is right. Small counts make ties common."""
    rng = random.Random(seed)
    rows = []
    for q in range(questions):
        for _ in range(rng.randint(1, 8)):
            answer = rng.choice(["1", "2", "3", "2.0", None])
            rows.append({"question_index": q, "final_answer": answer, "correct": answer in ("2", "2.0")})
    return rows


@pytest.mark.parametrize("equal", [True, False])
def test_the_vectorised_vote_picks_what_the_app_picks(equal):
    rows = _rows()
    groups = vote_bound.Groups(rows)
    gen = torch.Generator().manual_seed(1)
    weights = torch.ones(3, len(rows), dtype=torch.float64) if equal else \
        torch.rand(3, len(rows), generator=gen, dtype=torch.float64).round(decimals=1) + 0.1  # ties between sums too
    got = groups.accuracy(weights)
    for s in range(3):
        by_q: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            by_q.setdefault(r["question_index"], []).append(i)
        right = 0
        for members in by_q.values():
            v = vote([rows[i]["final_answer"] for i in members], [float(weights[s, i]) for i in members],
                     "majority" if equal else "weighted")
            right += v.winner_index is not None and rows[members[v.winner_index]]["correct"]
        assert got[s].item() == pytest.approx(right / len(by_q))


def test_a_better_verifier_never_votes_worse_and_the_head_learns(tmp_path):
    path = _ranked_cache(tmp_path, signal=True)
    out = tmp_path / "bound"
    vote_bound.main([str(path), "--out", str(out), "--seeds", "16", "--weight-decay", "0.1", "--seed", "1"])
    result = json.loads(out.with_suffix(".json").read_text())
    sim = result["simulated"]
    assert all(r["majority"] == pytest.approx(57.14, abs=0.01) for r in sim)  # 20 of 35, as bench.vote_rules counts
    assert all(b["weighted_best"] >= a["weighted_best"] - 0.5 for a, b in zip(sim, sim[1:], strict=False))
    assert sim[-1]["weighted_best"] >= 95.0  # AUC 0.98: nearly every question's right answer wins
    assert result["auc_needed"] is not None and result["auc_needed"] <= 0.8
    assert result["learning_curve"][-1]["auc"] > 0.9  # the hidden state says which answers are right
    assert "AUC needed for +3.0" in out.with_suffix(".md").read_text()
