"""Every on-disk location the app uses, from platformdirs, with one environment override.

`PONDER_HOME` puts all data (models, chats, settings) under one folder: tests and portable installs use it.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import platformdirs

APP_NAME = "Ponder"


def data_dir() -> Path:
    home = os.environ.get("PONDER_HOME")
    path = Path(home) / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    home = os.environ.get("PONDER_HOME")
    path = Path(home) / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resource_dir() -> Path:
    """Read-only bundled resources: the source tree's `resources/`, or PyInstaller's `sys._MEIPASS/resources`."""
    base = getattr(sys, "_MEIPASS", None)
    return Path(base) / "resources" if base else Path(__file__).resolve().parents[2] / "resources"
