"""The window on the real tiny engine (with a random reasoning adapter) and a real chat store, offscreen."""
from dataclasses import replace

import pytest

from app.chat_controller import ChatController
from app.engine_service import EngineService
from app.settings import budget_note
from core.adapters import lora as adapters
from core.engine import Engine
from core.storage.chats import ChatStore
from tests.qt_helpers import run_until
from tests.tiny import make_model, make_tokenizer
from ui.composer import BUDGET_TIP
from ui.main_window import MainWindow


@pytest.fixture(scope="module")
def reasoning_engine():
    model = adapters.attach_new(make_model(448), rank=4)
    model.eval()
    return Engine(model, make_tokenizer(), model_id="tiny", context=512, adapter_name="reason")


@pytest.fixture
def window(qtbot, loop, reasoning_engine, tmp_path):
    service = EngineService(engine=reasoning_engine)
    store = ChatStore(tmp_path / "chats.db", flush_s=0.05)
    controller = ChatController(service, store)
    win = MainWindow(service, controller)
    qtbot.addWidget(win)
    loop.run_until_complete(service.start())
    yield win
    service.shutdown()


def send(win, loop, text, mode="base", budget=256, parallel=1):
    win.composer.apply(mode, budget, parallel)
    win.composer.input.setPlainText(text)
    before = len(win.controller.messages())
    win.composer.send_button.click()
    assert run_until(loop, lambda: not win.service.busy and len(win.controller.messages()) >= before + 2)
    return win.controller.messages()[-1]


def test_fast_answer_is_streamed_saved_and_shown(window, loop):
    reply = send(window, loop, "What is 17*23?", mode="base")
    assert reply.role == "assistant" and reply.status == "complete" and reply.meta["route"]["reason"] is False
    assert window.sidebar.list.count() == 1 and "What is 17*23?" in window.sidebar.list.item(0).text()
    assert "tok/s" in window.status.text()
    assert reply.content[:3] in window.view.toPlainText()


def test_reasoning_answer_has_trace_meter_and_budget_cut(window, loop):
    reply = send(window, loop, "What is 2+2?", mode="reason", budget=128)
    assert reply.meta["budget"] == 128 and reply.meta["thinking_tokens"] <= 128
    text = window.view.toPlainText()
    assert "Thought for" in text and "/128 tokens" in text
    if reply.meta["budget_forced"]:
        assert "cut at budget" in text
    card = window.view.card(reply.id).thinking
    assert not card.expanded and card.header.accessibleName()
    card.header.click()  # the thinking card opens
    assert reply.id in window.view.expanded and card.expanded
    window.render()  # and stays open across renders
    assert card.expanded and len(window.view.toPlainText()) > len(text)


def test_think_longer_continues_the_replys_own_trace(window, loop):
    """The real engine: the trace is kept under the reply's id and continued on its cache, in its own chat,
    even after another chat was answered; the reply is replaced only when the continuation finished."""
    first = send(window, loop, "What is 2+2?", mode="reason", budget=128)
    chat = window.controller.current
    window.new_chat()
    send(window, loop, "What is 3+5?", mode="reason", budget=128)
    window.controller.open(chat)
    window.render()
    assert window.view.offered(first.id, "think")  # the Think longer button on the reply's card
    window.on_action("longer", [str(first.id)])
    assert run_until(loop, lambda: window.service.busy, 10) or not window.service.busy
    assert run_until(loop, lambda: not window.service.busy)
    msgs = window.controller.messages()
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[0].content == "What is 2+2?"
    new = msgs[1]
    assert new.id != first.id and new.thinking.startswith(first.thinking) and new.meta["resumed"] == "cache"
    assert new.meta["thinking_tokens"] > first.meta["thinking_tokens"]


def test_parallel_answers_show_candidates_and_vote(window, loop):
    reply = send(window, loop, "What is 3+4?", mode="reason", budget=128, parallel=4)
    assert len(reply.meta["candidates"]) == 4 and reply.meta["vote"]["method"] in ("weighted", "majority")
    text = window.view.toPlainText()
    assert "Vote (" in text
    other = next(c for c in reply.meta["candidates"] if c["index"] != reply.meta["chosen"])
    window.controller.pick_candidate(reply.id, other["index"])
    assert window.controller.messages()[-1].content == other["text"]


def test_stop_cancels_and_keeps_partial_reply(window, loop):
    window.composer.apply("base", 256, 1)
    window.composer.input.setPlainText("Tell me everything")
    window.composer.send_button.click()
    assert run_until(loop, lambda: window.service.busy)
    window.composer.stopRequested.emit()
    assert run_until(loop, lambda: not window.service.busy)
    reply = window.controller.messages()[-1]
    assert reply.status == "cancelled"


