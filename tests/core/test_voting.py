import math
import threading
import time

import pytest

from core.reasoning.voting import extract_answer, is_correct, last_boxed, same_answer, score_candidates, vote

# Real answers from bench/results/eval_math500_reason_greedy.json that the old scorer (last \\boxed{} or else the
# last number, handed to math-verify in the wrong order) counted as right.
MATH500_Q34 = (  # gold "2": the final answer is an expression; only the trailing code's last number is 2
    "Final answer: 4\\cos^2 A + (\\tan A)^2\n\nLet's confirm this by using Python and sympy.\n\n```python\n"
    "import sympy as sp\n\n# Define the variable\ntan_A = sp.symbols('tan_A')\n\n# Given information\n"
    "sin_A = 2 * sp.cos(tan_A)\n\n# Pythagorean identity\nh_squared = sin_A**2 + (tan_A)**2\n\n"
    "# Simplify the expression\nh_squared_simplified = sp.simplify(h_squared)\n\n"
    "# Substitute the simplified expression for h^2\n"
    "h_squared_simplified = h_squared_simplified.subs(sin_A, 2 *")
MATH500_Q61 = "Final answer: 1/3."  # gold "3"


def test_extract_prefers_last_boxed_with_nested_braces():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_answer("so 12 apples, total 1,234.") == "1234"
    assert extract_answer("no digits") is None
    assert extract_answer(MATH500_Q61) == "1/3"  # not the last number, 3


def test_equivalent_answers_share_a_bucket():
    assert same_answer("0.5", "\\frac{1}{2}") and same_answer("72", "72.0") and not same_answer("3", "4")
    assert is_correct("The answer is \\boxed{391}.", "391") and not is_correct("It is 390", "391")


def test_saved_false_positives_score_wrong():
    assert not is_correct(MATH500_Q34, "2")
    assert not is_correct(MATH500_Q61, "3")
    assert not is_correct("Final answer: 1/3.", "3") and is_correct("Final answer: 1/3.", "\\frac{1}{3}")


def test_true_positives_score_right():
    assert is_correct("So the result is \\boxed{\\frac{1}{2}}.", "0.5")
    assert is_correct("The answer is 0.5", "\\frac{1}{2}")
    assert is_correct("The answer is 18.", "18")  # GSM8K
    assert is_correct("She pays $1,234 in total.", "1234")
    assert is_correct("The answer is \\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)")
    assert not is_correct("The answer is \\boxed{(3, 0)}", "\\left( 3, \\frac{\\pi}{2} \\right)")


def test_gold_is_read_as_gold():
    """math-verify is not symmetric: `verify(gold, answer)` compares a relation with a set only when the answer
    is the set."""
    assert is_correct("\\boxed{(1, 2)}", "1 < x < 2") and not is_correct("\\boxed{1 < x < 2}", "(1, 2)")
    assert is_correct("\\boxed{2}", "x = 2")


def test_last_number_only_for_integer_golds_when_math_verify_finds_nothing():
    from core.reasoning.voting import _parse

    text = "So each ticket costs $$18"  # "$$" opens display math that never closes: math-verify extracts nothing
    assert _parse(text) == [] and is_correct(text, "18") and not is_correct(text, "17")
    assert not is_correct(text, "18.0") and not is_correct("no answer here", "18")


def test_scoring_works_off_the_main_thread():
    """The app votes on a worker thread, where math-verify's SIGALRM timeout cannot run."""
    out = {}
    worker = threading.Thread(target=lambda: out.update(same=same_answer("0.5", "\\frac{1}{2}"),
                                                        right=is_correct("\\boxed{\\frac{1}{2}}", "0.5")))
    worker.start()
    worker.join()
    assert out == {"same": True, "right": True}


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
    assert v.winner == "a1" and v.tie and v.tied == ("a1", "b2")


