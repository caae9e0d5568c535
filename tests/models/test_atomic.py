"""Nothing lost: folder replacement survives a crash, heads are swapped in whole, a damaged head is skipped."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.heads import SwitcherHead, VerifierHead, load_head, save_head

ROOT = Path(__file__).resolve().parents[2]

CRASH_MID_SWAP = """
import os, sys
from pathlib import Path
import models.convert as convert
final = Path(sys.argv[1])
real_replace = os.replace
def replace(src, dst):
    if Path(src).name.startswith(f".{final.name}.tmp-"):
        os._exit(3)  # killed after the old folder was moved out of the way, before the new one is in
    real_replace(src, dst)
convert.os.replace = replace
with convert.AtomicDir(final) as tmp:
    (tmp / "data.txt").write_text("new")
"""


def crash_mid_swap(final: Path) -> None:
    out = subprocess.run([sys.executable, "-c", CRASH_MID_SWAP, str(final)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 3, out.stderr


def test_crash_mid_replacement_keeps_the_old_folder(tmp_path):
    from models.convert import recover_backups

    final = tmp_path / "hf"
    final.mkdir()
    (final / "data.txt").write_text("old")
    crash_mid_swap(final)
    assert recover_backups(tmp_path) == [final]
    assert (final / "data.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir() if ".old-" in p.name] == []


def test_store_recovers_a_model_folder_on_start(tmp_path, tiny_hf_dir):
    from core.storage.model_store import ModelStore

    root = tmp_path / "models"
    ModelStore(root).import_hf(tiny_hf_dir, "tiny")
    crash_mid_swap(root / "tiny" / "hf")
    assert not (root / "tiny" / "hf").exists()
    store = ModelStore(root)
    assert store.is_installed("tiny") and (store.get("tiny").hf_dir / "model.safetensors").is_file()


def test_failed_rename_restores_the_old_folder(tmp_path, monkeypatch):
    import models.convert as convert

    final = tmp_path / "out"
    final.mkdir()
    (final / "data.txt").write_text("old")
    real = convert.os.replace

    def replace(src, dst):
        if ".tmp-" in Path(src).name:
            raise PermissionError("locked")
        real(src, dst)

    monkeypatch.setattr(convert.os, "replace", replace)
    with pytest.raises(PermissionError):
        with convert.AtomicDir(final) as tmp:
            (tmp / "data.txt").write_text("new")
    assert (final / "data.txt").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_replacement_succeeds_and_leaves_no_backup(tmp_path):
    from models.convert import AtomicDir

    final = tmp_path / "out"
    for text in ("one", "two"):
        with AtomicDir(final) as tmp:
            (tmp / "data.txt").write_text(text)
    assert (final / "data.txt").read_text() == "two" and [p.name for p in tmp_path.iterdir()] == ["out"]


def _switcher(hidden: int = 16) -> SwitcherHead:
    torch.manual_seed(0)
    return SwitcherHead(hidden)


def test_save_head_failure_keeps_the_old_head(tmp_path, monkeypatch):
    folder = tmp_path / "switcher"
    save_head(_switcher(), folder, {"kind": "switcher", "hidden_size": 16})
    before = (folder / "head.safetensors").read_bytes()

    def broken_save(tensors, path, metadata=None):
        Path(path).write_bytes(b"half a file")
        raise OSError("disk went away")

    monkeypatch.setattr("safetensors.torch.save_file", broken_save)
    with pytest.raises(OSError):
        save_head(_switcher(), folder, {"kind": "switcher", "hidden_size": 16, "new": True})
    assert (folder / "head.safetensors").read_bytes() == before
    assert "new" not in load_head(folder, "switcher")[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["switcher"]


def test_save_head_refuses_a_folder_with_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="other files"):
        save_head(_switcher(), tmp_path, {"kind": "switcher", "hidden_size": 16})
    assert (tmp_path / "notes.txt").read_text() == "mine"


def _engine(tiny_store, reasoning=True):
    from core.config import EngineConfig
    from core.loading import load_engine
    from tests.conftest import TINY_ID

    return load_engine(EngineConfig(model_id=TINY_ID, precision="bf16", kv="bf16", context=256), tiny_store,
                       reasoning=reasoning)


def _user_heads(tiny_store) -> Path:
    from tests.conftest import TINY_ID

    components = tiny_store.folder(TINY_ID) / "components"
    save_head(_switcher(128), components / "switcher", {"kind": "switcher", "hidden_size": 128})
    save_head(VerifierHead(128), components / "verifier", {"kind": "verifier", "hidden_size": 128})
    return components


def test_damaged_user_head_falls_back_to_none_with_a_warning(tiny_store, monkeypatch, tmp_path, caplog):
    monkeypatch.setattr("core.loading.resource_dir", lambda: tmp_path / "no-resources")
    components = _user_heads(tiny_store)
    assert _engine(tiny_store).router is not None and _engine(tiny_store).warnings == []
    (components / "switcher" / "head.safetensors").write_bytes(b"\x00" * 40)  # corrupt weights
    (components / "verifier" / "head.json").write_text("{not json")  # corrupt config
    engine = _engine(tiny_store)
    assert engine.router is None and engine.verifier is None
    assert len(engine.warnings) == 2 and "switcher" in engine.warnings[0] and "verifier" in engine.warnings[1]
    assert all("no " in w for w in engine.warnings) and "could not be loaded" in caplog.text


def test_damaged_user_head_falls_back_to_the_shipped_one(tiny_store, monkeypatch, tmp_path):
    from tests.conftest import TINY_ID

    resources = tmp_path / "resources"
    save_head(_switcher(128), resources / "components" / TINY_ID / "switcher",
              {"kind": "switcher", "hidden_size": 128, "shipped": True})
    monkeypatch.setattr("core.loading.resource_dir", lambda: resources)
    components = _user_heads(tiny_store)
    (components / "switcher" / "head.json").write_text(json.dumps({"kind": "switcher"}))  # no hidden_size
    engine = _engine(tiny_store)
    assert engine.router is not None and engine.router.config.get("shipped") is True
    assert len(engine.warnings) == 1 and "the shipped one" in engine.warnings[0]


KILLED_MID_WRITE = """
import os, sys
from pathlib import Path
from models.convert import AtomicDir
with AtomicDir(Path(sys.argv[1])) as tmp:
    (tmp / "model.safetensors").write_bytes(b"x" * 100_000)
    os._exit(9)  # killed (OOM, power loss) while the weights were being written
