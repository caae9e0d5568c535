"""The Adapters dialog on a real adapter library (real peft adapters of the tiny model, offscreen Qt): it lists,
renames, exports, deletes and imports (zip and folder), refuses a built-in delete and an adapter for another model
with a message, leaves the library as it was after a failure, and signals "use for reasoning" / "use in this chat"."""
import shutil

import pytest
import torch
from PySide6.QtCore import Qt

from core.adapters import lora as adapters
from core.adapters.library import AdapterLibrary
from core.loading import load_plain
from tests.conftest import TINY_ID
from ui import adapters_dialog, dialogs
from ui.adapters_dialog import AdaptersDialog, metrics_text


def make_adapter(hf_dir, folder, *, name: str, kind: str, base_model: str = TINY_ID):
    """A real (random) rank-2 LoRA of the tiny model saved as Ponder saves adapters."""
    model = adapters.attach_new(load_plain(hf_dir, torch.bfloat16), rank=2)
    adapters.save_adapter(model, folder, {"name": name, "kind": kind, "base_model": base_model})
    return folder


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory, tiny_hf_dir):
    root = tmp_path_factory.mktemp("adapters")
    return {"skill": make_adapter(tiny_hf_dir, root / "sql", name="sql-helper", kind="skill"),
            "reasoning": make_adapter(tiny_hf_dir, root / "concise", name="concise", kind="reasoning"),
            "other": make_adapter(tiny_hf_dir, root / "other", name="other-skill", kind="skill",
                                  base_model="other-model")}


@pytest.fixture
def library(tiny_store, adapter_dirs):
    lib = AdapterLibrary(store=tiny_store)
    lib.add_from_folder(adapter_dirs["skill"], TINY_ID, "sql-helper", kind="skill",
                        metrics={"before": {"accuracy": 0.2}, "after": {"accuracy": 0.625, "mean_tokens": 118}})
    lib.add_from_folder(adapter_dirs["reasoning"], TINY_ID, "concise", kind="reasoning")
    user_component = tiny_store.root / TINY_ID / "components" / "reasoning"  # listed as built in
    shutil.copytree(adapter_dirs["reasoning"], user_component)
    (user_component / adapters.META_FILE).unlink()  # no card: listed under its default name
    return lib


@pytest.fixture
def dialog(qtbot, library):
    d = AdaptersDialog(library, TINY_ID)
    qtbot.addWidget(d)
    d.show_state(TINY_ID, "concise", None)
    return d


def names(d) -> list[str]:
    cards = (d.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(d.list.count()))
    return [c.name for c in cards if c is not None]


def test_lists_the_models_adapters_with_kind_metrics_and_builtin_marker(dialog):
    assert names(dialog) == ["concise", "sql-helper", "my-reasoning"]
    texts = [dialog.list.item(i).text() for i in range(dialog.list.count())]
    sql = next(t for t in texts if t.startswith("sql-helper"))
    assert "Skill" in sql and f"for {TINY_ID}" in sql and "accuracy 0.625" in sql and "created 20" in sql
    assert any("built-in" in t for t in texts)
    concise = next(t for t in texts if t.startswith("concise "))
    assert "reasons for this model" in concise and "Reasoning adapter: concise" in dialog.header.text()
    assert metrics_text({"loss": 1.23456, "ok": True, "name": "x"}) == "loss 1.23"


def test_rename_then_a_bad_name_changes_nothing(dialog, library, monkeypatch, qtbot):
    dialog.select("sql-helper")
    monkeypatch.setattr(adapters_dialog.AdapterNameDialog, "ask", classmethod(lambda cls, p, c, **_: "sql-pro"))
    with qtbot.waitSignal(dialog.renamed) as sig:
        dialog.rename_button.click()
    assert sig.args == ["sql-helper", "sql-pro"] and "sql-pro" in names(dialog) and "sql-helper" not in names(dialog)
    assert library.get(TINY_ID, "sql-pro").metrics["after"]["accuracy"] == 0.625
    asked = []
    answers = iter(["Bad Name!", None])  # a bad name, then Cancel

    def ask(cls, parent, current, error=""):
        asked.append((current, error))
        return next(answers)

    monkeypatch.setattr(adapters_dialog.AdapterNameDialog, "ask", classmethod(ask))
    dialog.select("sql-pro")
    dialog.rename_button.click()
    assert "Could not rename" in dialog.message.text() and "not a valid adapter name" in dialog.message.text()
    assert asked[0] == ("sql-pro", "")  # asked again with the typed name kept and why it failed
    assert asked[1][0] == "Bad Name!" and "not a valid adapter name" in asked[1][1] and len(asked) == 2
    assert sorted(c.name for c in library.list(TINY_ID) if not c.builtin) == ["concise", "sql-pro"]