def test_majority_is_plain_and_ties_are_reported():
    """Majority counts votes only; a tie goes to the earliest candidate whatever the verifier says."""
    four = vote(["1200", "900", "1000", "1100"], [0.1, 0.4, 0.9, 0.3], "majority")
    assert four.winner == "1200" and four.winner_index == 0 and four.tie
    assert four.tied == ("1200", "900", "1000", "1100")
    weighted = vote(["1200", "900", "1000", "1100"], [0.1, 0.4, 0.9, 0.3], "weighted")
    assert weighted.winner == "1000" and weighted.winner_index == 2 and not weighted.tie and weighted.tied == ()
    # 2-2 tie on votes: the verifier's summed weight (0.3 vs 1.2) must not break it for majority
    split = vote(["5", "4", "5", "4"], [0.1, 0.9, 0.2, 0.3], "majority")
    assert split.winner == "5" and split.winner_index == 0 and split.tie and split.tied == ("5", "4")
    assert vote(["5", "4", "5", "4"], [0.1, 0.9, 0.2, 0.3], "weighted").winner == "4"
    clear = vote(["5", "4", "5"], [0.1, 0.9, 0.2], "majority")
    assert clear.winner == "5" and not clear.tie and clear.table[0] == ("5", 0.3, 2)


def test_weighted_and_best_ties_go_to_the_earliest_candidate():
    v = vote(["3", "4", "4"], [0.6, 0.3, 0.3], "weighted")
    assert v.winner == "3" and v.tie and v.tied == ("3", "4")
    best = vote(["3", "4", "3"], [0.2, 0.7, 0.7], "best")
    assert best.winner == "4" and best.winner_index == 1 and best.tie and best.tied == ("4", "3")
    top = vote(["3", "4", "3"], [0.2, 0.5, 0.7], "best")
    assert top.winner == "3" and top.winner_index == 2 and not top.tie


def test_bad_method_rejected():
    with pytest.raises(ValueError):
        vote(["1"], [1.0], "median")


def test_voting_at_k_from_saved_candidates(tmp_path):
    import json

    from bench.votes import accuracy_at, main, score_auc, within_question_auc

    def cand(answer, score, correct):
        return {"answer": answer, "score": score, "correct": correct}

    # Four candidates: the right answer "4" is the minority but carries the higher verifier scores.
    q = {"candidates": [cand("5", 0.1, False), cand("4", 0.9, True), cand("5", 0.2, False), cand("4", 0.3, True)]}
    at4 = accuracy_at([q], 4)
    # majority ties 2-2 and goes to the earliest candidate ("5", wrong); weighted: 1.2 for "4" vs 0.3 for "5"
    assert at4 == {"majority@4": 0.0, "weighted@4": 1.0, "best@4": 1.0, "pass@4": 1.0}
    at2 = accuracy_at([q], 2)  # groups (5, 4) and (5, 4): majority ties at one vote each, the first ("5") wins
    assert at2 == {"majority@2": 0.0, "weighted@2": 1.0, "best@2": 1.0, "pass@2": 1.0}
    at1 = accuracy_at([q], 1)  # single samples: half are right
    assert at1 == {"majority@1": 0.5, "weighted@1": 0.5, "best@1": 0.5, "pass@1": 0.5}

    q2 = {"candidates": [cand("7", 0.1, True), cand("8", 0.6, False), cand("8", 0.1, False), cand("7", 0.2, True),
                         cand("7", 0.1, True), cand(None, None, False), cand("9", 0.9, False), cand("8", 0.1, False)]}
    at8 = accuracy_at([q2], 8)
    # majority: 7 and 8 have 3 votes each, 7 comes first -> 7 (right). weighted: 8 (0.8) vs 9 (0.9) -> 9.
    assert at8 == {"majority@8": 1.0, "weighted@8": 0.0, "best@8": 0.0, "pass@8": 1.0}

    saved = tmp_path / "eval_demo.json"
    saved.write_text(json.dumps({"data": "demo.jsonl", "questions": [q2, {"index": 1}]}))
    assert main([str(saved)]) == 0
    written = json.loads((tmp_path / "votes_demo.json").read_text())
    assert written["n"] == 1 and written["by_k"]["8"]["pass@8"] == 1.0
    # right answers score 0.1, 0.2, 0.1; wrong ones 0.6, 0.1, 0.9, 0.1 (the unscored one is left out):
    # 0.2 beats both 0.1s, and the four 0.1-vs-0.1 ties count half -> 4 of 12 pairs
    assert written["verifier_auc"] == pytest.approx(4 / 12)
    assert score_auc([q]) == 1.0 and score_auc([{"candidates": [cand("1", None, True)]}]) is None
    # within one question: q ranks its answers perfectly (1.0), q2 as above (1/3); a question whose candidates
    # are all wrong has no pair and is left out of the mean. Pooled, an easy question scored high looks good:
    easy = {"candidates": [cand("1", 0.95, True), cand("1", 0.99, True)]}
    hard = {"candidates": [cand("2", 0.0, False), cand("3", 0.05, False)]}
    assert within_question_auc([q, q2, hard]) == (pytest.approx((1.0 + 4 / 12) / 2), 2)
    assert within_question_auc([easy, hard]) == (None, 0) and score_auc([easy, hard]) == 1.0
    assert written["verifier_auc_within_question"] == pytest.approx(4 / 12)


