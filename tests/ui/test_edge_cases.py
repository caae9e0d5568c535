"""The window against a scripted engine: exact budget cut display, verifier scores and the weighted vote,
picking another candidate, a crash mid-stream (partial reply kept, marked incomplete), engine errors shown."""
import pytest

from app.chat_controller import ChatController
from app.engine_service import EngineService
from core.store import ChatStore
from tests.qt_helpers import run_until
from tests.ui.scripted_engine import ScriptedEngine
from ui.main_window import MainWindow


def make_window(qtbot, loop, tmp_path, engine):
    service = EngineService(engine=engine)
    controller = ChatController(service, ChatStore(tmp_path / "chats.db", flush_s=0.01))
    win = MainWindow(service, controller)
    qtbot.addWidget(win)
    loop.run_until_complete(service.start())
    return win


def ask(win, loop, text, mode, budget=8, parallel=1):
    win.composer.apply(mode, budget, parallel)
    win.composer.input.setPlainText(text)
    win.composer.send_button.click()
    assert run_until(loop, lambda: win.service.busy or len(win.controller.messages()) >= 2, 10)
    assert run_until(loop, lambda: not win.service.busy, 30)
    win.render()
    return win.controller.messages()[-1]


@pytest.fixture
def window(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine())
    yield win
    win.service.shutdown()


def test_budget_cut_is_marked_with_the_full_meter(window, loop):
    reply = ask(window, loop, "Why?", "reason", budget=128)
    text = window.view.toPlainText()
    assert "Thinking — 128/128 tokens" in text and "cut at budget" in text
    assert reply.content.startswith("Final answer: 42") and reply.meta["budget_forced"] is True


def test_weighted_vote_scores_and_picking_another(window, loop):
    reply = ask(window, loop, "What is 6*7?", "reason", parallel=4)
    text = window.view.toPlainText()
    assert "Vote (weighted)" in text and "0.95" in text and "0.90" in text
    assert reply.meta["vote"]["table"][0][0] == "42" and reply.meta["chosen"] == 0  # 0.9 + 0.6 beats 0.95
    window.controller.pick_candidate(reply.id, 1)
    picked = window.controller.messages()[-1]
    assert "\\boxed{41}" in picked.content and picked.meta["picked_by_user"] is True
    window.render()
    assert "41" in window.view.toPlainText()


def test_auto_route_probability_in_details(window, loop):
    from ui.chat_view import details_text

    reply = ask(window, loop, "Why?", "auto", budget=128)
    assert "p=0.87" in details_text(reply) and "switcher" in details_text(reply)


def test_crash_mid_stream_keeps_the_partial_reply(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine(crash_after=2, delay_s=0.02))
    reply = ask(win, loop, "Tell me", "base")
    assert reply.status == "incomplete" and reply.content == "The answer "
    assert "crashed mid-answer" in win.status.text()
    assert "incomplete" in win.view.toPlainText()
    win.service.shutdown()


def test_engine_refusal_is_shown_not_raised(window, loop):
    ask(window, loop, "Why?", "reason", budget=128)
    window.on_action("longer", [])
    assert run_until(loop, lambda: "no reasoning answer" in window.status.text(), 10)
