"""Adapters in the window, on the real tiny engine and a real adapter library and chat store (offscreen): a chat's
skill adapter is kept with the chat (switching chats, a restart) and answers its requests (the engine's own
Answer.adapter says so); a deleted one falls back to none with a message; the model's reasoning adapter is chosen
in the Adapters dialog, applied without reloading the model, remembered per model and re-applied on the next load."""
from dataclasses import replace

import pytest
import torch

from app.chat_controller import ChatController
from app.engine_service import EngineService
from app.settings import load_settings, save_settings
from core.adapters.library import AdapterLibrary
from core.engine import Engine
from core.loading import load_plain, load_tokenizer
from core.storage.chats import ChatStore
from tests.conftest import TINY_ID
from tests.qt_helpers import run_until
from tests.ui.test_adapters_dialog import make_adapter
from ui import adapters_dialog, dialogs
from ui.main_window import MainWindow


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory, tiny_hf_dir):
    root = tmp_path_factory.mktemp("chat-adapters")
    return {"skill": make_adapter(tiny_hf_dir, root / "sql", name="sql-helper", kind="skill"),
            "poems": make_adapter(tiny_hf_dir, root / "poems", name="poems", kind="skill"),
            "reasoning": make_adapter(tiny_hf_dir, root / "concise", name="concise", kind="reasoning")}


@pytest.fixture
def library(tiny_store, adapter_dirs):
    lib = AdapterLibrary(store=tiny_store)
    lib.add_from_folder(adapter_dirs["skill"], TINY_ID, "sql-helper", kind="skill")
    lib.add_from_folder(adapter_dirs["poems"], TINY_ID, "poems", kind="skill")
    lib.add_from_folder(adapter_dirs["reasoning"], TINY_ID, "concise", kind="reasoning")
    return lib


def fresh_engine(hf_dir) -> Engine:
    """The tiny model with no reasoning adapter (each test gets its own: adapters are loaded into it)."""
    return Engine(load_plain(hf_dir, torch.bfloat16), load_tokenizer(hf_dir), model_id=TINY_ID, context=512)


def open_window(qtbot, loop, tmp_path, engine, tiny_store):
    store = ChatStore(tmp_path / "chats.db", flush_s=0.01)
    save_settings(store, replace(load_settings(store), answer_max_tokens=16))  # short answers: the chat stays short
    service = EngineService(engine=engine, store=tiny_store)
    win = MainWindow(service, ChatController(service, store))
    qtbot.addWidget(win)
    loop.run_until_complete(service.start())
    return win


@pytest.fixture
def window(qtbot, loop, tmp_path, tiny_hf_dir, tiny_store, library):
    win = open_window(qtbot, loop, tmp_path, fresh_engine(tiny_hf_dir), tiny_store)
    yield win
    win.service.shutdown()


def pick_adapter(win, name):
    """What the user does: choose `name` in the composer's Adapter box."""
    box = win.composer.adapter
    box.setCurrentIndex(box.findData(name))
    box.activated.emit(box.currentIndex())


def send(win, loop, text, mode="base"):
    win.composer.apply(mode, 8, 1)
    win.composer.input.setPlainText(text)
    before = len(win.controller.messages())
    win.composer.send_button.click()
    assert run_until(loop, lambda: not win.service.busy and len(win.controller.messages()) >= before + 2, 30)
    return win.controller.messages()[-1]


def combo_items(win) -> list:
    box = win.composer.adapter
    return [box.itemData(i) for i in range(box.count())]


def test_a_chats_skill_adapter_answers_and_is_kept_across_chats_and_a_restart(window, loop, qtbot, tmp_path,
                                                                            tiny_hf_dir, tiny_store):
    assert combo_items(window) == [None, "poems", "sql-helper"] and window.composer.adapter.isEnabled()
    pick_adapter(window, "sql-helper")  # before the chat exists: it is created with it
    reply = send(window, loop, "List the tables")
    chat = window.controller.current
    assert reply.status == "complete" and reply.meta["adapter"] == "sql-helper"  # Answer.adapter, from the engine
    assert reply.meta["settings"]["skill"] == "sql-helper"
    assert "sql-helper" in window.service.adapter_names()["skills"]
    window.new_chat()
    assert window.composer.current_adapter() is None
    plain = send(window, loop, "Hello")
    other = window.controller.current
    assert plain.meta["adapter"] is None and plain.meta["settings"]["skill"] is None
    window.controller.open(chat)
    assert window.composer.current_adapter() == "sql-helper"
    pick_adapter(window, "poems")
    assert send(window, loop, "A haiku").meta["adapter"] == "poems"
    window.controller.open(other)
    assert window.composer.current_adapter() is None
    window.close()
    window.service.shutdown()
    again = open_window(qtbot, loop, tmp_path, fresh_engine(tiny_hf_dir), tiny_store)
    try:
        again.controller.open(chat)
        assert again.composer.current_adapter() == "poems"
        assert send(again, loop, "Another haiku").meta["adapter"] == "poems"
    finally:
        again.service.shutdown()


