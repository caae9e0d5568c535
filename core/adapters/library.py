"""The adapter library: named LoRA adapters per base model, each a peft folder with a card (core.adapters.cards).

Layout: `paths.data_dir()/adapters/<model_id>/<name>/` holding adapter_config.json, adapter_model.safetensors
and the card `ponder_adapter.json`. The shipped reasoning adapter (`resources/components/<model_id>/reasoning`)
and the user's component folder (`<model folder>/components/reasoning`) are listed too, as builtin and
read-only. Every write goes through a temporary folder renamed into place; every delete stays strictly inside
the library root.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from core.adapters import lora as adapters
from core.adapters.cards import (
    ADAPTER_KINDS,
    AdapterCard,
    AdapterError,
    _card,
    _model,
    _object,
    _safe_meta,
    _valid,
    _write_meta,
    validate_adapter_name,
)
from core.storage import paths
from models.convert import AtomicDir
from models.errors import InvalidModelId
from models.registry import model_id_from_name, validate_model_id

ZIP_MAX_BYTES = 4 << 30
"""Largest total size a zip may expand to (a rank-64 LoRA of a 7B model is well under 1 GiB)."""
ZIP_MAX_MEMBERS = 256
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())


def _peft_files(folder: Path) -> list[Path]:
    """The regular files of an adapter folder worth keeping (no links, sub-folders or pickles)."""
    return [f for f in sorted(folder.iterdir())
            if f.is_file() and not f.is_symlink() and f.suffix.lower() not in PICKLE_SUFFIXES
            and not f.name.startswith(".")]


class AdapterLibrary:
    """Named adapters per base model under `root` (default `data_dir()/adapters`)."""

    def __init__(self, root: Path | None = None, store=None):
        self.root = Path(root) if root else paths.data_dir() / "adapters"
        self._store = store

    @property
    def store(self):
        if self._store is None:
            from core.storage.model_store import ModelStore

            self._store = ModelStore()
        return self._store

    # --- reading ----------------------------------------------------------------------------------------
    def _builtins(self, model_id: str) -> list[AdapterCard]:
        """The user's component folder (its card's name, else 'my-reasoning'), then the shipped one ('reasoning')."""
        cards: list[AdapterCard] = []
        user = self.store.root / model_id / "components" / "reasoning"
        shipped = paths.resource_dir() / "components" / model_id / "reasoning"
        for folder, default in ((user, "my-reasoning"), (shipped, "reasoning")):
            if not (folder / "adapter_model.safetensors").is_file():
                continue
            meta_name = _safe_meta(folder).get("name")
            name = meta_name if isinstance(meta_name, str) and _valid(meta_name) else default
            taken = {c.name for c in cards}
            if name in taken:
                name = next(n for n in (default, *(f"{default}-{i}" for i in range(2, 9))) if n not in taken)
            cards.append(_card(folder, model_id, name, builtin=True))
        return cards

    def _model_ids(self) -> list[str]:
        ids = set()
        if self.root.is_dir():
            ids.update(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("."))
        ids.update(m.id for m in self.store.list())
        out = []
        for model_id in sorted(ids):
            try:
                out.append(validate_model_id(model_id))
            except InvalidModelId:
                continue
        return out

    def _own(self, model_id: str) -> list[AdapterCard]:
        base = self.root / model_id
        if not base.is_dir():
            return []
        cards = []
        for folder in sorted(base.iterdir()):
            if folder.name.startswith(".") or folder.is_symlink() or not (folder / "adapter_config.json").is_file():
                continue
            try:
                cards.append(_card(folder, model_id, validate_adapter_name(folder.name)))
            except AdapterError:
                continue
        return cards

    def list(self, model_id: str | None = None, kind: str | None = None) -> list[AdapterCard]:
        """Adapters (library ones, then builtin ones) of one model, or of every installed model and every model
        the library has adapters for; optionally of one kind."""
        ids = [_model(model_id)] if model_id is not None else self._model_ids()
        cards = [c for m in ids for c in self._own(m) + self._builtins(m)]
        return [c for c in cards if kind is None or c.kind == kind]

    def get(self, model_id: str, name: str) -> AdapterCard:
        for card in self.list(model_id):
            if card.name == name:
                return card
        names = ", ".join(c.name for c in self.list(model_id)) or "none"
        raise AdapterError(f"There is no adapter '{name}' for {model_id} (adapters: {names}).")

    def _folder(self, model_id: str, name: str) -> Path:
        return self.root / _model(model_id) / validate_adapter_name(name)

    def _inside(self, target: Path) -> Path:
        """`target` if it lies strictly inside the library root (and is no link); the guard for every delete."""
        root = self.root.resolve()
        if target.is_symlink() or root not in target.resolve().parents:
            raise AdapterError(f"Refusing to touch {target}: it is not inside the adapter library {root}.")
        return target

    def _check_new_name(self, model_id: str, name: str, replace: bool = False) -> None:
        validate_adapter_name(name)
        if any(c.name == name for c in self._builtins(model_id)):
            raise AdapterError(f"'{name}' is the name of a built-in adapter of {model_id}; choose another name.")
        if not replace and self._folder(model_id, name).exists():
            raise AdapterError(f"An adapter named '{name}' already exists for {model_id}; choose another name.")

    def _check_base(self, meta: dict, model_id: str) -> None:
        """Refuse an adapter trained for another model, or on other weights of an installed one."""
        base = meta.get("base_model")
        if base and base != model_id:
            raise AdapterError(f"This adapter was trained for the model '{base}'; it cannot be used with "
                               f"'{model_id}'.")
        if self.store.is_installed(model_id) and meta.get("base_fingerprint"):
            mine = adapters.base_fingerprint(self.store.get(model_id).hf_dir)
            if meta["base_fingerprint"] != mine:
                raise AdapterError(f"This adapter was trained on other weights than the installed '{model_id}' "
                                   f"(fingerprint {meta['base_fingerprint']}, installed {mine}).")

    # --- writing ----------------------------------------------------------------------------------------
    def add_from_folder(self, folder: Path, model_id: str, name: str, *, kind: str, data_hash: str | None = None,
                        recipe: dict | None = None, metrics: dict | None = None,
                        replace: bool = True) -> AdapterCard:
        """Copy a saved adapter into the library as `name` (atomically, replacing one of that name unless
        `replace` is False) with its card merged over the folder's own ponder_adapter.json."""
        if kind not in ADAPTER_KINDS:
            raise AdapterError(f"kind must be one of {', '.join(ADAPTER_KINDS)}, not {kind!r}")
        folder = Path(folder)
        self._check_new_name(model_id, name, replace)
        try:
            adapters.check_adapter(folder)
            meta = adapters.adapter_meta(folder)
        except ValueError as err:
            raise AdapterError(f"The adapter in {folder} cannot be used: {err}.") from None
        self._check_base(meta, model_id)
        if not meta.get("base_fingerprint") and self.store.is_installed(model_id):
            meta["base_fingerprint"] = adapters.base_fingerprint(self.store.get(model_id).hf_dir)
        card = {**meta, "name": name, "kind": kind, "base_model": model_id, "created": _now(),
                "base_fingerprint": meta.get("base_fingerprint"),
                "data_hash": data_hash if data_hash is not None else meta.get("data_hash"),
                "recipe": _object(recipe if recipe is not None else meta.get("recipe")),
                "metrics": _object(metrics if metrics is not None else meta.get("metrics"))}
        made = _card(folder, model_id, name, meta=card)  # before the copy: a card that cannot be read adds nothing
        final = self._folder(model_id, name)
        with AtomicDir(final) as tmp:
            for f in _peft_files(folder):
                shutil.copyfile(f, tmp / f.name)
            _write_meta(tmp, card)
        return dataclasses.replace(made, folder=final)

    def import_path(self, path: Path, model_id: str | None = None, name: str | None = None) -> AdapterCard:
        """Import a folder or .zip holding one peft adapter; its card says the base model unless `model_id`
        does. Refuses damaged adapters, other base models and other base weights; never overwrites."""
        path = Path(path).expanduser()
        if not path.exists():
            raise AdapterError(f"{path} does not exist.")
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=self.root)) if path.is_file() else None
        try:
            folder = _unzip(path, staging) if staging is not None else path
            folder = _adapter_folder(folder, path.name)
            try:
                adapters.check_adapter(folder)
                meta = adapters.adapter_meta(folder)
            except ValueError as err:
                raise AdapterError(f"The adapter in {path.name} cannot be imported: {err}.") from None
            model_id = model_id or meta.get("base_model")
            if not model_id:
                raise AdapterError(f"{path.name} does not say which model it was trained for; give the model id.")
            _model(model_id)
            self._check_base(meta, model_id)
            if name is None:
                own = meta.get("name")
                stem = path.name[:-4] if path.suffix.lower() == ".zip" else path.name
                name = own if isinstance(own, str) and _valid(own) else model_id_from_name(stem)
            kind = meta.get("kind") if meta.get("kind") in ADAPTER_KINDS else "skill"
            self._check_new_name(model_id, name)
            return self.add_from_folder(folder, model_id, name, kind=kind, replace=False)
        finally:
            if staging is not None:
                shutil.rmtree(self._inside(staging), ignore_errors=True)

    def export(self, model_id: str, name: str, dest: Path) -> Path:
        """Write the adapter to `dest`: a zip when it ends in .zip, else a folder (inside `dest` when that is
        an existing folder). Never overwrites; the card goes along in ponder_adapter.json."""
        card = self.get(model_id, name)
        dest = Path(dest).expanduser()
        if dest.suffix.lower() != ".zip" and dest.is_dir():
            dest = dest / name
        if dest.exists():
            raise AdapterError(f"{dest} already exists; choose another destination.")
        meta = {**_safe_meta(card.folder), **card.meta()}
        files = [f for f in _peft_files(card.folder) if f.name != adapters.META_FILE]
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
        try:
            if dest.suffix.lower() == ".zip":
                with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
                    for f in files:
                        zf.write(f, f"{name}/{f.name}")
                    zf.writestr(f"{name}/{adapters.META_FILE}", json.dumps(meta, indent=2))
            else:
                tmp.mkdir()
                for f in files:
                    shutil.copyfile(f, tmp / f.name)
                _write_meta(tmp, meta)
            os.replace(tmp, dest)
        finally:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            elif tmp.exists():
                tmp.unlink()
        return dest

    def _own_card(self, model_id: str, name: str) -> AdapterCard:
        card = self.get(model_id, name)
        if card.builtin:
            raise AdapterError(f"'{name}' is a built-in adapter of {model_id}: it cannot be changed or removed.")
        return card

    def rename(self, model_id: str, old: str, new: str) -> AdapterCard:
        card = self._own_card(model_id, old)
        if new == old:
            return card
        self._check_new_name(model_id, new)
        target = self._folder(model_id, new)
        os.rename(self._inside(card.folder), target)
        meta = {**_safe_meta(target), **card.meta(), "name": new}
        _write_meta(target, meta)
        return _card(target, model_id, new, meta=meta)

    def remove(self, model_id: str, name: str) -> None:
        card = self._own_card(model_id, name)
        folder = self._inside(card.folder)
        trash = folder.parent / f".{folder.name}.removing-{os.getpid()}"
        os.rename(folder, trash)  # gone from the listing at once, even if the delete below is interrupted
        shutil.rmtree(self._inside(trash))


