"""The adapter library on the tiny model: add, list, rename, export and import (folder and zip), remove, and
everything it must refuse (another base model, other base weights, bad names, unsafe zips, damaged adapters,
changes to built-in adapters)."""
import json
import zipfile

import pytest

from core.adapters import lora as adapters
from core.adapters.cards import AdapterError, validate_adapter_name
from core.adapters.library import AdapterLibrary
from tests.conftest import TINY_ID
from tests.tiny import make_model


@pytest.fixture(scope="module")
def saved_adapter(tmp_path_factory):
    """A tiny adapter as training saves it (peft files + a card without library fields)."""
    folder = tmp_path_factory.mktemp("trained") / "adapter"
    adapters.save_adapter(adapters.attach_new(make_model(448), rank=4), folder, {"final_loss": 1.5})
    return folder


@pytest.fixture
def library(tiny_store):
    return AdapterLibrary(store=tiny_store)


def test_add_list_get_with_card(library, saved_adapter, tiny_store):
    card = library.add_from_folder(saved_adapter, TINY_ID, "sql-helper", kind="skill", data_hash="abc",
                                   recipe={"preset": "quick"}, metrics={"accuracy": 0.5})
    assert card.folder.parent.parent == library.root and not card.builtin
    assert card.base_fingerprint == adapters.base_fingerprint(tiny_store.get(TINY_ID).hf_dir)
    stored = adapters.adapter_meta(card.folder)
    assert stored["final_loss"] == 1.5 and stored["name"] == "sql-helper" and stored["kind"] == "skill"
    assert stored["recipe"] == {"preset": "quick"} and stored["metrics"] == {"accuracy": 0.5}
    assert library.get(TINY_ID, "sql-helper") == card
    assert [c.name for c in library.list(TINY_ID)] == ["sql-helper"]
    assert [c.name for c in library.list()] == ["sql-helper"]
    assert library.list(TINY_ID, kind="reasoning") == []
    assert json.loads(json.dumps(card.to_dict()))["folder"] == str(card.folder)
    with pytest.raises(AdapterError, match="no adapter 'nope'"):
        library.get(TINY_ID, "nope")


def test_add_replaces_atomically_and_leaves_no_temporary_folders(library, saved_adapter):
    library.add_from_folder(saved_adapter, TINY_ID, "a", kind="skill", metrics={"n": 1})
    card = library.add_from_folder(saved_adapter, TINY_ID, "a", kind="reasoning", metrics={"n": 2})
    assert card.kind == "reasoning" and card.metrics == {"n": 2}
    assert sorted(p.name for p in (library.root / TINY_ID).iterdir()) == ["a"]


def test_rename_export_zip_import_remove_round_trip(library, saved_adapter, tmp_path):
    library.add_from_folder(saved_adapter, TINY_ID, "one", kind="skill", metrics={"accuracy": 0.25})
    renamed = library.rename(TINY_ID, "one", "two")
    assert renamed.name == "two" and adapters.adapter_meta(renamed.folder)["name"] == "two"
    assert [c.name for c in library.list(TINY_ID)] == ["two"]
    zipped = library.export(TINY_ID, "two", tmp_path / "two.zip")
    with zipfile.ZipFile(zipped) as zf:
        assert sorted(zf.namelist()) == ["two/adapter_config.json", "two/adapter_model.safetensors",
                                         f"two/{adapters.META_FILE}"]
    with pytest.raises(AdapterError, match="already exists"):
        library.import_path(zipped)  # same name, never overwritten
    imported = library.import_path(zipped, name="three")
    assert imported.kind == "skill" and imported.metrics == {"accuracy": 0.25} and imported.base_model == TINY_ID
    folder = library.export(TINY_ID, "three", tmp_path / "out")
    assert (folder / "adapter_model.safetensors").is_file()
    library.remove(TINY_ID, "two")
    library.remove(TINY_ID, "three")
    assert library.list(TINY_ID) == [] and list((library.root / TINY_ID).iterdir()) == []
    again = library.import_path(folder)  # a folder import keeps the card's name
    assert again.name == "three"
    assert library.export(TINY_ID, "three", folder) == folder / "three"  # into an existing folder
    with pytest.raises(AdapterError, match="already exists"):
        library.export(TINY_ID, "three", folder)
    with pytest.raises(AdapterError, match="already exists"):
        library.export(TINY_ID, "three", zipped)