def test_a_deleted_adapter_leaves_the_chat_answering_without_it(window, loop, library, monkeypatch):
    pick_adapter(window, "sql-helper")
    send(window, loop, "Hi")
    chat = window.controller.current
    window.new_chat()
    library.remove(TINY_ID, "sql-helper")  # e.g. `ponder adapters remove` while the window was open
    window.controller.open(chat)
    assert window.composer.current_adapter() is None and combo_items(window) == [None, "poems"]
    assert "“sql-helper” is not in the library" in window.status.text()
    assert send(window, loop, "Still there?").meta["adapter"] is None
    pick_adapter(window, "poems")
    window.open_adapters()  # deleted in the dialog: the chats that used it forget it
    dialog = window.adapters_dialog
    dialog.select("poems")
    monkeypatch.setattr(dialogs.ConfirmDialog, "ask", classmethod(lambda cls, *a: True))
    dialog.delete_button.click()
    assert combo_items(window) == [None] and not window.composer.adapter.isEnabled()
    assert window.controller.adapter is None and window.controller.store.adapter(chat) is None
    dialog.close()


def test_reasoning_adapter_is_applied_without_a_reload_and_comes_back_on_the_next_load(window, loop, qtbot, tmp_path,
                                                                                     tiny_hf_dir, tiny_store):
    engine = window.service.worker.engine
    base_model = engine.model
    reason = window.composer.mode.findData("reason")
    assert not window.service.can_reason and not window.composer.mode.model().item(reason).isEnabled()
    assert "no reasoning adapter" in window.composer.mode.model().item(reason).toolTip()
    assert "no reasoning adapter" in window.status.text()
    window.open_adapters()
    dialog = window.adapters_dialog
    assert "Reasoning adapter: none" in dialog.header.text()
    dialog.select("concise")
    dialog.reason_button.click()
    assert run_until(loop, lambda: window.service.can_reason, 20)
    assert window.service.worker.engine is engine and engine.model.get_base_model() is base_model  # no reload
    assert run_until(loop, lambda: window.composer.mode.model().item(reason).isEnabled(), 20)  # after its signal
    assert load_settings(window.controller.store).reasoning_adapters == {TINY_ID: "concise"}
    assert "reasons with “concise”" in window.status.text() and "reasons for this model" in dialog.list.item(0).text()
    reply = send(window, loop, "What is 2+2?", mode="reason")
    assert reply.meta["adapter"] == "concise" and reply.meta["route"]["reason"] is True
    dialog.close()
    window.close()
    window.service.shutdown()
    again = open_window(qtbot, loop, tmp_path, fresh_engine(tiny_hf_dir), tiny_store)
    try:  # the next start: the chosen adapter is loaded onto the fresh model
        assert run_until(loop, lambda: again.service.can_reason, 20)
        assert again.service.adapter_names()["reasoning"] == "concise"
        assert again.composer.mode.model().item(reason).isEnabled()
    finally:
        again.service.shutdown()


def test_a_remembered_reasoning_adapter_that_is_gone_is_forgotten_with_a_message(qtbot, loop, tmp_path, tiny_hf_dir,
                                                                                tiny_store, library):
    store = ChatStore(tmp_path / "chats.db")
    save_settings(store, replace(load_settings(store), reasoning_adapters={TINY_ID: "vanished", "other": "kept"}))
    store.close()
    win = open_window(qtbot, loop, tmp_path, fresh_engine(tiny_hf_dir), tiny_store)
    try:
        assert run_until(loop, lambda: "reasons with its own adapter instead" in win.status.text(), 20)
        assert "no adapter 'vanished'" in win.status.text() and not win.service.can_reason
        assert load_settings(win.controller.store).reasoning_adapters == {"other": "kept"}
    finally:
        win.service.shutdown()


def test_the_wizards_use_it_sets_the_chat_or_the_reasoning_adapter(window, loop, library):
    pytest.importorskip("ui.train_wizard")
    window.open_train_wizard()
    assert window.train_wizard is not None and window.train_wizard.parent() is window
    window.train_wizard.close()
    window.use_adapter(library.get(TINY_ID, "poems"))
    assert window.controller.adapter == "poems" and window.composer.current_adapter() == "poems"
    window.use_adapter(library.get(TINY_ID, "concise"))
    assert run_until(loop, lambda: window.service.can_reason, 20)
    assert window.settings.reasoning_adapters == {TINY_ID: "concise"}


def test_renaming_or_deleting_the_reasoning_adapter_in_use_follows_through(window, loop, monkeypatch):
    window.choose_reasoning("concise")
    assert run_until(loop, lambda: window.service.can_reason, 20)
    window.open_adapters()
    dialog = window.adapters_dialog
    dialog.select("concise")
    monkeypatch.setattr(adapters_dialog.AdapterNameDialog, "ask", classmethod(lambda cls, p, c, **_: "concise-v2"))
    dialog.rename_button.click()
    assert run_until(loop, lambda: window.service.adapter_names()["reasoning"] == "concise-v2", 20)
    assert window.settings.reasoning_adapters == {TINY_ID: "concise-v2"}
    assert load_settings(window.controller.store).reasoning_adapters == {TINY_ID: "concise-v2"}
    monkeypatch.setattr(dialogs.ConfirmDialog, "ask", classmethod(lambda cls, *a: True))
    dialog.select("concise-v2")
    dialog.delete_button.click()
    assert run_until(loop, lambda: not window.service.can_reason, 20)  # no built-in one to fall back to
    assert window.settings.reasoning_adapters == {} and "no reasoning adapter" in window.status.text()
    reason = window.composer.mode.findData("reason")
    assert not window.composer.mode.model().item(reason).isEnabled()
    assert "Reasoning adapter: none" in dialog.header.text()
    dialog.close()
