"""core/ and models/ never import Qt; models/ imports nothing from core/app/ui; ui/ reaches the model and the chat
database only through app services (it may use core's plain value types: core.events, core.config). Inside core/
the packages are layered (CORE_LAYERS: each imports only its own layer and those below) and no modules anywhere
import each other in a circle, function-level imports included."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UI_MAY_IMPORT_FROM_CORE = ("core.events", "core.config")
CORE_LAYERS = (
    ("core.config", "core.events", "core.memory", "core.storage"),
    ("core.prompting", "core.reasoning"),
    ("core.decode", "core.adapters", "core.data"),
    ("core.sparse",),
    ("core.engine", "core.kept_traces"),
    ("core.loading", "core.machine_fit", "core.tiny"),
    ("core.evaluation",),
    ("core.training",),
)
"""core's packages and top-level modules, lowest first."""
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
    core.x as well as core. Relative imports are resolved against the file's package."""
    package = path.relative_to(ROOT).parent.parts if path.is_relative_to(ROOT) else ()
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.level == 0 or package):
            base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            if node.level == 0:
                base = node.module or ""
            if base:
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_core_and_models_never_import_qt():
    bad = [(f, m) for pkg in ("core", "models") for f, m in imports(pkg)
           if m.split(".")[0] in ("PySide6", "qasync", "shiboken6")]
    assert bad == []


def test_models_is_a_leaf():
    assert [(f, m) for f, m in imports("models") if m.split(".")[0] in ("core", "app", "ui")] == []


def test_ui_never_touches_engine_or_loading():
    assert [(f, m) for f, m in imports("ui") if m in ("core.engine", "core.loading", "core.storage.model_store")] == []


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
    bad.write_text("from core.storage import paths\n"
                   "def export(self, cid):\n"
                   "    from core.storage.chats import export_markdown\n"
                   "    title = self.controller.store.db['conversations'].get(cid)['title']\n"
                   "    return export_markdown(self.controller.store, cid), paths.data_dir(), title\n")
    good = tmp_path / "good_widget.py"
    good.write_text("from core.events import Answer\nfrom core.config import SamplingConfig\n"
                    "def f(self):\n    return self.controller.conversations()\n")
    assert {m for _, m in ui_core_imports([bad])} >= {"core.storage.paths", "core.storage.chats"}
    assert {n for _, _, n in ui_store_access([bad])} >= {"store", "db", "export_markdown"}
    assert ui_core_imports([good]) == [] and ui_store_access([good]) == []


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(packages=("core", "models", "app", "ui", "bench")) -> dict[str, set[str]]:
    """module -> the project modules it imports (any depth), by dotted name."""
    files = {module_name(p): p for pkg in packages for p in (ROOT / pkg).rglob("*.py")}
    return {name: {m for m in imported_modules(path) if m in files and m != name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int | None:
    for rank, names in enumerate(CORE_LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return rank
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if a.startswith("core.") and b.startswith("core.") and layer_of(b) > layer_of(a))


def test_no_module_imports_in_a_circle():
    assert cycles(import_graph()) == []


def test_every_core_module_has_a_layer_and_imports_only_downward():
    graph = import_graph(("core",))
    assert [m for m in graph if m != "core" and layer_of(m) is None] == []
    assert upward_imports(graph) == []


def test_the_layer_checks_catch_a_circle_and_an_upward_import():
    graph = {"core.engine": {"core.loading"}, "core.loading": {"core.engine"}, "core.decode.rows": {"core.decode.cache"}}
    assert cycles(graph) == [["core.engine", "core.loading"]]
    assert upward_imports(graph) == [("core.engine", "core.loading")]
