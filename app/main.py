"""Composition root: `ponder` with a command runs the CLI; without one it opens the desktop window.

This is the only module that imports `ui`.
"""
from __future__ import annotations

import logging
import multiprocessing
import sys


def run_gui() -> int:
    import asyncio

    import qasync
    from PySide6.QtWidgets import QApplication

    from core import paths
    from core.config import EngineConfig
    from core.store import ChatStore
    from ui.main_window import MainWindow

    from .chat_controller import ChatController
    from .engine_service import EngineService

    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("Ponder")
    store = ChatStore(paths.data_dir() / "chats.db")
    service = EngineService(EngineConfig())
    controller = ChatController(service, store)
    window = MainWindow(service, controller)
    window.show()

    async def start():
        await service.start()
        closed = asyncio.Event()
        app.aboutToQuit.connect(closed.set)
        await closed.wait()

    try:
        qasync.run(start())
    except asyncio.CancelledError:
        pass
    finally:
        service.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    multiprocessing.freeze_support()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return run_gui()
    from .cli import run_cli

    return run_cli(argv)


if __name__ == "__main__":
    raise SystemExit(main())