def test_builtin_cannot_be_renamed_or_deleted(dialog, library, monkeypatch):
    builtin = next(c for c in library.list(TINY_ID) if c.builtin)
    dialog.select(builtin.name)
    assert not dialog.delete_button.isEnabled() and not dialog.rename_button.isEnabled()
    assert dialog.export_button.isEnabled() and dialog.reason_button.isEnabled()
    monkeypatch.setattr(dialogs.ConfirmDialog, "ask", classmethod(lambda cls, *a: True))
    dialog.delete_adapter()  # the Delete key reaches it even so
    assert "built in" in dialog.message.text() and builtin.folder.is_dir()
    assert any(c.builtin for c in library.list(TINY_ID))


def test_export_delete_and_import_the_zip_back(dialog, library, monkeypatch, qtbot, tmp_path):
    dialog.select("sql-helper")
    monkeypatch.setattr(adapters_dialog.ExportPathDialog, "ask", classmethod(lambda cls, p, n: str(tmp_path / "s.zip")))
    dialog.export_button.click()
    assert (tmp_path / "s.zip").is_file() and "Exported" in dialog.message.text()
    monkeypatch.setattr(dialogs.ConfirmDialog, "ask", classmethod(lambda cls, *a: False))
    dialog.delete_button.click()  # the user said no
    assert "sql-helper" in names(dialog)
    monkeypatch.setattr(dialogs.ConfirmDialog, "ask", classmethod(lambda cls, *a: True))
    with qtbot.waitSignal(dialog.removed) as sig:
        dialog.delete_button.click()
    assert sig.args == ["sql-helper"] and "sql-helper" not in names(dialog)
    assert [c.name for c in library.list(TINY_ID, kind="skill")] == []
    monkeypatch.setattr(adapters_dialog.ImportPathDialog, "ask", classmethod(lambda cls, p: str(tmp_path / "s.zip")))
    with qtbot.waitSignal(dialog.libraryChanged):
        dialog.import_button.click()
    assert "Imported “sql-helper”" in dialog.message.text() and dialog.selected_name() == "sql-helper"
    card = library.get(TINY_ID, "sql-helper")
    assert card.kind == "skill" and (card.folder / "adapter_model.safetensors").is_file()
    dialog.import_adapter(str(tmp_path / "s.zip"))  # the same again: refused, the first one kept
    assert "Could not import" in dialog.message.text() and "already exists" in dialog.message.text()
    assert [c.name for c in library.list(TINY_ID, kind="skill")] == ["sql-helper"]


def test_an_adapter_for_another_model_or_a_damaged_one_is_refused_with_a_message(dialog, library, adapter_dirs,
                                                                                   tmp_path):
    before = sorted(p.name for p in library.root.rglob("*"))
    dialog.import_adapter(str(adapter_dirs["other"]))
    assert "trained for the model 'other-model'" in dialog.message.text()
    bad = tmp_path / "bad"
    shutil.copytree(adapter_dirs["skill"], bad)
    (bad / "adapter_model.safetensors").write_bytes(b"not tensors")
    dialog.import_adapter(str(bad))
    assert "Could not import" in dialog.message.text() and "damaged" in dialog.message.text()
    (tmp_path / "junk.zip").write_bytes(b"PK nonsense")
    dialog.import_adapter(str(tmp_path / "junk.zip"))
    assert "not a readable zip" in dialog.message.text()
    assert sorted(p.name for p in library.root.rglob("*")) == before


def test_use_buttons_signal_the_choice(dialog, qtbot):
    dialog.select("sql-helper")
    assert dialog.chat_button.isEnabled() and not dialog.reason_button.isEnabled()
    with qtbot.waitSignal(dialog.skillChosen) as sig:
        dialog.chat_button.click()
    assert sig.args == ["sql-helper"]
    dialog.show_state(TINY_ID, "concise", "sql-helper")
    dialog.select("sql-helper")
    assert dialog.chat_button.text() == "Stop using in this chat"
    with qtbot.waitSignal(dialog.skillChosen) as sig:
        dialog.chat_button.click()
    assert sig.args == [None]
    dialog.select("concise")
    assert not dialog.reason_button.isEnabled()  # already the reasoning adapter
    dialog.show_state(TINY_ID, None, None)
    assert "none — Reason and Auto are off" in dialog.header.text()
    dialog.select("concise")
    with qtbot.waitSignal(dialog.reasoningChosen) as sig:
        dialog.reason_button.click()
    assert sig.args == ["concise"]
    with qtbot.waitSignal(dialog.trainRequested):
        dialog.train_button.click()
