"""The window against a scripted engine: exact budget cut display, verifier scores and the weighted vote, a tied
vote shown as a tie, picking another candidate, a crash mid-stream (partial reply kept, marked incomplete),
engine errors shown."""
import pytest

from tests.qt_helpers import run_until, shutdown_returns_while_held
from tests.ui.helpers import ask, make_window
from tests.ui.scripted_engine import ScriptedEngine


@pytest.fixture
def window(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine())
    yield win
    win.service.shutdown()


def test_budget_cut_is_marked_with_the_full_meter(window, loop):
    reply = ask(window, loop, "Why?", "reason", budget=128)
    text = window.view.toPlainText()
    assert "Thought for" in text and "· 128/128 tokens · cut at budget" in text
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
    card = win.view.card(reply.id)  # an error card with Retry
    assert "This answer failed: the model crashed mid-answer" in win.view.toPlainText()
    assert card.error.isVisibleTo(card) and card.retry_button.accessibleName() == "Retry"
    win.service.shutdown()


def test_an_error_about_no_reply_stays_off_an_old_failed_reply(qtbot, loop, tmp_path):
    """A model-switch refusal while an answer runs goes to the status bar, not onto an earlier failed reply."""
    engine = ScriptedEngine(crash_after=2)
    win = make_window(qtbot, loop, tmp_path, engine)
    failed = ask(win, loop, "Tell me", "base")
    engine.crash_after, engine.delay_s = None, 0.1
    win.composer.apply("base", 8, 1)
    win.composer.input.setPlainText("And now?")
    win.composer.send_button.click()
    assert run_until(loop, lambda: win.service.busy, 10)
    win.switch_model("other-model")
    assert run_until(loop, lambda: "switching models" in win.status.text(), 10)
    assert run_until(loop, lambda: not win.service.busy, 10)
    win.render()
    card = win.view.card(failed.id)
    assert card.error.isVisibleTo(card) and "crashed mid-answer" in card.error_label.text()
    assert "switching models" not in win.view.toPlainText()
    assert win.controller.messages()[-1].status == "complete"
    win.service.shutdown()


def test_engine_refusal_is_shown_not_raised(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine(think_error=ValueError("the trace no longer fits")))
    reply = ask(win, loop, "Why?", "reason", budget=8)
    win.on_action("longer", [str(reply.id)])
    assert run_until(loop, lambda: "no longer fits" in win.status.text(), 10)
    assert run_until(loop, lambda: not win.service.busy, 10)
    assert win.controller.messages()[-1] == reply
    win.service.shutdown()


def test_tied_vote_is_shown_as_a_tie_not_a_win(qtbot, loop, tmp_path):
    """Four different answers, one vote each: nothing won; the first candidate is shown, not ticked."""
    engine = ScriptedEngine(finals=("1200", "1100", "1000", "900"), scores=(0.5, 0.5, 0.5, 0.5), method="majority")
    win = make_window(qtbot, loop, tmp_path, engine)
    reply = ask(win, loop, "What is 30*40?", "reason", parallel=4)
    assert reply.meta["vote"]["tie"] is True and reply.meta["chosen"] == 0
    text = win.view.toPlainText()
    assert "Vote (majority) — tie between 4 answers (1 vote each): the first candidate is shown" in text
    assert "✓" not in text and "shown (tie)" in text
    win.controller.pick_candidate(reply.id, 2)
    win.render()
    text = win.view.toPlainText()
    assert "✓" in text and "your pick is shown" in text and "shown (tie)" not in text
    win.service.shutdown()


def test_a_clear_vote_is_ticked_and_not_called_a_tie(window, loop):
    reply = ask(window, loop, "What is 6*7?", "reason", parallel=4)
    assert reply.meta["vote"]["tie"] is False
    text = window.view.toPlainText()
    assert "✓" in text and "tie" not in text


def test_a_question_stopped_while_queued_is_marked_stopped_not_failed(qtbot, loop, tmp_path):
    """The window's request waits behind a job that needs the engine alone (a model or adapter switch; generations
    from the local server would decode beside it instead); Stop before it starts leaves a stopped reply, not an
    "incomplete" one that reads like a crash."""
    import threading

    from tests.qt_helpers import run_until
    from tests.ui.helpers import make_window
    from tests.ui.scripted_engine import ScriptedEngine

    engine = ScriptedEngine(delay_s=0.2)
    win = make_window(qtbot, loop, tmp_path, engine)
    release, holding = threading.Event(), threading.Event()

    def switch():  # holds the engine alone until released
        holding.set()
        return release.wait(30)

    exclusive = win.service.worker.submit(switch)
    assert holding.wait(5)
    win.composer.apply("base", 8, 1)
    win.composer.input.setPlainText("Are you there?")
    win.composer.send_button.click()
    assert run_until(loop, lambda: win.service.worker.waiting == 1, 5)  # queued behind the switch
    win.composer.stopRequested.emit()
    release.set()
    assert exclusive.result(10) is True
    assert run_until(loop, lambda: not win.service.busy, 30)
    reply = win.controller.messages()[-1]
    assert reply.role == "assistant" and reply.status == "cancelled"
    assert not any(name == "stream" for name, _ in engine.calls)  # stopped before it reached the engine
    win.service.shutdown()