def test_candidates_are_scored_from_their_text():
    """A vote's correctness is that of the candidate it picks, judged on that candidate's full text."""
    cands = [{"answer": "3", "score": 0.2, "text": MATH500_Q61}, {"answer": "4", "score": 0.9, "text": "\\boxed{4}"},
             {"answer": "3", "score": 0.1, "text": "so \\boxed{3}"}]
    out = score_candidates(cands, "3")
    assert [c["correct"] for c in out["candidates"]] == [False, False, True] and out["pass_at_n"]
    assert out["candidates"][0]["text"] == MATH500_Q61
    # majority picks candidate 0 ("3" bucket, text says 1/3): wrong although its bucket holds a right answer
    assert out["correct_majority"] is False and out["correct_weighted"] is False and out["correct_best"] is False
    assert out["tie_majority"] is False and out["tie_weighted"] is False


def test_rescore_recomputes_saved_results_from_their_text(tmp_path):
    import json

    from bench.rescore import main

    data = tmp_path / "math.jsonl"
    data.write_text("\n".join(json.dumps({"problem": f"p{i}", "answer": g}) for i, g in enumerate(["3", "2"])))
    greedy = {"n": 2, "accuracy": 1.0, "data": str(data), "parallel": 1, "vote": "weighted", "questions": [
        {"index": 0, "correct": True, "text": MATH500_Q61}, {"index": 1, "correct": True, "text": "\\boxed{2}"}]}
    cand = lambda text, answer, score: {"answer": answer, "score": score, "text": text}  # noqa: E731
    par = {"n": 1, "accuracy": 1.0, "accuracy_weighted": 1.0, "accuracy_majority": 1.0, "accuracy_best": 1.0,
           "pass_at_n": 1.0, "data": str(data), "parallel": 2, "vote": "weighted", "questions": [
               {"index": 0, "correct": True, "text": MATH500_Q61,
                "candidates": [cand(MATH500_Q61, "3", 0.9), cand("\\boxed{3}", "3", 0.1)]}]}
    no_text = {**par, "questions": [{**par["questions"][0], "candidates": [  # scored by the old scorer: both "3"
        {**{k: v for k, v in c.items() if k != "text"}, "correct": True} for c in par["questions"][0]["candidates"]]}]}
    bare = {**no_text, "questions": [{k: v for k, v in no_text["questions"][0].items() if k != "text"}]}
    files = {name: tmp_path / f"eval_{name}.json" for name in ("greedy", "par", "notext", "bare", "summary")}
    for name, content in [("greedy", greedy), ("par", par), ("notext", no_text), ("bare", bare),
                          ("summary", {"n": 9, "accuracy": 0.5})]:
        files[name].write_text(json.dumps(content))
    (tmp_path / "votes_notext.json").write_text(json.dumps({"by_k": {}}))
    assert main([str(p) for p in files.values()]) == 0
    out = {name: json.loads(p.read_text()) for name, p in files.items()}
    assert out["greedy"]["accuracy"] == 0.5 and out["greedy"]["rescore"]["previous"] == {"accuracy": 1.0}
    assert [q["correct"] for q in out["greedy"]["questions"]] == [False, True]
    # the "3" bucket's first candidate (1/3) is picked by every method: wrong; pass@2 holds through candidate 1
    assert out["par"]["accuracy"] == out["par"]["accuracy_majority"] == 0.0 and out["par"]["pass_at_n"] == 1.0
    assert json.loads((tmp_path / "votes_par.json").read_text())["by_k"]["2"]["pass@2"] == 1.0
    assert out["notext"]["accuracy"] == 0.0 and out["notext"]["accuracy_majority"] == 1.0
    assert set(out["notext"]["rescore"]["not_rescorable"]) == {"accuracy_majority", "accuracy_best", "pass_at_n"}
    assert json.loads((tmp_path / "votes_notext.json").read_text())["rescore"]["rescorable"] is False
    assert out["bare"]["rescore"]["rescored"] == [] and out["bare"]["accuracy"] == 1.0  # replayed, old flags
    assert out["summary"]["accuracy"] == 0.5 and out["summary"]["rescore"]["rescored"] == []
    again = files["greedy"].read_text()
    main([str(files["greedy"])])  # idempotent: the figures from before the first re-scoring are kept
    assert files["greedy"].read_text() == again


