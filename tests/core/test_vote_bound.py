"""bench.vote_bound: the vectorised vote is the app's vote question by question, a better simulated verifier never
votes worse, the real head's scores are voted out of fold, and the learning curve's line."""
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


def _app_votes(rows: list[dict], weights: list[float], method: str) -> list[float]:
    by_q: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_q.setdefault(r["question_index"], []).append(i)
    out = []
    for members in by_q.values():
        v = vote([rows[i]["final_answer"] for i in members], [weights[i] for i in members], method)
        out.append(float(v.winner_index is not None and rows[members[v.winner_index]]["correct"]))
    return out


@pytest.mark.parametrize("kind", ["equal", "random", "rounding", "negative"])
def test_the_vectorised_vote_picks_what_the_app_picks_question_by_question(kind):
    rows = _rows()
    if kind == "rounding":  # a wrong answer's 0.1 + 0.2 against a right one's 0.3 ties: the earlier group wins
        rows = [{"question_index": q, "final_answer": a, "correct": a == "2"} for q, order in enumerate([
            ("1", "1", "2"), ("2", "1", "1")]) for a in order]
        weights = [0.1, 0.2, 0.3, 0.3, 0.1, 0.2]
    elif kind == "equal":
        weights = [1.0] * len(rows)
    else:  # weights of one decimal: equal sums between groups happen; "negative": all below zero (`llr` scores are)
        gen = torch.Generator().manual_seed(1)
        weights = ((torch.rand(len(rows), generator=gen) * 10).round() / 10 + 0.1).tolist()
        if kind == "negative":
            weights = [w - 2.0 for w in weights]
    groups = vote_bound.Groups(rows)
    got = groups.right_by_question(groups.sums(torch.tensor([weights], dtype=torch.float64)))[0].tolist()
    assert got == _app_votes(rows, weights, "majority" if kind == "equal" else "weighted")
    if kind == "rounding":
        assert got == [0.0, 1.0]


@pytest.mark.parametrize("signal", [True, False])
def test_simulated_and_real_votes_and_the_learning_curve(tmp_path, signal):
    path = _ranked_cache(tmp_path, signal=signal)
    out = tmp_path / "bound"
    vote_bound.main([str(path), "--out", str(out), "--seeds", "16", "--curve-seeds", "2", "--weight-decay", "0.1",
                     "--seed", "1"])
    r = json.loads(out.with_suffix(".json").read_text())
    assert r["majority"] == pytest.approx(57.14, abs=0.01)  # 20 of 35, as bench.vote_rules counts
    sim = r["simulated"]
    for family in ("exp", "llr"):
        assert all(b[family] >= a[family] - 0.5 for a, b in zip(sim, sim[1:], strict=False))  # better never worse
        assert sim[-1][family] >= 95.0  # AUC 0.98: nearly every question's right answer wins
    assert r["auc_needed"]["exp"] is not None and r["auc_needed"]["llr"] is not None
    real, curve = r["real_scores"]["head"], r["learning_curve"]
    assert set(r["real_scores"]) == {"head", "logprob_mean", "logprob_lowest", "combiner-no-share", "combiner"}
    assert real["majority"] == pytest.approx(57.14, abs=0.01)
    assert [c["questions"] for c in curve] == [25, 28]  # folds of 28 training questions: one subset, then all
    for c in curve:
        for f in ("exp", "llr"):
            assert c[f"gain_{f}_low"] <= c[f"gain_{f}"] <= c[f"gain_{f}_high"]
            assert -real["majority"] <= c[f"gain_{f}"] <= 100.0 - real["majority"]
    assert set(r["gain_line"]) == {"exp", "llr"} and r["pool"] == vote_bound.GSM8K_TRAIN
    if signal:  # the hidden state says which answers are right, out of fold too
        assert real["auc"] > 0.9 and curve[-1]["auc"] > 0.9
        assert curve[-1]["gain_llr"] >= 30.0  # most questions majority loses are won back
        assert r["real_scores"]["combiner-no-share"]["auc"] > 0.9  # the head's logit carries into the combiners
        assert real["llr"]["out_of_fold"] >= 90.0 and real["exp"]["out_of_fold"] >= 90.0
    else:  # noise: no ranking inside a question, and nothing to vote on beyond the count
        assert real["auc"] < 0.7 and all(c["auc"] < 0.7 for c in curve)
        assert real["exp"]["out_of_fold"] <= real["majority"] + 12.0
    assert "Smallest AUC (0.01 steps)" in out.with_suffix(".md").read_text()
    assert "vote gain, line through every point" in out.with_suffix(".md").read_text()


