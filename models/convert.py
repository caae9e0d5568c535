"""Turning model sources into the store's one format: an HF folder of bf16 safetensors plus tokenizer.

Sources: a Qwen2 GGUF file (dequantized once through transformers' `gguf_file=`), or an HF folder.
Every write goes to a temporary sibling folder that is renamed into place only when complete; an old folder
is renamed aside first and removed last, never deleted before its replacement is in place.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from .errors import CorruptModelFile, DiskFull, MissingTokenizer, ModelError, UnsafeWeights, UnsupportedArchitecture
from .gguf_file import DISK_FULL_ERRNOS, inspect_gguf, is_disk_full, require_free_space
from .gguf_header import check_weights_cover_model
from .registry import spec_from_config

Progress = Callable[[str, int, int], None]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "generation_config.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
QWEN2_TYPES = ("qwen2",)


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


BACKUP_RE = re.compile(r"\.(?P<name>.+)\.old-(?P<pid>\d+)")
TEMP_RE = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)")
OS_ERROR = re.compile(r"\(os error (\d+)\)")
SHARD_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\.safetensors")
"""A shard an index may name: a plain file name in the model folder (no folder, no '..', no drive)."""
WINDOWS_DISK_FULL = {39, 112}  # ERROR_HANDLE_DISK_FULL, ERROR_DISK_FULL


def disk_full(err: BaseException) -> bool:
    """A full disk: an OSError, or a native library's write error carrying the code (safetensors raises
    "Error while serializing: I/O error: No space left on device (os error 28)", not an OSError)."""
    if isinstance(err, OSError):
        return is_disk_full(err)
    m = OS_ERROR.search(str(err)) if isinstance(err, Exception) else None
    return bool(m) and int(m[1]) in (WINDOWS_DISK_FULL if sys.platform == "win32" else DISK_FULL_ERRNOS)


def _pid_alive(pid: int) -> bool:
    import psutil  # not os.kill(pid, 0): on Windows that terminates the process

    return pid != os.getpid() and psutil.pid_exists(pid)


def recover_backups(parent: Path, name: str | None = None) -> list[Path]:
    """After a crash mid-replacement: move each `.<name>.old-<pid>` backup in `parent` (only `name`'s, if given)
    back to `<name>` when `<name>` is missing, else delete it. A live process's backups are left alone.
    Returns the folders restored."""
    restored = []
    parent = Path(parent)
    if not parent.is_dir():
        return restored
    for backup in parent.iterdir():
        m = BACKUP_RE.fullmatch(backup.name)
        if (not m or (name is not None and m["name"] != name) or backup.is_symlink() or not backup.is_dir()
                or _pid_alive(int(m["pid"]))):
            continue
        target = parent / m["name"]
        if target.exists():
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(backup, target)
            restored.append(target)
    return restored


def remove_stale_temps(parent: Path, pattern: re.Pattern = TEMP_RE, name: str | None = None) -> list[Path]:
    """Delete each folder directly in `parent` whose name fits `pattern` (with a `pid` group; `name`'s only, if
    given) and whose process is gone: what a killed write left half done. A live process's folders (this one's
    included: another thread may be writing), links and files are left alone. Returns the folders removed."""
    removed = []
    parent = Path(parent)
    if not parent.is_dir() or parent.is_symlink():
        return removed
    for entry in parent.iterdir():
        m = pattern.fullmatch(entry.name)
        if not m or (name is not None and m["name"] != name) or entry.is_symlink() or not entry.is_dir():
            continue
        pid = int(m["pid"])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        shutil.rmtree(entry, ignore_errors=True)  # never follows a link inside the folder
        removed.append(entry)
    return removed


class AtomicDir:
    """Context manager yielding a temporary folder that replaces `final` on success and vanishes on failure.

    Replacing never deletes first: the old folder is renamed to a backup, the new one renamed into place, then
    the backup is removed. A crash between the renames leaves the backup, which `recover_backups` puts back; a
    write killed midway leaves the temporary folder, which `remove_stale_temps` deletes.
    """

    def __init__(self, final: Path):
        self.final = Path(final)
        self.tmp = self.final.parent / f".{self.final.name}.tmp-{os.getpid()}"
        self.backup = self.final.parent / f".{self.final.name}.old-{os.getpid()}"

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        recover_backups(self.final.parent, self.final.name)
        remove_stale_temps(self.final.parent, name=self.final.name)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()
        return self.tmp

    def _swap(self) -> None:
        shutil.rmtree(self.backup, ignore_errors=True)
        had_old = self.final.exists()
        if had_old:
            os.replace(self.final, self.backup)
        try:
            os.replace(self.tmp, self.final)
        except BaseException:
            if had_old and not self.final.exists():
                os.replace(self.backup, self.final)
            raise
        if had_old:
            shutil.rmtree(self.backup, ignore_errors=True)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self._swap()
                return False
            except OSError as err:
                shutil.rmtree(self.tmp, ignore_errors=True)
                if is_disk_full(err):
                    raise DiskFull(f"Ran out of disk space writing {self.final}.") from err
                raise
        shutil.rmtree(self.tmp, ignore_errors=True)
        if exc is not None and disk_full(exc):
            raise DiskFull(f"Ran out of disk space while writing {self.final}; nothing was kept.") from exc
        return False


def check_hf_folder(folder: Path) -> dict:
    """Validate an HF model folder as a safe, complete Qwen2 checkpoint; return its config dict."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CorruptModelFile(f"{folder} has no config.json: it is not a Hugging Face model folder.")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as err:
        raise CorruptModelFile(f"{cfg_path} is not valid JSON ({err}).") from err
    if not isinstance(config, dict):
        raise CorruptModelFile(f"{cfg_path} is not a model configuration (a JSON object).")
    model_type = config.get("model_type")
    if model_type not in QWEN2_TYPES:
        raise UnsupportedArchitecture(f"{folder.name} is a '{model_type}' model; Ponder runs Qwen2 / Qwen2.5 only.")
    if not ((folder / "tokenizer.json").is_file() or
            ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file())):
        raise MissingTokenizer(f"{folder} has no tokenizer (tokenizer.json, or vocab.json + merges.txt).")
    spec_from_config(folder.name, config)  # its sizes are positive whole numbers
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        if any(p.suffix in PICKLE_SUFFIXES for p in folder.iterdir()):
            raise UnsafeWeights(f"{folder} holds only pickled weights (.bin/.pt); Ponder loads safetensors only.")
        raise CorruptModelFile(f"{folder} has no *.safetensors weight files.")
    for w in weights:  # a named pipe or device would block or never end
        if not w.is_file():
            raise CorruptModelFile(f"{w} is not a regular file.")
    for index in sorted(folder.glob("*.safetensors.index.json")):
        _check_index(index)
    from safetensors import safe_open

    for w in weights:
        try:
            with safe_open(str(w), framework="pt") as f:
                f.keys()
        except Exception as err:  # safetensors raises its own error types
            raise CorruptModelFile(f"{w.name} is not a readable safetensors file ({err}).") from err
    return config


