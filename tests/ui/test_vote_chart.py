"""The vote chart on a real widget: one bar per distinct answer, split by candidate and coloured by verifier
score (checked in the grabbed pixels), the winner marked, ties marked, and "Use this" emitting pick."""
from PySide6.QtGui import QColor

from ui.vote_chart import VoteChart, VotePanel, score_colour


def cand(index, answer, score):
    return {"index": index, "answer": answer, "score": score, "text": f"\\boxed{{{answer}}}", "thinking": "t"}


WEIGHTED = {"candidates": [cand(0, "42", 0.9), cand(1, "41", 0.95), cand(2, "42", 0.6), cand(3, "7", 0.1)],
            "vote": {"method": "weighted", "table": [["42", 1.5, 2], ["41", 0.95, 1], ["7", 0.1, 1]], "tie": False},
            "chosen": 0}
TIED = {"candidates": [cand(i, a, 0.5) for i, a in enumerate(("1200", "1100", "1000", "900"))],
        "vote": {"method": "majority", "table": [[a, 1.0, 1] for a in ("1200", "1100", "1000", "900")], "tie": True},
        "chosen": 0}


def close(a: QColor, b: QColor, tol: int = 12) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a.getRgb()[:3], b.getRgb()[:3], strict=True))


def test_one_bar_per_distinct_answer_split_by_candidate_winner_marked(qtbot):
    chart = VoteChart(WEIGHTED)
    qtbot.addWidget(chart)
    chart.resize(600, chart.height())
    chart.show()
    bars = chart.layout_bars(600)
    assert [b.answer for b in bars] == ["42", "41", "7"]
    assert [b.winner for b in bars] == [True, False, False] and not any(b.tie for b in bars)
    assert [len(b.segments) for b in bars] == [2, 1, 1]
    assert bars[0].rect.width() > bars[1].rect.width() > bars[2].rect.width()  # 1.5 > 0.95 > 0.1
    (left, i0, _), (right, i2, _) = bars[0].segments
    assert (i0, i2) == (0, 2) and left.width() > right.width()  # 0.9 vs 0.6 of the bar
    image = chart.grab().toImage()
    for b in bars:
        for rect, index, colour in b.segments:
            score = next(c["score"] for c in WEIGHTED["candidates"] if c["index"] == index)
            assert colour == score_colour(score)
            pixel = image.pixelColor(rect.center().toPoint())
            assert close(pixel, colour), (b.answer, index, pixel.name(), colour.name())
    assert close(image.pixelColor(bars[0].segments[0][0].center().toPoint()), score_colour(0.9))
    assert not close(score_colour(0.9), score_colour(0.1))  # green vs red
    assert "42: 1.50 (2 votes) — winner" in chart.accessibleDescription()


def test_a_tie_marks_every_leader_and_no_winner(qtbot):
    chart = VoteChart(TIED)
    qtbot.addWidget(chart)
    bars = chart.layout_bars(500)
    assert len(bars) == 4 and all(b.tie for b in bars) and not any(b.winner for b in bars)
    assert len({round(b.rect.width(), 3) for b in bars}) == 1
    picked = {**TIED, "chosen": 2, "picked_by_user": True}
    bars = VoteChart(picked).layout_bars(500)
    assert [b.winner for b in bars] == [False, False, True, False] and all(b.tie for b in bars)


def test_panel_lists_candidates_with_use_this(qtbot):
    panel = VotePanel(7, WEIGHTED)
    qtbot.addWidget(panel)
    assert sorted(panel.buttons) == [1, 2, 3]  # the chosen one is shown, not offered
    assert panel.buttons[1].accessibleName() == "Use answer 2"
    with qtbot.waitSignal(panel.action) as got:
        panel.buttons[3].click()
    assert got.args == ["pick", ["7", "3"]]
    text = panel.plain_text()
    assert "Vote (weighted)" in text and "#1 42 · verifier 0.90 · ✓ shown" in text and "tie" not in text
    tied = VotePanel(8, TIED).plain_text()
    assert "tie between 4 answers (1 vote each)" in tied and "shown (tie)" in tied and "✓" not in tied
