"""The model manager on a real model store (tiny model files), offscreen: import, remove, offline download,
bad files, and switching the running model through the EngineService."""
import pytest

from app.engine_service import EngineService
from app.model_service import ModelService
from core.config import EngineConfig
from tests.conftest import TINY_ID
from tests.qt_helpers import run_until, shutdown_returns_while_held
from ui import dialogs
from ui.model_manager import ModelManager


@pytest.fixture
def manager(qtbot, loop, store):
    service = ModelService(store, active_id="")
    dialog = ModelManager(service)
    qtbot.addWidget(dialog)
    yield dialog
    service.shutdown()


def names(dialog):
    return {dialog.table.item(i, 0).text(): dialog.table.item(i, 1).text() for i in range(dialog.table.rowCount())}


def test_lists_shipped_models_with_memory_estimates(manager):
    rows = {r.id: r for r in manager.rows}
    embedded = rows["qwen2.5-coder-0.5b-instruct"]
    assert embedded.installable and not embedded.installed
    assert 0.5 * 2**30 < embedded.memory_bytes < 1.5 * 2**30
    assert rows["qwen2.5-coder-1.5b-instruct"].memory_bytes > embedded.memory_bytes
    manager.select("qwen2.5-coder-0.5b-instruct")
    assert manager.install_button.isEnabled() and not manager.use_button.isEnabled()
    assert "GB" in manager.table.item(0, 4).text()
    assert manager.table.item(0, 2).text() == embedded.weights != ""  # which weights the app runs it on


def test_import_folder_use_and_remove(manager, loop, tiny_hf_dir, monkeypatch):
    monkeypatch.setattr(dialogs.HfFolderDialog, "ask", classmethod(lambda cls, p: str(tiny_hf_dir)))
    manager.folder_button.click()
    assert run_until(loop, lambda: not manager.service.busy and TINY_ID in {r.id for r in manager.rows})
    assert "✓ Imported" in manager.message.text()
    row = next(r for r in manager.rows if r.id == TINY_ID)
    assert row.installed and row.disk_bytes > 0 and row.source.startswith("folder:")
    assert row.weights.endswith("(prepared at first use)") and "int4" in row.weights_detail
    manager.select(TINY_ID)
    used = []
    manager.useRequested.connect(used.append)
    manager.use_button.click()
    assert used == [TINY_ID]
    monkeypatch.setattr(dialogs.ConfirmDialog, "ask", classmethod(lambda cls, p, t, x: True))
    manager.select(TINY_ID)
    manager.remove_button.click()
    assert run_until(loop, lambda: not manager.service.busy and TINY_ID not in {r.id for r in manager.rows})
    assert not (manager.service.store.folder(TINY_ID)).exists()


def test_the_model_in_use_cannot_be_removed(manager, loop, tiny_hf_dir):
    manager.service.store.import_hf(tiny_hf_dir, TINY_ID)
    manager.service.active_id = TINY_ID
    manager.refresh()
    manager.select(TINY_ID)
    assert names(manager)["tiny-qwen2"] == "In use" and not manager.remove_button.isEnabled()
    assert loop.run_until_complete(manager.service.remove(TINY_ID)) is False
    assert "in use" in manager.message.text() and manager.service.store.is_installed(TINY_ID)