def _check_index(index: Path) -> None:
    """A shard index names only shards that are files in its own folder: never a path elsewhere (transformers
    joins it to the folder), never a shard an interrupted download left missing."""
    try:
        if not index.is_file():
            raise ValueError("not a regular file")
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = set(weight_map.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CorruptModelFile(f"{index} is not a safetensors index ({err}).") from err
    for shard in sorted(shards, key=str):
        if not (isinstance(shard, str) and SHARD_NAME.fullmatch(shard)):
            raise CorruptModelFile(f"{index.name} names the shard {shard!r}: only files in its own folder are loaded.")
        if not (index.parent / shard).is_file():
            raise CorruptModelFile(f"{index.name} names the shard {shard}, which is missing (an interrupted download?).")


def import_hf_folder(src: Path, dest: Path, progress: Progress = _no_progress) -> Path:
    """Copy a validated Qwen2 HF folder (config, tokenizer, safetensors) into the store at `dest`."""
    src = Path(src)
    check_hf_folder(src)
    names = ["config.json"] + [n for n in TOKENIZER_FILES if (src / n).is_file()]
    names += [p.name for p in sorted(src.glob("*.safetensors"))] + [p.name for p in src.glob("*.safetensors.index.json")]
    total = sum((src / n).stat().st_size for n in names)
    require_free_space(Path(dest).parent, total, f"importing {src.name}")
    done = 0
    try:
        with AtomicDir(dest) as tmp:
            for n in names:
                shutil.copyfile(src / n, tmp / n)
                done += (src / n).stat().st_size
                progress("copy", done, total)
            check_hf_folder(tmp)
    except OSError as err:
        if is_disk_full(err):
            raise DiskFull(f"Not enough disk space to import {src.name} ({total:,} bytes).") from err
        raise
    return dest


def convert_gguf(gguf_path: Path, dest: Path, progress: Progress = _no_progress) -> Path:
    """Dequantize a Qwen2 GGUF once into a bf16 safetensors HF folder at `dest`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    header = inspect_gguf(gguf_path)["header"]
    progress("convert", 0, 3)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, trust_remote_code=False)
    except Exception as err:
        raise MissingTokenizer(f"{gguf_path.name} carries no usable tokenizer ({err}).") from err
    params = check_weights_cover_model(header, gguf_path.name)  # before transformers allocates what it declares
    require_free_space(Path(dest).parent, params * 2, f"converting {gguf_path.name}")  # bf16
    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32, trust_remote_code=False
        )
    except ModelError:
        raise
    except Exception as err:
        raise CorruptModelFile(f"Could not read the weights of {gguf_path.name} ({err}).") from err
    progress("convert", 1, 3)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    config = model.config
    del model
    config.quantization_config = None
    del config.quantization_config
    config.dtype = torch.bfloat16
    with AtomicDir(dest) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del state
        progress("convert", 2, 3)
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        check_hf_folder(tmp)
    progress("convert", 3, 3)
    return dest
