"""core/ and models/ never import Qt; models/ imports nothing from core/app/ui; ui/ reaches the model and the chat
database only through app services (it may use core's plain value types: core.events, core.config)."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UI_MAY_IMPORT_FROM_CORE = ("core.events", "core.config")
STORE_NAMES = ("store", "_store", "db", "ChatStore", "ReplyWriter", "export_markdown", "export_json")


def imports(package: str) -> list[tuple[str, str]]:
    found = []
    for path in (ROOT / package).rglob("*.py"):
        for line in path.read_text().splitlines():
            m = re.match(r"\s*(?:from|import)\s+([\w.]+)", line)
            if m:
                found.append((str(path.relative_to(ROOT)), m.group(1)))
    return found


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports too); `from core import x` counts as
    core.x as well as core."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_core_and_models_never_import_qt():
    bad = [(f, m) for pkg in ("core", "models") for f, m in imports(pkg)
           if m.split(".")[0] in ("PySide6", "qasync", "shiboken6")]
    assert bad == []


def test_models_is_a_leaf():
    assert [(f, m) for f, m in imports("models") if m.split(".")[0] in ("core", "app", "ui")] == []


def test_ui_never_touches_engine_or_loading():
    assert [(f, m) for f, m in imports("ui") if m in ("core.engine", "core.loading", "core.model_store")] == []


def ui_core_imports(files) -> list[tuple[str, str]]:
    bad = []
    for path in files:
        for module in sorted(imported_modules(path)):
            if module.split(".")[0] != "core" or module == "core":
                continue
            if not any(module == ok or module.startswith(ok + ".") for ok in UI_MAY_IMPORT_FROM_CORE):
                bad.append((path.name, module))
    return bad


def ui_store_access(files) -> list[tuple[str, int, str]]:
    """Attribute access to a store object (`x.store`, `x.db`), or the store's classes and exporters by name."""
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in STORE_NAMES:
                bad.append((path.name, node.lineno, name))
    return bad


def test_ui_imports_only_core_value_types():
    assert ui_core_imports(sorted((ROOT / "ui").rglob("*.py"))) == []


def test_ui_never_touches_the_chat_store():
    assert ui_store_access(sorted((ROOT / "ui").rglob("*.py"))) == []


def test_the_ui_checks_catch_what_they_are_for(tmp_path):
    """The checks above flag the patterns that used to be in ui/main_window.py."""
    bad = tmp_path / "bad_widget.py"
    bad.write_text("from core import paths\n"
                   "def export(self, cid):\n"
                   "    from core.store import export_markdown\n"
                   "    title = self.controller.store.db['conversations'].get(cid)['title']\n"
                   "    return export_markdown(self.controller.store, cid), paths.data_dir(), title\n")
    good = tmp_path / "good_widget.py"
    good.write_text("from core.events import Answer\nfrom core.config import SamplingConfig\n"
                    "def f(self):\n    return self.controller.conversations()\n")
    assert {m for _, m in ui_core_imports([bad])} >= {"core.paths", "core.store"}
    assert {n for _, _, n in ui_store_access([bad])} >= {"store", "db", "export_markdown"}
    assert ui_core_imports([good]) == [] and ui_store_access([good]) == []