def test_offline_download_and_bad_files_give_clear_messages(manager, loop, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(dialogs.RepoDialog, "ask", classmethod(lambda cls, p: "Qwen/Qwen2.5-0.5B-Instruct"))
    manager.download_button.click()
    assert run_until(loop, lambda: "⚠" in manager.message.text())
    assert "offline" in manager.message.text()
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(dialogs.GgufFileDialog, "ask", classmethod(lambda cls, p: str(bad)))
    manager.message.setText("")
    manager.gguf_button.click()
    assert run_until(loop, lambda: "⚠" in manager.message.text() and not manager.service.busy)
    assert "broken" not in {r.id for r in manager.rows}
    assert loop.run_until_complete(manager.service.download("not a repo")) is False
    assert "owner/name" in manager.message.text()


def test_switching_the_running_model(loop, tiny_store):
    service = EngineService(EngineConfig(model_id="qwen2.5-7b-instruct", precision="bf16", kv="bf16"), store=tiny_store)
    states = []
    service.stateChanged.connect(states.append)
    assert loop.run_until_complete(service.start()) is False  # not installed: an error state, not a crash
    assert loop.run_until_complete(service.switch_model(TINY_ID)) is True
    assert service.ready and service.model_name == TINY_ID and states[-1] == "ready"
    assert loop.run_until_complete(service.set_threads(1)) == 1
    import torch

    # OpenMP thread counts are per thread: what matters is the engine's worker thread
    assert loop.run_until_complete(loop.run_in_executor(service._executor, torch.get_num_threads)) == 1
    loop.run_until_complete(service.set_threads(None))
    service.shutdown()


def test_no_header_or_value_is_clipped(manager, qtbot):
    """Every column is at least as wide as its header and its values, and rows are as tall as their text (the
    dialog clipped "Memory to run" and the two-line "data packages (PyPI)")."""
    manager.show()
    qtbot.waitExposed(manager)
    table, metrics = manager.table, manager.table.fontMetrics()
    header = table.horizontalHeader()
    for j in range(1, table.columnCount()):  # column 0 stretches to the rest of the width
        texts = [table.horizontalHeaderItem(j).text()] + [table.item(i, j).text() for i in range(table.rowCount())]
        assert header.sectionSize(j) >= max(metrics.horizontalAdvance(t) for t in texts), texts
    assert not table.verticalHeader().isVisible()
    for i in range(table.rowCount()):
        assert table.rowHeight(i) >= metrics.height()


def held_import(root):
    """A real model store whose imports hold at their first progress report (the first file copied into the
    temporary folder, as a large file's copy would) until `released`; the report then reaches the service."""
    import threading

    from core.storage.model_store import ModelStore

    reporting, released = threading.Event(), threading.Event()

    class HeldStore(ModelStore):
        def import_hf(self, folder, model_id=None, progress=None, source=None):
            def held(stage, done, total):
                if not reporting.is_set():
                    reporting.set()
                    released.wait(60)
                progress(stage, done, total)

            return super().import_hf(folder, model_id, held, source)

    return HeldStore(root), reporting, released


def test_closing_the_window_while_a_model_imports_gives_the_import_up(qtbot, loop, ponder_home, tiny_hf_dir,
                                                                      tmp_path, monkeypatch):
    """Closing the window during a Tools ▸ Models job used to let it run to its end (and the app wait for it): now
    it stops at its next progress report, installs nothing, leaves no folder (whole or temporary) and says nothing."""
    from app.chat_controller import ChatController
    from core.storage.chats import ChatStore
    from tests.ui.scripted_engine import ScriptedEngine
    from ui.main_window import MainWindow

    store, reporting, released = held_import(tmp_path / "models")
    models = ModelService(store, active_id="")
    said = []
    models.failed.connect(said.append)
    models.done.connect(said.append)
    engine = EngineService(engine=ScriptedEngine())
    win = MainWindow(engine, ChatController(engine, ChatStore(tmp_path / "c.db", flush_s=0.01)), models)
    qtbot.addWidget(win)
    loop.run_until_complete(engine.start())
    win.open_models()
    monkeypatch.setattr(dialogs.HfFolderDialog, "ask", classmethod(lambda cls, p: str(tiny_hf_dir)))
    try:
        win.model_manager.folder_button.click()
        assert run_until(loop, reporting.is_set, 30)
        win.close()
    finally:
        released.set()
    assert run_until(loop, lambda: not models.busy, 60)
    assert said == [] and not store.is_installed(TINY_ID) and list(store.root.iterdir()) == []
    assert models.shutdown(timeout=60) is True
    engine.shutdown()


def test_model_service_shutdown_returns_while_a_job_is_inside_a_step(loop, tmp_path, tiny_hf_dir):
    """ModelService.shutdown used to join its worker until the job had finished; it now waits at most its timeout,
    says the worker is still busy, and the job ends at its next progress report without installing anything."""
    store, reporting, released = held_import(tmp_path / "models")
    service = ModelService(store)
    shutdown_returns_while_held(loop, service, loop.create_task(service.import_folder(tiny_hf_dir)), reporting,
                                released)
    assert not store.is_installed(TINY_ID) and list(store.root.iterdir()) == []
    assert loop.run_until_complete(service.import_folder(tiny_hf_dir)) is False  # shut down: no new job starts


def test_leaving_gives_a_held_load_and_a_held_model_job_one_wait_together(loop, tmp_path, tiny_store, tiny_hf_dir):
    """app.main's shutdown used to wait for the model job without limit after the engine's own wait: now both are
    given up first and waited for together at most CLOSE_WAIT_S (False: Ponder then leaves with os._exit)."""
    import time

    from app.main import stop_workers
    from tests.ui.test_edge_cases import held_load

    engine, measuring, measured = held_load(tiny_store)
    store, reporting, released = held_import(tmp_path / "models")
    models = ModelService(store)
    starting = loop.create_task(engine.start())
    importing = loop.create_task(models.import_folder(tiny_hf_dir))
    try:
        assert run_until(loop, lambda: measuring.is_set() and reporting.is_set(), 30)
        began = time.monotonic()
        assert stop_workers([engine, models], wait_s=1.0) is False
        assert time.monotonic() - began < 2.0 and not (measured.is_set() or released.is_set())  # one wait, not two
    finally:
        measured.set()
        released.set()
    assert run_until(loop, lambda: starting.done() and importing.done(), 60)
    assert starting.result() is False and importing.result() is False
    assert stop_workers([engine, models], wait_s=60) is True
    assert engine.worker.engine is None and not store.is_installed(TINY_ID) and list(store.root.iterdir()) == []


def test_closing_the_models_dialog_leaves_its_job_running(manager, loop, tiny_hf_dir, monkeypatch):
    """The dialog's own close (Esc, its title bar's ×) only hides it: the import goes on and installs the model."""
    store, reporting, released = held_import(manager.service.store.root)
    manager.service._store = store
    monkeypatch.setattr(dialogs.HfFolderDialog, "ask", classmethod(lambda cls, p: str(tiny_hf_dir)))
    manager.show()
    try:
        manager.folder_button.click()
        assert run_until(loop, reporting.is_set, 30)
        manager.reject()
        assert not manager.isVisible()
    finally:
        released.set()
    assert run_until(loop, lambda: not manager.service.busy, 60)
    assert store.is_installed(TINY_ID) and "✓ Imported" in manager.message.text()


def test_cancel_in_the_dialog_gives_the_import_up_and_keeps_nothing(qtbot, loop, tmp_path, tiny_hf_dir, monkeypatch):
    """The Models dialog's Cancel (shown only while a job runs) stops it at its next progress report: nothing
    installed, no folder left, and the dialog says so and is ready for the next job."""
    store, reporting, released = held_import(tmp_path / "models")
    service = ModelService(store, active_id="")
    dialog = ModelManager(service)
    qtbot.addWidget(dialog)
    dialog.show()
    assert not dialog.cancel_button.isVisible()
    monkeypatch.setattr(dialogs.HfFolderDialog, "ask", classmethod(lambda cls, p: str(tiny_hf_dir)))
    try:
        dialog.folder_button.click()
        assert run_until(loop, reporting.is_set, 30)
        assert run_until(loop, dialog.cancel_button.isVisible, 30) and dialog.cancel_button.isEnabled()
        dialog.cancel_button.click()
        assert "Cancelling" in dialog.message.text() and not dialog.cancel_button.isEnabled()
    finally:
        released.set()
    assert run_until(loop, lambda: not service.busy, 60)
    assert dialog.message.text() == "Cancelled: nothing was kept."
    assert not dialog.cancel_button.isVisible() and dialog.folder_button.isEnabled()
    assert not store.is_installed(TINY_ID) and list(store.root.iterdir()) == []
    assert service.shutdown(timeout=60) is True
