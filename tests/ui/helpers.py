"""The window on a scripted engine and a real chat store: building it, asking, waiting."""
from app.chat_controller import ChatController
from app.engine_service import EngineService
from core.storage.chats import ChatStore
from tests.qt_helpers import run_until
from ui.main_window import MainWindow


def make_window(qtbot, loop, tmp_path, engine, db: str = "chats.db"):
    service = EngineService(engine=engine)
    controller = ChatController(service, ChatStore(tmp_path / db, flush_s=0.01))
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


def wait_idle(win, loop, timeout=30):
    assert run_until(loop, lambda: win.service.busy, 10) or not win.service.busy
    assert run_until(loop, lambda: not win.service.busy, timeout)
    win.render()