def test_search_export_rename_delete_undo(window, loop, tmp_path, monkeypatch):
    send(window, loop, "Remember the word pineapple", mode="base")
    window.sidebar.search.setText("pineapple")
    assert window.sidebar.list.count() == 1 and "[pineapple]" in window.sidebar.list.item(0).text()
    window.sidebar.search.setText("")
    cid = window.controller.current
    from ui import dialogs

    monkeypatch.setattr(dialogs.ExportDialog, "ask", classmethod(lambda cls, p, s, f: str(tmp_path / f"out.{f}")))
    monkeypatch.setattr(dialogs.RenameDialog, "ask", classmethod(lambda cls, p, c: "Fruit"))
    window.export(cid, "md")
    assert "pineapple" in (tmp_path / "out.md").read_text()
    (tmp_path / "taken").mkdir()  # a folder where the file should go: the write fails (even as root)
    (tmp_path / "taken" / "inside.txt").write_text("kept")
    monkeypatch.setattr(dialogs.ExportDialog, "ask", classmethod(lambda cls, p, s, f: str(tmp_path / "taken")))
    window.export(cid, "md")
    assert window.status.text().startswith("Could not export")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert (tmp_path / "taken" / "inside.txt").read_text() == "kept"
    window.rename(cid)
    assert window.sidebar.list.item(0).text() == "Fruit"
    window.delete(cid)
    assert window.sidebar.list.count() == 0 and window.undo_button.isVisibleTo(window)
    window.undo_delete()
    assert window.sidebar.list.count() == 1


def test_settings_apply_persist_and_drive_requests(window, loop, tmp_path):
    from dataclasses import replace

    from PySide6.QtWidgets import QApplication

    from app.settings import load_settings

    chosen = replace(window.settings, mode="reason", budget=512, parallel=3, temperature=0.0,
                     parallel_temperature=0.9, top_k=0, answer_max_tokens=64, theme="dark")
    window.apply_settings(chosen)
    try:
        assert window.composer.options() == {"mode": "reason", "budget": 512, "parallel": 3}
        options = window.options()
        assert options.temperature == 0.9 and options.top_k == 0 and options.answer_max_tokens == 64
        assert QApplication.instance().palette().window().color().lightness() < 80  # dark
        window.composer.apply("base", 128, 1)
        window.new_chat()  # a new chat starts from the defaults again
        assert window.composer.options()["mode"] == "reason"
        window.composer.apply("base", 256, 1)
        reply = send(window, loop, "Say hi", mode="base")
        assert reply.meta["settings"]["temperature"] == 0.0 and reply.meta["tokens"] <= 64
    finally:
        window.apply_settings(replace(chosen, theme="light"))
    assert QApplication.instance().palette().window().color().lightness() > 160
    window.resize(900, 650)
    window.close()
    store = ChatStore(tmp_path / "chats.db")
    assert load_settings(store).budget == 512 and load_settings(store).theme == "light"
    assert store.get_setting("window_geometry")


def test_settings_dialog_round_trip(qtbot, tmp_path):
    from app.settings import AppSettings
    from ui.settings_dialog import SettingsDialog

    dialog = SettingsDialog(AppSettings(model_id="m"), tmp_path)
    qtbot.addWidget(dialog)
    assert dialog.settings() == AppSettings(model_id="m")
    dialog.mode.setCurrentIndex(dialog.mode.findData("base"))
    dialog.budget.setCurrentIndex(dialog.budget.findData(None))
    dialog.threads.setValue(1)
    dialog.theme.setCurrentIndex(dialog.theme.findData("dark"))
    dialog.top_p.setValue(0.5)
    got = dialog.settings()
    assert (got.mode, got.budget, got.threads, got.theme, got.top_p, got.model_id) == ("base", None, 1, "dark", 0.5, "m")
    assert str(tmp_path) in dialog.data_label.text()


def test_efficient_decode_setting_reaches_the_engine(window, loop, reasoning_engine):
    from dataclasses import replace

    try:
        window.apply_settings(replace(window.settings, decode="griffin"))
        assert run_until(loop, lambda: reasoning_engine.decode == "griffin")
        reply = send(window, loop, "Say hi", mode="base")
        assert reply.meta["tokens"] > 0 and reasoning_engine.last_cache.ff_selection is not None
        window.apply_settings(replace(window.settings, decode="griffin+caprese"))  # the tiny model has no branches
        assert run_until(loop, lambda: "no Caprese branches" in window.status.text())
    finally:
        window.apply_settings(replace(window.settings, decode="dense"))
        assert run_until(loop, lambda: reasoning_engine.decode == "dense")


def test_settings_dialog_explains_the_decode_choice(qtbot, tmp_path):
    from app.settings import DECODE_CHOICES, AppSettings
    from ui.settings_dialog import SettingsDialog

    dialog = SettingsDialog(AppSettings(model_id="m", decode="griffin"), tmp_path)
    qtbot.addWidget(dialog)
    assert dialog.settings().decode == "griffin" and dialog.decode_note.text() == DECODE_CHOICES["griffin"][1]
    dialog.decode.setCurrentIndex(dialog.decode.findData("dense"))
    assert dialog.settings().decode == "dense" and dialog.decode_note.text() == DECODE_CHOICES["dense"][1]
    for mode in ("griffin", "griffin+caprese", "cats"):  # each choice shows its measured speed and accuracy
        assert "× dense decode speed" in DECODE_CHOICES[mode][1] and "GSM8K" in DECODE_CHOICES[mode][1]
    assert "recommended" in dialog.decode.itemText(dialog.decode.findData("dense"))