def test_a_question_asked_while_the_model_loads_is_sent_when_it_is_ready(qtbot, loop, tmp_path):
    """Typing and pressing Send (Ctrl+Enter) during loading used to do nothing and say nothing."""
    import time

    from app.chat_controller import ChatController
    from app.engine_service import EngineService
    from core.storage.chats import ChatStore
    from tests.qt_helpers import run_until
    from tests.ui.scripted_engine import ScriptedEngine
    from ui.main_window import MainWindow

    service = EngineService()

    def slow_load():  # the engine thread loads for a while, then installs the engine as the real load does
        time.sleep(0.5)
        service.worker.engine = ScriptedEngine()

    service._load = slow_load
    win = MainWindow(service, ChatController(service, ChatStore(tmp_path / "c.db", flush_s=0.01)))
    qtbot.addWidget(win)
    starting = loop.create_task(service.start())
    assert run_until(loop, lambda: "Loading" in win.status.text(), 5) and not service.ready
    win.composer.input.setPlainText("Are you there?")
    win.composer.send_button.click()
    assert "will be sent" in win.status.text() and win.controller.messages() == []
    assert run_until(loop, lambda: len(win.controller.messages()) == 2 and not service.busy, 30)
    assert loop.run_until_complete(starting) is True
    question, reply = win.controller.messages()
    assert question.content == "Are you there?" and reply.role == "assistant" and reply.content
    service.shutdown()


def test_a_question_asked_when_no_model_loads_goes_back_into_the_box(qtbot, loop, tmp_path):
    from app.chat_controller import ChatController
    from app.engine_service import EngineService
    from core.storage.chats import ChatStore
    from ui.main_window import MainWindow

    service = EngineService()
    win = MainWindow(service, ChatController(service, ChatStore(tmp_path / "c.db", flush_s=0.01)))
    qtbot.addWidget(win)
    win.on_state("error")
    win.composer.input.setPlainText("Hello?")
    win.composer.send_button.click()
    assert win.composer.input.toPlainText() == "Hello?" and "No model is loaded" in win.status.text()
    service.shutdown()



def held_load(tiny_store):
    """A service whose first-launch measurement (seconds on a real computer) waits for `measured`; the load after
    it would prepare the tiny model's W4 weights."""
    import threading

    from app.engine_service import EngineService
    from core.config import EngineConfig
    from core.machine_fit import ModelChoice
    from tests.conftest import TINY_ID

    measuring, measured = threading.Event(), threading.Event()

    def choose():
        measuring.set()
        measured.wait(60)
        return ModelChoice(TINY_ID, "Tiny.", 50.0, 16 * 2**30)

    return EngineService(EngineConfig(model_id=TINY_ID), store=tiny_store, choose=choose), measuring, measured


def test_closing_the_window_while_the_model_loads_gives_the_load_up(qtbot, loop, tiny_store, tmp_path):
    """Closing during a load used to let the load run to its end (and the app wait for it): now the load stops at
    its next step, installs no model, reports nothing and prepares no weights (whole or half-written)."""
    from app.chat_controller import ChatController
    from core.storage.chats import ChatStore
    from tests.conftest import TINY_ID
    from ui.main_window import MainWindow

    folder = tiny_store.get(TINY_ID).folder
    before = sorted(p.name for p in folder.iterdir())
    service, measuring, measured = held_load(tiny_store)
    states, errors = [], []
    service.stateChanged.connect(states.append)
    service.failed.connect(errors.append)
    win = MainWindow(service, ChatController(service, ChatStore(tmp_path / "c.db", flush_s=0.01)))
    qtbot.addWidget(win)
    win.show()
    starting = loop.create_task(service.start())
    try:
        assert run_until(loop, measuring.is_set, 30)
        win.close()
    finally:
        measured.set()
    assert run_until(loop, starting.done, 60) and starting.result() is False
    assert states == ["loading"] and errors == [] and not service.ready and service.worker.engine is None
    assert sorted(p.name for p in folder.iterdir()) == before  # no w4-h4 folder, nor a temporary one
    service.shutdown()


def test_shutdown_returns_while_a_load_is_inside_a_step(loop, tiny_store):
    """The app's shutdown used to join the engine thread until the load had finished; it now waits at most its
    timeout, says the thread is still busy, and the load ends at its next step."""
    service, measuring, measured = held_load(tiny_store)
    shutdown_returns_while_held(loop, service, loop.create_task(service.start()), measuring, measured)
    assert service.worker.engine is None