def test_the_line_through_the_learning_curve():
    bent = [{"questions": q, "auc": a} for q, a in zip((25, 50, 100, 200, 400), (0.50, 0.56, 0.60, 0.61, 0.62),
                                                       strict=True)]
    line = vote_bound.extrapolate(bent, 0.63)
    assert line["last_three"]["per_doubling"] == pytest.approx(0.01)  # 0.60, 0.61, 0.62: the flattened end
    assert line["last_three"]["questions_needed"] == pytest.approx(800)
    assert line["all"]["per_doubling"] == pytest.approx(0.029)  # least squares through all five
    assert line["all"]["questions_needed"] < line["last_three"]["questions_needed"]
    flat = [{"questions": q, "auc": 0.6} for q in (25, 50, 100)]
    assert vote_bound.extrapolate(flat, 0.75)["all"]["questions_needed"] is None
    assert not vote_bound.extrapolate(flat, 0.75)["all"]["beyond"]
    slow = [{"questions": 25, "auc": 0.6}, {"questions": 50, "auc": 0.60001}]  # 1e-5 a doubling: 2^39,000 questions
    assert vote_bound.extrapolate(slow, 0.99)["all"]["questions_needed"] is None  # no overflow
    assert vote_bound.extrapolate(slow, 0.99)["all"]["beyond"]
    assert vote_bound.extrapolate(bent, None) is None


def test_the_line_through_the_vote_gains():
    """The vote's out-of-fold gain over majority, a line in log2(questions): where it reaches the margin, and what it
    gives at every question the data set holds; a gain that does not rise reaches no margin."""
    curve = [{"questions": q, "gain_exp": g, "gain_llr": 0.5} for q, g in zip((25, 50, 100, 200), (0.0, 0.5, 1.0, 1.5),
                                                                          strict=True)]
    line = vote_bound.extrapolate_gain(curve, 3.0, 6400)
    assert line["exp"]["all"]["per_doubling"] == pytest.approx(0.5)
    assert line["exp"]["all"]["questions_needed"] == pytest.approx(1600)  # 200 · 2^3: three more doublings of +0.5
    assert line["exp"]["all"]["gain_at_pool"] == pytest.approx(4.0)  # 6400 = 200 · 2^5: 1.5 + 5 · 0.5
    assert line["llr"]["all"]["questions_needed"] is None and line["llr"]["all"]["gain_at_pool"] == pytest.approx(0.5)
    assert not line["llr"]["all"]["beyond"]
    bent = [{"questions": q, "gain_exp": g, "gain_llr": g} for q, g in zip((25, 50, 100, 200), (-0.5, 0.0, 1.0, 2.0),
                                                                       strict=True)]
    hopeful = vote_bound.extrapolate_gain(bent, 3.0, 400)["exp"]
    assert hopeful["last_three"]["per_doubling"] == pytest.approx(1.0)  # the bend's steeper end
    assert hopeful["last_three"]["questions_needed"] == pytest.approx(400)
    assert hopeful["all"]["per_doubling"] < hopeful["last_three"]["per_doubling"]
    creeping = [{"questions": 25, "gain_exp": 0.0, "gain_llr": 0.0}, {"questions": 50, "gain_exp": 1e-5, "gain_llr": 0.0}]
    assert vote_bound.extrapolate_gain(creeping, 3.0, 100)["exp"]["all"]["beyond"]
    assert vote_bound.extrapolate_gain([{"questions": 25, "auc": 0.6}], 3.0, 100) is None


def test_the_llr_family_scores_each_group_by_count_and_summed_score():
    rows = [{"question_index": 0, "final_answer": a, "correct": a == "2"} for a in ("1", "1", "2")]
    groups = vote_bound.Groups(rows)
    scores = groups.family_scores(torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64))
    got = scores[("llr", 2.0, 1.0, -0.5)][0].tolist()
    assert got == pytest.approx([2 * torch.log(torch.tensor(2.0)).item() - 0.5 - 1.0, 0 + 2.0 - 0.5])
    assert scores[("exp", 0.0)][0].tolist() == [2.0, 1.0]  # τ = 0: the count