def test_an_adapter_for_another_model_or_other_weights_is_refused(library, saved_adapter, tmp_path):
    other = tmp_path / "other"
    adapters.save_adapter(adapters.attach_new(make_model(448), rank=4), other, {"base_model": "qwen2.5-7b-instruct"})
    with pytest.raises(AdapterError, match="trained for the model 'qwen2.5-7b-instruct'.*'tiny-qwen2'"):
        library.import_path(other, model_id=TINY_ID)
    with pytest.raises(AdapterError, match="trained for the model"):
        library.add_from_folder(other, TINY_ID, "x", kind="skill")
    weights = tmp_path / "weights"
    adapters.save_adapter(adapters.attach_new(make_model(448), rank=4), weights,
                          {"base_model": TINY_ID, "base_fingerprint": "0" * 16})
    with pytest.raises(AdapterError, match="other weights"):
        library.import_path(weights)
    with pytest.raises(AdapterError, match="which model"):
        library.import_path(saved_adapter)  # its card names no model and none was given
    assert library.list() == []


@pytest.mark.parametrize("name", ["", "Upper", "a/b", "../x", "a..b", "con", "-x", "x" * 65, "sp ace"])
def test_bad_names_are_refused(library, saved_adapter, name):
    with pytest.raises(AdapterError, match="not a valid adapter name"):
        library.add_from_folder(saved_adapter, TINY_ID, name, kind="skill")
    assert not library.root.exists() or not any(library.root.rglob("adapter_config.json"))


def test_valid_names_pass_and_bad_model_ids_are_adapter_errors(library):
    assert validate_adapter_name("sql-helper_2.1") == "sql-helper_2.1"
    for call in (lambda: library.list("../x"), lambda: library.get("A B", "x"), lambda: library.remove("..", "x")):
        with pytest.raises(AdapterError, match="not a valid model id"):
            call()


