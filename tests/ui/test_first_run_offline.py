"""First run with no model and no way to download it: the window offers a local GGUF file, once."""
from app.chat_controller import ChatController
from app.engine_service import EngineService
from app.model_service import ModelService
from core.config import EngineConfig
from core.storage.chats import ChatStore
from ui import dialogs
from ui.main_window import MainWindow


def test_a_failed_first_run_offers_a_gguf_file_once(qtbot, loop, store, tmp_path, monkeypatch):
    asked, picked = [], []
    monkeypatch.setattr(dialogs.ConfirmDialog, "ask", classmethod(lambda cls, p, title, text: asked.append(text) or True))
    monkeypatch.setattr(dialogs.GgufFileDialog, "ask", classmethod(lambda cls, p: picked.append(1)))
    service = EngineService(EngineConfig(model_id="qwen2.5-7b-instruct"), store=store)  # not installed, no packages
    win = MainWindow(service, ChatController(service, ChatStore(tmp_path / "chats.db")), ModelService(store=store))
    qtbot.addWidget(win)
    assert loop.run_until_complete(service.start()) is False
    assert len(asked) == 1 and "GGUF" in asked[0] and picked == [1]  # the Models dialog opened on "Import GGUF"
    assert win.model_manager.isVisible()
    win.on_failed("again")
    assert len(asked) == 1
    service.shutdown()
