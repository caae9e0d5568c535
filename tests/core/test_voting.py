import pytest

from core.voting import extract_answer, is_correct, last_boxed, same_answer, vote


def test_extract_prefers_last_boxed_with_nested_braces():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_answer("so 12 apples, total 1,234.") == "1234"
    assert extract_answer("no digits") is None


def test_equivalent_answers_share_a_bucket():
    assert same_answer("0.5", "\\frac{1}{2}") and same_answer("72", "72.0") and not same_answer("3", "4")
    assert is_correct("The answer is \\boxed{391}.", "391") and not is_correct("It is 390", "391")


def test_weighted_vote_beats_majority_when_scores_disagree():
    answers = ["5", "5", "7"]
    scores = [0.1, 0.2, 0.9]
    assert vote(answers, scores, "majority").winner == "5"
    weighted = vote(answers, scores, "weighted")
    assert weighted.winner == "7" and weighted.winner_index == 2
    assert weighted.table[0] == ("7", 0.9, 1) and weighted.table[1] == ("5", 0.3, 2)


def test_two_way_disagreement_higher_score_wins():
    assert vote(["1", "2"], [0.4, 0.6]).winner == "2"
    assert vote(["1", "2"], [0.4, 0.6], "best").winner_index == 1


def test_unparsable_answers_get_no_vote():
    v = vote([None, None], [0.9, 0.8])
    assert v.winner is None and v.table == ()
    assert vote([None, "3"], [0.9, 0.1]).winner == "3"


def test_tie_goes_to_the_first_seen_answer():
    v = vote(["a1", "b2"], [0.5, 0.5], "majority")
    assert v.winner == "a1"


def test_bad_method_rejected():
    with pytest.raises(ValueError):
        vote(["1"], [1.0], "median")


def test_voting_at_k_from_saved_candidates(tmp_path):
    import json

    from bench.votes import accuracy_at, main, score_auc

    def cand(answer, score, correct):
        return {"answer": answer, "score": score, "correct": correct}

    # Four candidates: the right answer "4" is the minority but carries the higher verifier scores.
    q = {"candidates": [cand("5", 0.1, False), cand("4", 0.9, True), cand("5", 0.2, False), cand("4", 0.3, True)]}
    at4 = accuracy_at([q], 4)
    # majority ties 2-2 and breaks on summed weight (1.2 for "4" vs 0.3 for "5"): "4" wins every method
    assert at4 == {"majority@4": 1.0, "weighted@4": 1.0, "best@4": 1.0, "pass@4": 1.0}
    at2 = accuracy_at([q], 2)  # groups (5, 4) and (5, 4): majority ties at one vote each, weight decides
    assert at2 == {"majority@2": 1.0, "weighted@2": 1.0, "best@2": 1.0, "pass@2": 1.0}
    at1 = accuracy_at([q], 1)  # single samples: half are right
    assert at1 == {"majority@1": 0.5, "weighted@1": 0.5, "best@1": 0.5, "pass@1": 0.5}

    q2 = {"candidates": [cand("7", 0.1, True), cand("8", 0.6, False), cand("8", 0.1, False), cand("7", 0.2, True),
                         cand("7", 0.1, True), cand(None, None, False), cand("9", 0.9, False), cand("8", 0.1, False)]}
    at8 = accuracy_at([q2], 8)
    # majority: 7 and 8 have 3 votes each; summed weight 0.4 vs 0.8 -> 8 (wrong). weighted: 8 (0.8) vs 9 (0.9) -> 9.
    assert at8 == {"majority@8": 0.0, "weighted@8": 0.0, "best@8": 0.0, "pass@8": 1.0}

    saved = tmp_path / "eval_demo.json"
    saved.write_text(json.dumps({"data": "demo.jsonl", "questions": [q2, {"index": 1}]}))
    assert main([str(saved)]) == 0
    written = json.loads((tmp_path / "votes_demo.json").read_text())
    assert written["n"] == 1 and written["by_k"]["8"]["pass@8"] == 1.0
    # right answers score 0.1, 0.2, 0.1; wrong ones 0.6, 0.1, 0.9, 0.1 (the unscored one is left out):
    # 0.2 beats both 0.1s, and the four 0.1-vs-0.1 ties count half -> 4 of 12 pairs
    assert written["verifier_auc"] == pytest.approx(4 / 12)
    assert score_auc([q]) == 1.0 and score_auc([{"candidates": [cand("1", None, True)]}]) is None