"""


def test_store_start_removes_what_killed_writes_left_but_not_a_live_ones(tmp_path, tiny_hf_dir):
    """A write killed midway leaves `.<name>.tmp-<pid>`, a killed wheel download `.download-<pid>-…`: the store's
    start deletes them once their process is gone; a live process's folders, and links, stay untouched."""
    from core.storage.model_store import ModelStore

    root = tmp_path / "models"
    ModelStore(root).import_hf(tiny_hf_dir, "tiny")
    for final in (root / "tiny" / "w4-h4", root / "tiny" / "components" / "switcher"):
        out = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(final)], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 9, out.stderr
    dead = int(next((root / "tiny").glob(".w4-h4.tmp-*")).name.rsplit("-", 1)[1])  # the killed writer's pid
    assert any((root / "tiny" / "components").glob(".switcher.tmp-*"))
    (root / f".download-{dead}-x1y2").mkdir()
    (root / f".download-{dead}-x1y2" / "part.whl").write_bytes(b"w" * 1000)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for kept in (root / f".download-{live.pid}-a", root / "tiny" / f".w8-h8.tmp-{live.pid}"):
            kept.mkdir()
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "precious.txt").write_text("mine")
        (root / "tiny" / f".w2.tmp-{dead}").symlink_to(outside, target_is_directory=True)

        store = ModelStore(root)
        left = sorted(str(p.relative_to(root)) for p in root.rglob(".*"))
        assert left == [f".download-{live.pid}-a", f"tiny/.w2.tmp-{dead}", f"tiny/.w8-h8.tmp-{live.pid}"]
        assert (outside / "precious.txt").read_text() == "mine" and store.is_installed("tiny")
    finally:
        live.kill()
        live.wait()


FULL_DISK_IN_SAFETENSORS = """
import resource, signal, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
from models.convert import AtomicDir
from models.errors import DiskFull
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))  # writes past 50 kB fail as on a full disk (EFBIG)
try:
    with AtomicDir(Path(sys.argv[1])) as tmp:
        save_file({"w": torch.zeros(100_000)}, str(tmp / "model.safetensors"))
except DiskFull as err:
    print("DiskFull:", err)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="the file-size limit is POSIX")
def test_a_full_disk_under_safetensors_is_disk_full(tmp_path):
    """safetensors reports a failed write as its own error with the OS code, not as an OSError: still DiskFull."""
    out = subprocess.run([sys.executable, "-c", FULL_DISK_IN_SAFETENSORS, str(tmp_path / "w4-h4")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("DiskFull:"), out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []
