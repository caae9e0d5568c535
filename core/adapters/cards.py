"""An adapter's card: AdapterCard (name, kind, base model and its fingerprint, data hash, recipe, metrics,
created), read from and written to `ponder_adapter.json` in the adapter's folder (a damaged card still reads, so
the adapter can be removed); the kinds, the name rules, and AdapterError, the one-line reason the library gives
for anything it cannot do. Where adapters live, and how they are imported, exported and removed, is
core.adapters.library's business.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.adapters import lora as adapters
from models.errors import InvalidModelId
from models.registry import validate_model_id

log = logging.getLogger(__name__)
ADAPTER_KINDS = ("reasoning", "skill")
CARD_KEYS = ("name", "kind", "base_model", "base_fingerprint", "data_hash", "recipe", "metrics", "created")


class AdapterError(ValueError):
    """Something the user asked of the library that cannot be done; the message says why in one line."""


def validate_adapter_name(name: str) -> str:
    """`name` if it is a valid adapter name (the rules of model ids: a safe folder name everywhere)."""
    try:
        return validate_model_id(name)
    except InvalidModelId as err:
        raise AdapterError(str(err).replace("model id", "adapter name")) from None


@dataclass(frozen=True)
class AdapterCard:
    """One adapter: where it lives and what it is."""

    name: str
    kind: str
    base_model: str
    base_fingerprint: str | None
    data_hash: str | None
    recipe: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    created: str = ""
    folder: Path = Path()
    builtin: bool = False

    def to_dict(self) -> dict:
        out = asdict(self)
        out["folder"] = str(self.folder)
        return out

    def meta(self) -> dict:
        """The card's fields as stored in ponder_adapter.json."""
        return {k: getattr(self, k) for k in CARD_KEYS}


def _card(folder: Path, model_id: str, name: str, builtin: bool = False, meta: dict | None = None) -> AdapterCard:
    if meta is None:
        try:
            meta = adapters.adapter_meta(folder)
        except (OSError, ValueError) as err:  # a damaged card still lists (so it can be removed)
            log.warning("adapter card in %s unreadable: %s", folder, err)
            meta = {}
    kind = meta.get("kind") if meta.get("kind") in ADAPTER_KINDS else ("reasoning" if builtin else "skill")
    created = meta.get("created")
    if not isinstance(created, str):
        try:
            stamp = (folder / "adapter_model.safetensors").stat().st_mtime
        except OSError:  # weights missing too: the card still lists, so the adapter can be removed
            stamp = time.time()
        created = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp))
    text = lambda key: meta.get(key) if isinstance(meta.get(key), str) else None  # noqa: E731
    return AdapterCard(name, kind, text("base_model") or model_id, text("base_fingerprint"), text("data_hash"),
                       _object(meta.get("recipe")), _object(meta.get("metrics")), created, folder, builtin)


def _object(value) -> dict:
    """A card's recipe or metrics: a JSON object, or {} for anything else a hand-edited card holds."""
    return dict(value) if isinstance(value, dict) else {}


def _write_meta(folder: Path, meta: dict) -> None:
    tmp = folder / f".{adapters.META_FILE}.tmp"
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, folder / adapters.META_FILE)


def _model(model_id: str) -> str:
    try:
        return validate_model_id(model_id)
    except InvalidModelId as err:
        raise AdapterError(str(err)) from None


def _valid(name: str) -> bool:
    try:
        validate_adapter_name(name)
        return True
    except AdapterError:
        return False


def _safe_meta(folder: Path) -> dict:
    try:
        return adapters.adapter_meta(folder)
    except (OSError, ValueError):
        return {}
