"""Stored JSON objects read leniently, for the model store's files and the chat database's columns alike: a value
that is missing, damaged or not a JSON object reads as {} (unset), so a damaged manifest or chat setting never
stops a model from loading or a chat from opening."""
from __future__ import annotations

import json
from pathlib import Path


def json_object(text: str | None) -> dict:
    """The JSON object `text` holds; {} when it is empty or None, damaged, or not an object."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def read_json_object(path: Path) -> dict:
    """The JSON object in the file at `path`; {} when it is missing, unreadable (not UTF-8 included), damaged or
    not an object."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return {}
    return json_object(text)
