"""GGUF files: assembling the embedded model from its data wheels, checksums, and header checks.

Knows the byte layout of parts and the GGUF header; knows nothing of torch or transformers.
"""
from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import ChecksumMismatch, CorruptModelFile, DiskFull, ModelNotInstalled, UnsupportedArchitecture
from .gguf_header import read_header

Progress = Callable[[str, int, int], None]
"""progress(stage, done, total): called as bytes or steps complete."""

CHUNK = 8 * 1024 * 1024
SUPPORTED_ARCHITECTURES = ("qwen2",)
DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
DISK_RESERVE = 256 * 2**20
"""Space a write leaves free on its disk: a model never fills it to the last byte under the chat database."""


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


def wheel_part_paths(packages: Sequence[str]) -> list[Path]:
    """Locate `data/partNN.bin` of each installed data wheel, in order; raise if any is missing."""
    paths, missing = [], []
    for pkg in packages:
        spec = importlib.util.find_spec(pkg.replace("-", "_"))
        if spec is None or not spec.submodule_search_locations:
            missing.append(pkg)
            continue
        data = Path(next(iter(spec.submodule_search_locations))) / "data"
        parts = sorted(data.glob("part*.bin"))
        if len(parts) != 1:
            raise CorruptModelFile(f"Package {pkg} should hold exactly one data/partNN.bin, found {len(parts)}.")
        paths.append(parts[0])
    if missing:
        raise ModelNotInstalled(
            "The model's data packages are not installed: " + ", ".join(missing)
            + f". Install them with: python -m pip install {' '.join(missing)}"
        )
    return paths


def is_disk_full(err: OSError) -> bool:
    return err.errno in DISK_FULL_ERRNOS


def require_free_space(folder: Path, need: int, what: str) -> None:
    """Refuse (DiskFull) before writing `need` bytes under `folder` where its disk has not that much free (and
    DISK_RESERVE more); a disk whose free space cannot be read is not refused here."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if need + DISK_RESERVE > free:
        raise DiskFull(f"Not enough disk space for {what}: it needs {need / 2**30:.2f} GiB and {folder} has "
                       f"{free / 2**30:.2f} GiB free (keeping {DISK_RESERVE // 2**20} MiB). Free some space and "
                       "try again; nothing was written.")


def assemble_parts(
    parts: Sequence[Path], dest: Path, *, size: int | None, sha256: str | None, progress: Progress = _no_progress
) -> Path:
    """Concatenate `parts` into `dest`, hashing as it writes; only a verified file ever appears at `dest`."""
    total = sum(p.stat().st_size for p in parts)
    if size is not None and total != size:
        raise ChecksumMismatch(f"The model parts add up to {total:,} bytes, expected {size:,}: a part is damaged.")
    require_free_space(dest.parent, total, dest.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    done = 0
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        progress("assemble", done, total)
            out.flush()
            os.fsync(out.fileno())
        if sha256 is not None and digest.hexdigest() != sha256:
            raise ChecksumMismatch(
                f"Checksum mismatch for {dest.name}: got sha256 {digest.hexdigest()}, expected {sha256}. "
                "Reinstall the model packages."
            )
        os.replace(tmp, dest)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if is_disk_full(err):
            raise DiskFull(f"Not enough disk space to write {dest} ({total:,} bytes needed).") from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def file_sha256(path: Path, progress: Progress = _no_progress) -> str:
    digest, done, total = hashlib.sha256(), 0, path.stat().st_size
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            done += len(chunk)
            progress("verify", done, total)
    return digest.hexdigest()


def inspect_gguf(path: Path) -> dict:
    """Read and sanity-check a GGUF header; return {'architecture', 'name', 'tensors', 'header'}.

    Raises CorruptModelFile for a bad magic, a truncated file, tensors past the end of the file or a hostile header
    (models.gguf_header), and UnsupportedArchitecture for anything but Qwen2. gguf's own reader is left to
    transformers, which runs it on headers this check accepted (running it here too cost ~11 s on the 1.5B).
    """
    path = Path(path)
    if not path.is_file():
        raise CorruptModelFile(f"{path} does not exist or is not a file.")
    header = read_header(path)
    arch = header.fields.get("general.architecture")
    if not isinstance(arch, str):
        raise CorruptModelFile(f"{path.name} is not a usable GGUF model: its header lacks 'general.architecture'.")
    name = header.fields.get("general.name")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"{path.name} is a '{arch}' model; Ponder runs Qwen2 / Qwen2.5 models only."
        )
    return {"architecture": arch, "name": name if isinstance(name, str) and name else path.stem,
            "tensors": len(header.tensors), "header": header}