def test_budget_tooltip_shows_the_shipped_adapters_measured_budgets(qtbot, loop, tmp_path):
    model_id = "qwen2.5-coder-1.5b-instruct"  # the tiny engine under a shipped model's name
    engine = Engine(adapters.attach_new(make_model(448), rank=4).eval(), make_tokenizer(), model_id=model_id,
                    context=512, adapter_name="reasoning")
    service = EngineService(engine=engine)
    win = MainWindow(service, ChatController(service, ChatStore(tmp_path / "chats.db", flush_s=0.05)))
    qtbot.addWidget(win)
    loop.run_until_complete(service.start())
    try:
        win.update_reasoning_available()
        assert win.composer.budget.toolTip() == f"{BUDGET_TIP}\n{budget_note(model_id)}"
        assert "512 → 57.0%" in win.composer.budget.toolTip()
        win.settings = replace(win.settings, reasoning_adapters={model_id: "my-own"})
        win.update_reasoning_available()  # a library adapter: the shipped one's figures do not apply
        assert win.composer.budget.toolTip() == BUDGET_TIP
    finally:
        service.shutdown()


def test_budget_tooltip_is_plain_for_a_model_without_measurements(window):
    window.update_reasoning_available()
    assert window.composer.budget.toolTip() == BUDGET_TIP


def test_a_full_disk_keeps_the_question_and_the_streamed_answer(window, loop, monkeypatch):
    """A question that cannot be saved goes back into the box; an answer whose streamed writes fail streams on,
    is said to be unsaved, and is written whole once it finishes; nothing leaves the window stuck."""
    import sqlite3

    import ui.main_window

    notices = []
    monkeypatch.setattr(ui.main_window, "show_info", lambda parent, title, text: notices.append(text))
    store = window.controller.store
    real_add, real_update = store.add_message, store.update_message

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "add_message", full)
    window.composer.input.setPlainText("Remember the word kiwi")
    window.composer.send_button.click()
    assert run_until(loop, lambda: window.composer.input.toPlainText() == "Remember the word kiwi")
    assert "could not be saved" in notices[-1] and not window.service.busy
    monkeypatch.setattr(store, "add_message", real_add)
    calls = []

    def full_while_streaming(mid, **fields):
        calls.append(fields)
        if "status" not in fields:  # the streaming flushes fail; the final write (with the status) goes through
            raise sqlite3.OperationalError("database or disk is full")
        return real_update(mid, **fields)

    monkeypatch.setattr(store, "update_message", full_while_streaming)
    window.composer.input.setPlainText("")
    reply = send(window, loop, "Remember the word kiwi", mode="base")
    assert any("could not be saved while it streams" in n for n in notices) and notices[-1].startswith("The answer was saved")
    assert reply.status == "complete" and reply.content and window.composer.send_button.isEnabled()


def test_actions_on_earlier_cards_are_off_while_an_answer_runs(window, loop):
    send(window, loop, "first question", mode="base")
    window.composer.apply("base", 256, 1)
    window.composer.input.setPlainText("second question")
    window.composer.send_button.click()
    assert run_until(loop, lambda: window.service.busy)
    first = window.controller.messages()[0]
    assert not window.view.offered(first.id, "edit")
    assert run_until(loop, lambda: not window.service.busy)
    assert window.view.offered(window.controller.messages()[0].id, "edit")


def test_a_question_asked_while_loading_keeps_its_options_and_a_second_is_not_dropped(window, loop, monkeypatch):
    service_type = type(window.service)
    real_ready = service_type.ready
    monkeypatch.setattr(service_type, "ready", property(lambda self: False))  # as while a model loads
    window.on_state("loading")
    window.composer.apply("base", 512, 1)
    window.on_send("first queued question")
    window.on_send("second queued question")
    assert window.composer.input.toPlainText() == "second queued question"  # back in the box, not lost
    window.composer.apply("base", 128, 1)
    monkeypatch.setattr(service_type, "ready", real_ready)
    window.on_state("ready")
    assert run_until(loop, lambda: not window.service.busy and len(window.controller.messages()) >= 2)
    question, reply = window.controller.messages()[:2]
    assert question.content == "first queued question" and reply.meta["settings"]["budget"] == 512


def test_saving_settings_keeps_a_model_switched_to_while_the_dialog_was_open(window, monkeypatch):
    from dataclasses import replace as dc_replace

    import ui.main_window

    opened_with = window.settings
    monkeypatch.setattr(ui.main_window.SettingsDialog, "ask",
                        classmethod(lambda cls, parent, settings, data_dir: dc_replace(opened_with, top_p=0.5)))
    window.settings = dc_replace(window.settings, model_id="another-model")  # a switch finished meanwhile
    window.open_settings()
    assert window.settings.model_id == "another-model" and window.settings.top_p == 0.5
