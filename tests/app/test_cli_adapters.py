"""`ponder adapters ...` and `ponder ask --adapter NAME`, run as a user would (a subprocess), on the tiny model."""
import json
import zipfile

import pytest
import torch

from core.adapters import lora as adapters
from core.adapters.library import AdapterLibrary
from tests.app.test_cli import ponder
from tests.conftest import TINY_ID
from tests.tiny import make_model


def random_adapter(folder, seed: int, meta: dict | None = None):
    model = adapters.attach_new(make_model(448), rank=4)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.3)
    adapters.save_adapter(model, folder, meta or {})
    return folder


def one_line_error(out, code: int, text: str) -> None:
    assert out.returncode == code, out.stderr
    assert out.stderr.count("\n") == 1 and text in out.stderr and out.stderr.startswith("ponder: "), out.stderr


def test_adapters_round_trip_and_errors(tiny_store, ponder_home, tmp_path):
    folder = random_adapter(tmp_path / "trained", 1)
    out = ponder("adapters", "import", str(folder), "--model", TINY_ID, "--name", "sql", home=ponder_home)
    assert out.returncode == 0 and "Imported 'sql' (skill adapter for tiny-qwen2)" in out.stdout, out.stderr
    listed = json.loads(ponder("adapters", "list", "--json", home=ponder_home).stdout)
    assert [(c["name"], c["kind"], c["base_model"], c["builtin"]) for c in listed] == [("sql", "skill", TINY_ID, False)]
    assert {"metrics", "created", "folder"} <= set(listed[0])
    assert ponder("adapters", "rename", "sql", "sql2", home=ponder_home).returncode == 0
    text = ponder("adapters", home=ponder_home)
    assert text.returncode == 0 and text.stdout.startswith("sql2 ") and "library" in text.stdout
    zipped = tmp_path / "out" / "sql2.zip"
    out = ponder("adapters", "export", "sql2", str(zipped), "--model", TINY_ID, home=ponder_home)
    assert out.returncode == 0 and zipfile.is_zipfile(zipped), out.stderr
    assert ponder("adapters", "remove", "sql2", home=ponder_home).returncode == 0
    assert json.loads(ponder("adapters", "list", "--json", "--model", TINY_ID, home=ponder_home).stdout) == []
    one_line_error(ponder("adapters", "remove", "sql2", home=ponder_home), 2, "no adapter 'sql2'")

    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(zipped) as src, zipfile.ZipFile(evil, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr("../escape.txt", b"x")
    one_line_error(ponder("adapters", "import", str(evil), home=ponder_home), 2, "unsafe entry '../escape.txt'")
    other = random_adapter(tmp_path / "other", 2, {"base_model": "qwen2.5-7b-instruct"})
    one_line_error(ponder("adapters", "import", str(other), "--model", TINY_ID, home=ponder_home), 2,
                   "trained for the model 'qwen2.5-7b-instruct'")
    out = ponder("adapters", "import", str(zipped), "--name", "Bad Name", home=ponder_home)
    one_line_error(out, 2, "not a valid adapter name")
    assert ponder("adapters", "import", str(zipped), home=ponder_home).returncode == 0  # the card's own name
    one_line_error(ponder("adapters", "rename", "sql2", "../x", home=ponder_home), 2, "not a valid adapter name")
    one_line_error(ponder("adapters", "export", "sql2", str(zipped), home=ponder_home), 2, "already exists")


@pytest.mark.parametrize("kind", ["skill", "reasoning"])
def test_ask_with_a_library_adapter(tiny_store, ponder_home, tmp_path, kind):
    library = AdapterLibrary(store=tiny_store)
    library.add_from_folder(random_adapter(tmp_path / "a", 3), TINY_ID, "mine", kind=kind)
    args = ("ask", "--model", TINY_ID, "--precision", "bf16", "--kv", "bf16", "--temperature", "0",
            "--max-tokens", "6", "--budget", "4", "--answer-max-tokens", "3", "--json")
    mode = ("--mode", "reason" if kind == "reasoning" else "base")
    out = ponder(*args, *mode, "--adapter", "mine", "Why is the sky blue?", home=ponder_home)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["adapter"] == "mine" and data["tokens"] >= 1
    if kind == "reasoning":
        assert data["thinking_tokens"] == 4
    else:
        base = json.loads(ponder(*args, "Why is the sky blue?", home=ponder_home).stdout)
        assert base["adapter"] is None
    one_line_error(ponder(*args, "--adapter", "nope", "hi", home=ponder_home), 2, "no adapter 'nope'")
