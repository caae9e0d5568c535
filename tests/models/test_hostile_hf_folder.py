"""Hugging Face folders handed to the app: a damaged config, a shard index naming files elsewhere or missing, a
named pipe in place of the weights and a disk too small are refused with a ModelError, and the store keeps
nothing of them."""
import json
import os
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from models.convert import check_hf_folder
from models.errors import CorruptModelFile, DiskFull
from models.registry import spec_from_config

ROOT = Path(__file__).resolve().parents[2]


def leftovers(root) -> list[str]:
    return [p.name for p in root.rglob("*") if ".tmp-" in p.name or p.name.endswith(".partial")]


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes", [
    {"hidden_size": None},  # KeyError
    {"num_attention_heads": 0},  # ZeroDivisionError
    {"hidden_size": "big"},  # ValueError from int()
    {"num_hidden_layers": -2},  # installed: a negative memory estimate passed the RAM check, a model of no layers
])
def test_a_config_with_bad_sizes_is_corrupt_not_a_traceback(store, tiny_hf_dir, tmp_path, changes):
    src = shutil.copytree(tiny_hf_dir, tmp_path / "bad")
    edit_config(src, **changes)
    with pytest.raises(CorruptModelFile, match="config.json"):
        store.import_hf(src, "bad")
    assert store.list() == [] and leftovers(store.root) == [] and not store.folder("bad").exists()


def test_a_config_that_is_not_an_object_is_corrupt(store, tiny_hf_dir, tmp_path):
    src = shutil.copytree(tiny_hf_dir, tmp_path / "list")
    (src / "config.json").write_text("[1, 2]")  # AttributeError: 'list' object has no attribute 'get'
    with pytest.raises(CorruptModelFile, match="JSON object"):
        store.import_hf(src, "list")
    assert store.list() == []


def test_spec_from_config_keeps_working_configs():
    config = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
              "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True, "head_dim": None}
    spec = spec_from_config("x", config)
    assert (spec.hidden_size, spec.head_dim, spec.num_kv_heads, spec.vocab_size) == (896, 64, 2, 151936)
    assert spec_from_config("x", {**config, "hidden_size": 896.0}).hidden_size == 896
    with pytest.raises(CorruptModelFile):
        spec_from_config("x", {**config, "vocab_size": float("nan")})


def sharded(tiny_hf_dir, tmp_path, shard_name: str):
    """The tiny model as one shard and an index naming `shard_name` for one of its tensors."""
    src = shutil.copytree(tiny_hf_dir, tmp_path / "sharded")
    (src / "model.safetensors").rename(src / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                                            "lm_head.weight": shard_name}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    return src


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/elsewhere.safetensors", "sub/x.safetensors",
                                   "..\\outside.safetensors", "model.bin"])
def test_an_index_naming_a_file_outside_the_folder_is_refused(store, tiny_hf_dir, tmp_path, shard):
    """transformers joins the index's shard names to the folder: '..' or an absolute path would load weights from
    outside the store (a file that may change or vanish under an installed model)."""
    (tmp_path / "outside.safetensors").write_bytes((tiny_hf_dir / "model.safetensors").read_bytes())
    src = sharded(tiny_hf_dir, tmp_path, shard)
    with pytest.raises(CorruptModelFile, match="only files in its own folder"):
        store.import_hf(src, "escape")
    assert store.list() == [] and leftovers(store.root) == []


def test_an_index_naming_a_shard_a_broken_download_left_out_is_refused(store, tiny_hf_dir, tmp_path):
    """An interrupted download: the index and shard 1 arrived, shard 2 did not. The model was installed and failed
    only when loaded."""
    src = sharded(tiny_hf_dir, tmp_path, "model-00002-of-00002.safetensors")
    with pytest.raises(CorruptModelFile, match="missing"):
        store.import_hf(src, "partial")
    assert store.list() == []
    (src / "model.safetensors.index.json").write_text('{"weight_map": ["not", "a", "map"]}')
    with pytest.raises(CorruptModelFile, match="not a safetensors index"):
        check_hf_folder(src)


PIPE_CHILD = """
import sys
from models.convert import check_hf_folder
from models.errors import ModelError
try:
    check_hf_folder(sys.argv[1])
    print("ACCEPTED")
except ModelError as err:
    print("REFUSED", type(err).__name__, err)
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_for_weights_is_refused_not_waited_on(tiny_hf_dir, tmp_path):
    """Opening a pipe for reading blocks until something writes to it, inside safetensors (holding the GIL): the
    check hung for ever. It runs in a child process here, so that a regression fails instead of hanging."""
    src = shutil.copytree(tiny_hf_dir, tmp_path / "pipe")
    (src / "model.safetensors").unlink()
    os.mkfifo(src / "model.safetensors")
    try:
        out = subprocess.run([sys.executable, "-c", PIPE_CHILD, str(src)], capture_output=True, text=True, cwd=ROOT,
                             timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("checking a folder with a named pipe for weights did not finish in a minute")
    assert out.stdout.startswith("REFUSED CorruptModelFile"), (out.stdout, out.stderr[-2000:])


def test_an_import_larger_than_the_free_disk_space_writes_nothing(store, tiny_hf_dir, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 10**6, 10**6))
    with pytest.raises(DiskFull, match="GiB free"):
        store.import_hf(tiny_hf_dir, "big")
    assert store.list() == [] and not store.folder("big").exists() and leftovers(store.root) == []


def test_assembling_parts_larger_than_the_free_disk_space_writes_nothing(tmp_path, monkeypatch):
    from models.gguf_file import assemble_parts

    part = tmp_path / "part01.bin"
    part.write_bytes(b"x" * 3000)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 10**6, 10**6))
    with pytest.raises(DiskFull, match="nothing was written"):
        assemble_parts([part], tmp_path / "out" / "model.gguf", size=3000, sha256=None)
    assert not (tmp_path / "out").exists()
