"""Shared fixtures: a tiny random Qwen2 on disk and in memory, an isolated PONDER_HOME per test."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.tiny import write_tiny_hf  # noqa: E402

TINY_ID = "tiny-qwen2"


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory) -> Path:
    return write_tiny_hf(tmp_path_factory.mktemp("tiny") / "tiny-qwen2")


@pytest.fixture
def loop(qapp):
    """An asyncio loop driven by Qt (qasync), as the app runs; pytest-qt has no qasync support of its own."""
    import asyncio

    import qasync

    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()
    asyncio.set_event_loop(None)


@pytest.fixture
def ponder_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("PONDER_HOME", str(home))
    return home


@pytest.fixture
def store(ponder_home):
    from core.storage.model_store import ModelStore

    return ModelStore()


@pytest.fixture(scope="session")
def tiny_store_root(tmp_path_factory, tiny_hf_dir) -> Path:
    """A store with the tiny model installed, shared by the session (tests copy it when they write)."""
    from core.storage.model_store import ModelStore

    root = tmp_path_factory.mktemp("store")
    ModelStore(root).import_hf(tiny_hf_dir, TINY_ID)
    return root


@pytest.fixture
def tiny_store(ponder_home, tiny_store_root):
    from core.storage.model_store import ModelStore

    root = ponder_home / "data" / "models"
    shutil.copytree(tiny_store_root, root, dirs_exist_ok=True)
    return ModelStore(root)


@pytest.fixture(scope="session")
def tiny_engine(tiny_hf_dir):
    import torch

    from core.engine import Engine
    from core.loading import load_plain, load_tokenizer

    model = load_plain(tiny_hf_dir, torch.bfloat16)
    return Engine(model, load_tokenizer(tiny_hf_dir), model_id=TINY_ID, precision="bf16", kv="bf16", context=512)


@pytest.fixture(autouse=True)
def _qt_objects_die_with_their_test():
    """Windows, dialogs and services a test made are destroyed right after it, on the main thread: deferred
    deletes are delivered and cycles collected now, not by a garbage collection that happens to run later on
    whichever thread (an engine worker, another test), which crashed the process inside Qt's event processing."""
    yield
    import gc
    import sys

    if "PySide6.QtWidgets" not in sys.modules:
        return
    from PySide6.QtCore import QCoreApplication, QEvent

    app = QCoreApplication.instance()
    if app is None:
        return
    for _ in range(2):
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        app.processEvents()
        gc.collect()