def test_no_timeout_notice_reaches_the_user(caplog):
    """Off the main thread math-verify runs without a time limit by design; its one-time warning is dropped."""
    import threading

    import math_verify.grader
    import math_verify.parser

    from core.reasoning.voting import same_answer

    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = False
    with caplog.at_level("WARNING"):
        worker = threading.Thread(target=lambda: same_answer("\\frac{1}{2}", "0.5"))
        worker.start()
        worker.join()
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]


def test_token_confidence_is_the_mean_and_the_lowest_window():
    from core.reasoning.confidence import token_confidence

    assert token_confidence([]) is None and token_confidence([float("nan"), None]) is None
    assert token_confidence([-1.0, -3.0]) == (-2.0, -2.0)  # shorter than a window: its mean
    lp = [-0.1] * 10 + [-2.0, -2.0, -2.0, -2.0] + [-0.1] * 10 + [float("nan")]  # a fed token left out
    mean, lowest = token_confidence(lp, window=4)
    assert mean == pytest.approx((20 * -0.1 + 4 * -2.0) / 24) and lowest == pytest.approx(-2.0)
    assert token_confidence(lp, window=8)[1] == pytest.approx((4 * -2.0 + 4 * -0.1) / 8)


def test_confidence_votes_from_saved_log_prob_statistics(tmp_path):
    import json
    import math

    from bench.votes import accuracy_at, main

    def cand(answer, correct, mean, lowest):
        return {"answer": answer, "score": None, "correct": correct, "logprob_mean": mean, "logprob_lowest": lowest}

    # "5" has the votes (3 against 2); "4" is right and its traces are far more confident
    q = {"candidates": [cand("5", False, -1.0, -3.0), cand("4", True, -0.1, -0.5), cand("5", False, -1.2, -2.5),
                        cand("4", True, -0.2, -0.4), cand("5", False, -0.15, -2.0)]}
    at5 = accuracy_at([q], 5)
    # majority: 5. confidence: e^-0.1 + e^-0.2 = 1.72 for "4" against e^-1 + e^-1.2 + e^-0.15 = 1.53 for "5".
    # lowest: e^-0.5 + e^-0.4 = 1.28 against e^-3 + e^-2.5 + e^-2 = 0.27. DeepConf keeps the top 3 by lowest
    # window (-0.4, -0.5, -2.0): "4" 1.28 against 0.14.
    assert math.exp(-0.1) + math.exp(-0.2) > math.exp(-1) + math.exp(-1.2) + math.exp(-0.15)
    assert at5 == {"majority@5": 0.0, "weighted@5": 0.0, "best@5": 0.0, "confidence@5": 1.0, "lowest@5": 1.0,
                   "deepconf@5": 1.0, "pass@5": 1.0}
    # a file without the statistics gets the three old methods only
    assert set(accuracy_at([{"candidates": [{"answer": "1", "score": 0.5, "correct": True}]}], 1)) == {
        "majority@1", "weighted@1", "best@1", "pass@1"}
    saved = tmp_path / "eval_conf.json"
    saved.write_text(json.dumps({"questions": [q]}))
    assert main([str(saved)]) == 0
    written = json.loads((tmp_path / "votes_conf.json").read_text())
    # right candidates' means -0.1, -0.2 beat wrong -1.0, -1.2 but not -0.15 (-0.2 < -0.15): 5 of 6 pairs
    assert written["confidence_auc_within_question"] == {"logprob_mean": pytest.approx(5 / 6), "logprob_lowest": 1.0}
    assert "DeepConf (top half)" in (tmp_path / "votes_conf.md").read_text()


def test_head_alone_votes_beside_the_combined_score():
    from bench.votes import accuracy_at

    def cand(answer, correct, combined, head):
        return {"answer": answer, "score": combined, "head_score": head, "correct": correct}

    # the combined score (which counts the vote share) follows the majority "5"; the head alone prefers "4"
    q = {"candidates": [cand("5", False, 0.6, 0.1), cand("4", True, 0.2, 0.9), cand("5", False, 0.6, 0.2)]}
    at3 = accuracy_at([q], 3)
    assert at3["weighted@3"] == 0.0 and at3["head@3"] == 1.0 and at3["majority@3"] == 0.0
    assert "head@3" not in accuracy_at([{"candidates": [cand("1", True, 0.5, None)] * 3}], 3)


