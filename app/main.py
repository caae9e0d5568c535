"""Composition root: `ponder` with a command runs the CLI; without one it opens the desktop window.

This is the only module that imports `ui`.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time
import warnings

NOISE = (
    # torch.utils.cpp_extension, imported by transformers and optimum-quanto, logs this on a CUDA build of torch
    # on a computer without a GPU but with a CUDA toolkit (or CUDA_HOME). Ponder runs on the CPU and builds no
    # extensions, so the line tells the user nothing.
    ("torch.utils.cpp_extension", "No CUDA runtime is found"),
)
CLOSE_WAIT_S = 3.0
"""How long closing waits for a given-up model load and model operation (install, download, import) to reach their
next step before leaving them behind."""
QUIET_WARNINGS = (
    # transformers' deprecation notice, raised by peft when the reasoning adapter is attached.
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
)


def quiet_stderr() -> None:
    """Drop the libraries' messages that say nothing to a Ponder user (each one named above), before any of
    those libraries is imported; everything else still reaches stderr."""
    for logger, prefix in NOISE:
        logging.getLogger(logger).addFilter(lambda record, prefix=prefix: not record.getMessage().startswith(prefix))
    for category, message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def choose_for_this_machine():
    """The first launch's model (core.machine_fit: memory and a decode-speed measurement), on the engine thread."""
    from core.machine_fit import choose_model

    return choose_model()


def stop_workers(services, wait_s: float = CLOSE_WAIT_S) -> bool:
    """Shut the engine and the model manager down (anything with `shutdown(timeout)`): each gives up its job at
    its next step, all are told before any is waited for, and together they are waited for at most `wait_s`
    seconds. True when every worker has ended; False when one is still inside a step (left to stop there alone)."""
    deadline = time.monotonic() + wait_s
    for s in services:
        s.shutdown(timeout=0)
    return all([s.shutdown(timeout=max(0.0, deadline - time.monotonic())) for s in services])  # each one waited for


def run_gui() -> int:
    import asyncio

    import qasync
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication, QMessageBox

    from core.config import EngineConfig
    from core.storage import paths
    from core.storage.chat_schema import ChatDatabaseError
    from core.storage.chats import ChatStore
    from ui.main_window import MainWindow
    from ui.theme import apply_theme, follow_system

    from .chat_controller import ChatController
    from .engine_service import EngineService
    from .model_service import ModelService
    from .settings import SETTINGS_KEY, load_settings

    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("Ponder")
    app.setDesktopFileName("ponder")  # matches packaging/ponder.desktop (taskbar grouping, icon on Wayland)
    app.setWindowIcon(QIcon(str(paths.resource_dir() / "icons" / "ponder.png")))
    try:
        store = ChatStore(paths.data_dir() / "chats.db")
    except ChatDatabaseError as err:  # left untouched: newer, locked by another Ponder, disk full, read-only
        print(f"ponder: {err}", file=sys.stderr)
        QMessageBox.critical(None, "Ponder", str(err))
        return 1
    settings = load_settings(store)
    apply_theme(settings.theme, app)
    follow_system(app)
    first_launch = "model_id" not in (store.get_setting(SETTINGS_KEY) or {})
    service = EngineService(EngineConfig(model_id=settings.model_id, threads=settings.threads or None,
                                         decode=settings.decode,
                                         reasoning_adapter=settings.reasoning_adapters.get(settings.model_id)),
                            choose=choose_for_this_machine if first_launch else None)
    controller = ChatController(service, store)
    window = MainWindow(service, controller, ModelService(active_id=settings.model_id))
    window.show()

    async def start():
        closed = asyncio.Event()
        app.aboutToQuit.connect(closed.set)
        loading = asyncio.ensure_future(service.start())  # closing the window does not wait for the load
        await closed.wait()
        loading.cancel()

    try:
        qasync.run(start())
    except asyncio.CancelledError:
        pass
    finally:
        stopped = stop_workers([service, window.model_service])  # a model load, install or download is given up
    if not stopped:  # one is still inside a step (reading weights, copying a file): the interpreter must not be torn
        logging.shutdown()  # down under it (torch aborts the process), so Ponder ends here; what it wrote is whole
        sys.stdout.flush()  # (prepared weights and installed models are renamed into place only once complete)
        sys.stderr.flush()
        os._exit(0)
    return 0


def main(argv: list[str] | None = None) -> int:
    multiprocessing.freeze_support()
    quiet_stderr()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return run_gui()
    if argv == ["--self-test"]:  # before the CLI parser: it must work even when a command's imports do not
        from .self_test import main as self_test

        return self_test()
    try:
        from .cli import run_cli

        return run_cli(argv)
    except KeyboardInterrupt:  # Ctrl+C while a command imports, loads or runs: no traceback
        print("ponder: interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
