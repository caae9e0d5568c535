"""core/ and models/ never import Qt; models/ imports nothing from core/app/ui; ui/ never reaches the engine."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports(package: str) -> list[tuple[str, str]]:
    found = []
    for path in (ROOT / package).rglob("*.py"):
        for line in path.read_text().splitlines():
            m = re.match(r"\s*(?:from|import)\s+([\w.]+)", line)
            if m:
                found.append((str(path.relative_to(ROOT)), m.group(1)))
    return found


def test_core_and_models_never_import_qt():
    bad = [(f, m) for pkg in ("core", "models") for f, m in imports(pkg)
           if m.split(".")[0] in ("PySide6", "qasync", "shiboken6")]
    assert bad == []


def test_models_is_a_leaf():
    assert [(f, m) for f, m in imports("models") if m.split(".")[0] in ("core", "app", "ui")] == []


def test_ui_never_touches_engine_or_loading():
    assert [(f, m) for f, m in imports("ui") if m in ("core.engine", "core.loading", "core.model_store")] == []