def _adapter_folder(folder: Path, shown: str | None = None) -> Path:
    """The folder holding adapter_config.json: `folder` itself or its one sub-folder (a zip's top folder);
    `shown` names it in the error (the user's zip, not the folder it was extracted to)."""
    if (folder / "adapter_config.json").is_file():
        return folder
    subs = [d for d in folder.iterdir() if d.is_dir() and not d.is_symlink() and not d.name.startswith(("_", "."))]
    if len(subs) == 1 and (subs[0] / "adapter_config.json").is_file():
        return subs[0]
    raise AdapterError(f"{shown or folder.name} holds no adapter (no adapter_config.json at its top or in its one "
                       "top folder).")


def _unzip(path: Path, into: Path) -> Path:
    """Extract a zip safely: plain files with relative paths, at most one folder deep, inside `into`, within
    the size limits; any absolute, `..`, drive or link entry refuses the whole zip."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise AdapterError(f"{path.name} is not a readable zip file ({err}).") from None
    with zf:
        members = zf.infolist()
        if len(members) > ZIP_MAX_MEMBERS:
            raise AdapterError(f"{path.name} holds {len(members)} files; an adapter has a handful.")
        if sum(m.file_size for m in members) > ZIP_MAX_BYTES:
            raise AdapterError(f"{path.name} would expand to more than {ZIP_MAX_BYTES >> 30} GiB.")
        for m in members:
            parts = PurePosixPath(m.filename.replace("\\", "/")).parts
            is_link = (m.external_attr >> 16) & 0o170000 == 0o120000
            if m.filename.startswith(("/", "\\")) or ".." in parts or any(":" in p for p in parts) or is_link:
                raise AdapterError(f"{path.name} has an unsafe entry '{m.filename}'; nothing was imported.")
        try:
            for m in members:
                _extract(zf, m, path, into)
        except (zipfile.BadZipFile, RuntimeError, NotImplementedError, EOFError, zlib.error) as err:
            # a bad CRC or truncated member, an encrypted zip, a compression method Python cannot read
            raise AdapterError(f"{path.name} could not be read ({err}); nothing was imported.") from None
    return into


def _extract(zf: zipfile.ZipFile, m: zipfile.ZipInfo, path: Path, into: Path) -> None:
    parts = PurePosixPath(m.filename.replace("\\", "/")).parts
    if not parts or len(parts) > 2 or parts[0] == "__MACOSX":  # an adapter is flat, at most in one top folder
        return
    target = into.joinpath(*parts)
    if m.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with zf.open(m) as src, open(target, "wb") as dst:
        copied = 0
        while chunk := src.read(1 << 20):
            copied += len(chunk)
            if copied > m.file_size:  # the header lied about the size (a zip bomb)
                raise AdapterError(f"{path.name} is damaged: '{m.filename}' is larger than it says.")
            dst.write(chunk)