def _zip(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.mark.parametrize("bad", ["../evil.json", "/abs.json", "a/../../evil.json", "c:/x.json", "x\\..\\..\\evil.json"])
def test_a_zip_with_an_unsafe_member_is_refused_and_nothing_is_written(library, saved_adapter, tmp_path, bad):
    good = {f"x/{f.name}": f.read_bytes() for f in saved_adapter.iterdir()}
    path = _zip(tmp_path / "evil.zip", {**good, bad: b"{}"})
    with pytest.raises(AdapterError, match="unsafe entry"):
        library.import_path(path, model_id=TINY_ID)
    assert not (tmp_path / "evil.json").exists() and not (tmp_path.parent / "evil.json").exists()
    assert list(library.root.iterdir()) == []  # the staging folder is gone too


def test_a_zip_with_a_top_folder_and_finder_metadata_imports(library, saved_adapter, tmp_path):
    members = {f"x/{f.name}": f.read_bytes() for f in saved_adapter.iterdir()}
    members.update({"__MACOSX/x/._adapter_config.json": b"\x00", "x/deeper/notes.txt": b"kept out"})
    card = library.import_path(_zip(tmp_path / "My Adapter.zip", members), model_id=TINY_ID)
    assert card.name == "my-adapter" and sorted(p.name for p in card.folder.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", adapters.META_FILE]


def test_damaged_adapters_and_non_adapters_are_refused(library, saved_adapter, tmp_path):
    damaged = {f"d/{f.name}": f.read_bytes() for f in saved_adapter.iterdir()}
    damaged["d/adapter_model.safetensors"] = b"\x00garbage"
    with pytest.raises(AdapterError, match="damaged"):
        library.import_path(_zip(tmp_path / "damaged.zip", damaged), model_id=TINY_ID)
    with pytest.raises(AdapterError, match="no adapter"):
        library.import_path(_zip(tmp_path / "empty.zip", {"readme.txt": b"hi"}), model_id=TINY_ID)
    (tmp_path / "notzip.zip").write_bytes(b"PK not really")
    with pytest.raises(AdapterError, match="not a readable zip"):
        library.import_path(tmp_path / "notzip.zip", model_id=TINY_ID)
    with pytest.raises(AdapterError, match="does not exist"):
        library.import_path(tmp_path / "missing")
    assert library.list() == []


def test_zip_errors_name_the_zip_and_unreadable_members_are_adapter_errors(library, saved_adapter, tmp_path):
    files = {f"a/b/{f.name}": f.read_bytes() for f in saved_adapter.iterdir()}  # two folders deep
    with pytest.raises(AdapterError, match="nested.zip holds no adapter"):
        library.import_path(_zip(tmp_path / "nested.zip", files), model_id=TINY_ID)
    with zipfile.ZipFile(tmp_path / "dot.zip", "w") as zf:  # a './' entry is skipped, not an IndexError
        zf.writestr("./", b"")
        for f in saved_adapter.iterdir():
            zf.writestr(f.name, f.read_bytes())
    assert library.import_path(tmp_path / "dot.zip", model_id=TINY_ID, name="dotted").name == "dotted"
    good = _zip(tmp_path / "crc.zip", {f"c/{f.name}": f.read_bytes() for f in saved_adapter.iterdir()})
    data = bytearray(good.read_bytes())
    at = data.index(b'"peft_type"') if b'"peft_type"' in data else data.index(b"{")
    data[at + 2] ^= 0xFF  # a stored member's byte flipped: its CRC no longer matches
    (tmp_path / "crc.zip").write_bytes(bytes(data))
    with pytest.raises(AdapterError, match="could not be read"):
        library.import_path(tmp_path / "crc.zip", model_id=TINY_ID, name="crc")
    assert [c.name for c in library.list(TINY_ID)] == ["dotted"]


@pytest.mark.parametrize("card", [{"recipe": "abc"}, {"metrics": [1, 2, 3]}, [], "text"])
def test_a_hand_edited_card_never_breaks_the_library(library, saved_adapter, tmp_path, card):
    """A card that is not an object, or whose recipe/metrics are not, is refused or read as empty; the library
    keeps listing (and removing) everything, and a refused import adds nothing."""
    library.add_from_folder(saved_adapter, TINY_ID, "good", kind="skill")
    files = {f"x/{f.name}": f.read_bytes() for f in saved_adapter.iterdir()}
    files[f"x/{adapters.META_FILE}"] = json.dumps(card).encode()
    try:
        added = library.import_path(_zip(tmp_path / "x.zip", files), model_id=TINY_ID, name="edited")
        assert added.recipe == {} and added.metrics == {}
    except AdapterError as err:
        assert "not a JSON object" in str(err) and isinstance(card, (list, str))
        assert [c.name for c in library.list(TINY_ID)] == ["good"]
    assert "good" in [c.name for c in library.list(TINY_ID)]
    (library.root / TINY_ID / "good" / adapters.META_FILE).write_text(json.dumps(card))
    (library.root / TINY_ID / "good" / "adapter_model.safetensors").unlink()
    assert "good" in [c.name for c in library.list(TINY_ID)]  # damaged card and missing weights: still listed
    library.remove(TINY_ID, "good")
    assert "good" not in [c.name for c in library.list(TINY_ID)]


def test_builtin_adapters_are_listed_read_only_and_exportable(library, saved_adapter, tiny_store, tmp_path):
    component = tiny_store.get(TINY_ID).folder / "components" / "reasoning"
    adapters.save_adapter(adapters.attach_new(make_model(448), rank=4), component, {"name": "mine"})
    library.add_from_folder(saved_adapter, TINY_ID, "skilled", kind="skill")
    cards = {c.name: c for c in library.list(TINY_ID)}
    assert cards["mine"].builtin and cards["mine"].kind == "reasoning" and not cards["skilled"].builtin
    assert [c.name for c in library.list(TINY_ID, kind="reasoning")] == ["mine"]
    for change in (lambda: library.remove(TINY_ID, "mine"), lambda: library.rename(TINY_ID, "mine", "x")):
        with pytest.raises(AdapterError, match="built-in"):
            change()
    with pytest.raises(AdapterError, match="built-in"):
        library.add_from_folder(saved_adapter, TINY_ID, "mine", kind="skill")
    exported = library.export(TINY_ID, "mine", tmp_path / "mine.zip")
    assert component.is_dir() and zipfile.is_zipfile(exported)
    copy = library.import_path(exported, name="mine-copy")
    assert copy.kind == "reasoning" and not copy.builtin


def test_remove_never_leaves_the_library_root(library, saved_adapter, tmp_path):
    card = library.add_from_folder(saved_adapter, TINY_ID, "victim", kind="skill")
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "adapter_config.json").write_text("{}")
    card.folder.rename(tmp_path / "moved")
    card.folder.symlink_to(outside)  # a link planted where the adapter was
    assert library.list(TINY_ID) == []  # a link is never an adapter of the library
    with pytest.raises(AdapterError):
        library.remove(TINY_ID, "victim")
    with pytest.raises(AdapterError, match="not inside the adapter library"):
        library._inside(card.folder)
    assert (outside / "adapter_config.json").is_file()