def test_a_unicode_minus_keeps_its_sign():
    """Models write U+2212 for minus; math-verify drops it from plain text ("−5" read as 5)."""
    assert extract_answer("The answer is −5.") == "-5" and extract_answer("Answer: −3") == "-3"
    assert is_correct("The answer is −5", "-5") and not is_correct("The answer is −5", "5")
    assert not same_answer("5", extract_answer("So x = −5."))
    assert vote([extract_answer("x = −5"), "5", "-5"], [1.0, 1.0, 1.0], "majority").winner == "-5"


def test_latex_digit_group_separators_are_one_number():
    """math-verify reads 10\\,000 as 10·0 and 1\\,234 as 1 + 234: a thin space between digit groups is removed."""
    assert extract_answer("The answer is \\boxed{10\\,000}.") == "10000"
    assert same_answer("10000", "10\\,000") and not same_answer("0", "10\\,000")
    assert is_correct("\\boxed{1\\,234\\,567}", "1234567") and is_correct("\\boxed{10{,}000}", "10\\,000")
    assert is_correct("so $12\\,500$ in all", "12500") and not is_correct("\\boxed{10\\,000}", "0")
    assert vote(["10\\,000", "0", "10000"], [0.4, 0.5, 0.4], "weighted").winner == "10\\,000"


def _on_a_worker_thread(work, timeout: float) -> dict:
    out: dict = {}
    worker = threading.Thread(target=lambda: out.update(work()), daemon=True)
    worker.start()
    worker.join(timeout=timeout)
    assert not worker.is_alive(), "the vote hung on a hostile answer"
    return out


def test_a_power_tower_is_never_computed():
    """Comparing 9^{9^{9^9}} makes sympy compute 9^387420489: one C call holding the GIL for hours, which freezes
    every thread of the app (only the main thread's SIGALRM stops it). Such answers are never compared."""
    tower = "9^{9^{9^{9}}}"
    boxed = f"so \\boxed{{{tower}}}"
    out = _on_a_worker_thread(lambda: {"same": same_answer(tower, "2"), "right": is_correct(boxed, "2"),
                                       "fact": same_answer("(10^{8})!", "1"), "answer": extract_answer(boxed)},
                              timeout=60)
    assert out == {"same": False, "right": False, "fact": False, "answer": tower}
    assert same_answer("2^{2023}", "2^{2023}") and same_answer("10^{6}", "1000000")  # large, not hostile


def test_a_comparison_that_takes_minutes_is_given_up_on_a_worker_thread(monkeypatch):
    """math-verify's own time limit is SIGALRM, main thread only; on a worker thread (the app and the server vote
    there) expanding (x+y+z+1)^{60} went on for minutes. It is given up after voting.SECONDS there too, and the
    thread works normally afterwards."""
    from core.reasoning import voting

    monkeypatch.setattr(voting, "SECONDS", 1)
    start = time.monotonic()
    out = _on_a_worker_thread(lambda: {"slow": same_answer("(x+y+z+1)^{60}", "x^{2}+1"),
                                       "after": same_answer("0.5", "\\frac{1}{2}")}, timeout=60)
    assert out == {"slow": False, "after": True} and time.monotonic() - start < 30


def test_weights_that_are_not_numbers_count_as_zero():
    nan = float("nan")
    for method in ("weighted", "best"):
        assert vote(["3"], [nan], method).winner == "3"
        v = vote(["3", "4"], [nan, 0.5], method)
        assert v.winner == "4" and v.winner_index == 1 and not v.tie
    assert vote(["3", "3", "4"], [float("inf"), float("-inf"), 0.1]).winner == "4"
    assert all(math.isfinite(w) for _, w, _ in vote(["3", "4"], [nan, 0.5]).table)


def test_the_table_leads_with_the_winner_when_sums_differ_by_rounding():
    """0.1 + 0.2 is 0.30000000000000004: a tie with 0.3, won by the earliest answer, which the table lists first."""
    v = vote(["3", "4", "4"], [0.3, 0.1, 0.2], "weighted")
    assert v.winner == "3" and v.tie and v.tied == ("3", "4")
    assert [row[0] for row in v.table] == ["3", "4"]
