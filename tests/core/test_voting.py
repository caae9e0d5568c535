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
