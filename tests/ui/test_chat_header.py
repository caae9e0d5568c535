"""The chat header on real widgets (offscreen), a real chat store and model store: the model picker lists the
installed models and switches the running one (loading state meanwhile), the title renames in place, and the
chat settings dialog saves a system prompt and sampling overrides that come back when the chat is reopened,
also after a restart."""
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QDialog

from app.chat_controller import ChatController
from app.engine_service import EngineService
from app.model_service import ModelService
from app.settings import AppSettings, load_settings
from core.storage.chats import ChatStore
from tests.conftest import TINY_ID
from tests.qt_helpers import run_until
from tests.ui.helpers import make_window, wait_idle
from tests.ui.scripted_engine import ScriptedEngine
from ui.chat_settings_dialog import CUSTOM, PRESETS, ChatSettingsDialog
from ui.main_window import MainWindow


@pytest.fixture
def window(qtbot, loop, tmp_path):
    win = make_window(qtbot, loop, tmp_path, ScriptedEngine())
    yield win
    win.close()
    win.service.shutdown()


def send(win, loop, text):
    win.composer.input.setPlainText(text)
    win.composer.send_button.click()
    wait_idle(win, loop)


def teacher_with_cool_temperature(monkeypatch):
    """The dialog as a user would fill it: the Teacher preset and temperature 0.2 for this chat, then Save."""
    def exec_(dialog):
        dialog.preset.setCurrentIndex(dialog.preset.findData("Teacher"))
        dialog.preset.activated.emit(dialog.preset.currentIndex())
        temperature = dialog.overrides["temperature"]
        temperature.use_global.setChecked(False)
        temperature.spin.setValue(0.2)
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(ChatSettingsDialog, "exec", exec_)


# --- model picker ----------------------------------------------------------------------------------------
def test_the_model_picker_lists_installed_models_and_switches(qtbot, loop, tmp_path, tiny_store):
    service = EngineService(engine=ScriptedEngine())
    controller = ChatController(service, ChatStore(tmp_path / "chats.db", flush_s=0.01))
    models = ModelService(tiny_store, active_id="scripted")
    win = MainWindow(service, controller, models)
    qtbot.addWidget(win)
    loop.run_until_complete(service.start())
    try:
        picker = win.header.models
        assert set(win.header.model_ids()) == {TINY_ID, "scripted"}  # installed + the running one
        assert picker.currentData() == "scripted" and picker.isEnabled()
        picker.setCurrentIndex(picker.findData(TINY_ID))
        picker.activated.emit(picker.currentIndex())
        assert not picker.isEnabled() and win.header.loading.isVisibleTo(win.header)  # loading state
        assert "Loading" in win.header.loading.text()
        assert run_until(loop, lambda: service.ready and service.model_name == TINY_ID and picker.isEnabled(), 120)
        assert picker.currentData() == TINY_ID and not win.header.loading.isVisibleTo(win.header)
        assert win.settings.model_id == TINY_ID
        assert load_settings(ChatStore(tmp_path / "chats.db")).model_id == TINY_ID
        picker.activated.emit(picker.currentIndex())  # the running model again: nothing to do
        assert picker.isEnabled()
    finally:
        service.shutdown()
        models.shutdown()


def test_choosing_a_model_calls_switch_model(window, monkeypatch):
    window.header.set_models([("a-model", "A model"), ("b-model", "B model")], "a-model")
    calls = []
    monkeypatch.setattr(window, "switch_model", calls.append)
    picker = window.header.models
    picker.setCurrentIndex(picker.findData("b-model"))
    picker.activated.emit(picker.currentIndex())
    assert calls == ["b-model"] and "B model" in window.header.loading.text()


# --- title -----------------------------------------------------------------------------------------------
def test_the_title_renames_in_place(window, loop):
    header = window.header
    assert header.title.full == "New chat" and not header.editable
    QTest.mouseDClick(header.title, Qt.MouseButton.LeftButton)
    assert header.title_stack.currentWidget() is header.title  # nothing to rename yet
    send(window, loop, "How far is the Moon?")
    assert header.title.full == "How far is the Moon?" and header.editable
    QTest.mouseDClick(header.title, Qt.MouseButton.LeftButton)
    assert header.title_stack.currentWidget() is header.title_edit
    header.title_edit.setText("Moon distance")
    QTest.keyClick(header.title_edit, Qt.Key.Key_Return)
    cid = window.controller.current
    assert window.controller.title(cid) == "Moon distance" and header.title.full == "Moon distance"
    assert window.sidebar.list.item(0).text() == "Moon distance"
    window.show()
    window.windowHandle().requestActivate()  # the window's Esc (Stop) shortcut is live: Esc still cancels
    assert QTest.qWaitForWindowActive(window.windowHandle(), 5000)
    QTest.mouseDClick(header.title, Qt.MouseButton.LeftButton)
    header.title_edit.setText("Discarded")
    QTest.keyClick(header.title_edit, Qt.Key.Key_Escape)
    assert header.title_stack.currentWidget() is header.title
    window.composer.input.setFocus()  # focus leaves the hidden editor: nothing is renamed
    assert window.controller.title(cid) == "Moon distance" and header.title.full == "Moon distance"


def test_a_rename_being_typed_survives_a_reply_finishing(window, loop):
    send(window, loop, "How far is the Moon?")
    cid = window.controller.current
    header = window.header
    window.show()
    window.windowHandle().requestActivate()  # focus is real: leaving the editor would finish the rename
    assert QTest.qWaitForWindowActive(window.windowHandle(), 5000)
    QTest.mouseDClick(header.title, Qt.MouseButton.LeftButton)
    header.title_edit.setText("Moon dis")
    window.composer.input.setPlainText("And the Sun?")
    window.composer.send_button.click()  # a reply finishes: the chat list and the header refresh
    wait_idle(window, loop)
    assert header.title_stack.currentWidget() is header.title_edit and header.title_edit.text() == "Moon dis"
    assert window.controller.title(cid) == "How far is the Moon?"  # half a title is not saved
    QTest.keyClicks(header.title_edit, "tance")
    QTest.keyClick(header.title_edit, Qt.Key.Key_Return)
    assert window.controller.title(cid) == "Moon distance" and header.title.full == "Moon distance"
    QTest.mouseDClick(header.title, Qt.MouseButton.LeftButton)
    header.title_edit.setText("Not for the new chat")
    window.new_chat()  # another chat: the rename is dropped, not saved on either chat
    assert header.title_stack.currentWidget() is header.title and header.title.full == "New chat"
    assert window.controller.title(cid) == "Moon distance"


# --- chat settings ---------------------------------------------------------------------------------------
def test_chat_settings_are_saved_and_restored_when_the_chat_is_reopened(window, loop, qtbot, tmp_path, monkeypatch):
    send(window, loop, "What is a prime?")
    cid = window.controller.current
    teacher_with_cool_temperature(monkeypatch)
    window.header.settings_button.click()
    expected = {"system_prompt": PRESETS["Teacher"], "sampling": {"temperature": 0.2}}
    assert window.controller.chat_settings() == expected
    assert window.header.summary.text() == "Teacher · 1 override"
    window.new_chat()
    assert window.controller.chat_settings() == {"system_prompt": None, "sampling": {}}
    assert window.header.summary.text() == ""
    window.controller.open(cid)
    assert window.controller.chat_settings() == expected and window.header.summary.text() == "Teacher · 1 override"
    dialog = ChatSettingsDialog(window.current_chat_settings(), window.settings)
    qtbot.addWidget(dialog)
    assert dialog.preset.currentData() == "Teacher" and dialog.prompt.toPlainText() == PRESETS["Teacher"]
    assert not dialog.overrides["temperature"].use_global.isChecked()
    assert dialog.overrides["temperature"].spin.value() == 0.2 and dialog.overrides["top_p"].use_global.isChecked()
    window.close()
    window.service.shutdown()
    again = make_window(qtbot, loop, tmp_path, ScriptedEngine())  # a restart on the same database
    again.controller.open(cid)
    assert again.controller.chat_settings() == expected and again.header.summary.text() == "Teacher · 1 override"
    again.service.shutdown()


def test_settings_chosen_for_a_new_chat_apply_from_its_first_message(window, loop, monkeypatch):
    teacher_with_cool_temperature(monkeypatch)
    window.open_chat_settings()
    assert window.controller.current is None and "first message" in window.status.text()
    send(window, loop, "Teach me fractions")
    assert window.controller.chat_settings() == {"system_prompt": PRESETS["Teacher"],
                                                 "sampling": {"temperature": 0.2}}


def test_the_dialog_presets_and_use_global_boxes(qtbot):
    globals_ = AppSettings(temperature=0.3, top_k=40)
    dialog = ChatSettingsDialog({"system_prompt": "Answer in French.", "sampling": {"top_k": 5}}, globals_)
    qtbot.addWidget(dialog)
    assert dialog.preset.currentData() == CUSTOM
    top_k, temperature = dialog.overrides["top_k"], dialog.overrides["temperature"]
    assert not top_k.use_global.isChecked() and top_k.spin.value() == 5 and top_k.spin.isEnabled()
    assert temperature.use_global.isChecked() and temperature.spin.value() == 0.3 and not temperature.spin.isEnabled()
    dialog.preset.setCurrentIndex(dialog.preset.findData("Coder"))
    dialog.preset.activated.emit(dialog.preset.currentIndex())
    assert dialog.prompt.toPlainText() == PRESETS["Coder"] and dialog.preset.currentData() == "Coder"
    QTest.keyClicks(dialog.prompt, " Prefer Python.")
    assert dialog.preset.currentData() == CUSTOM
    top_k.use_global.setChecked(True)
    assert top_k.spin.value() == 40 and not top_k.spin.isEnabled()
    got = dialog.chat_settings()
    assert got["system_prompt"].endswith("Prefer Python.") and got["sampling"] == {}
    dialog.preset.setCurrentIndex(dialog.preset.findData("Default"))
    dialog.preset.activated.emit(dialog.preset.currentIndex())
    answer_cap = dialog.overrides["answer_max_tokens"]
    answer_cap.use_global.setChecked(False)
    answer_cap.spin.setValue(128)
    assert dialog.chat_settings() == {"system_prompt": None, "sampling": {"answer_max_tokens": 128}}
