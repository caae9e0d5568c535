"""`ponder adapters list|import|export|remove|rename`: the adapter library on the command line.

Errors are one line on stderr with exit code 2 (a bad name, a refused import) or 1 (a file system error).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.adapters.cards import AdapterCard, AdapterError
from core.adapters.library import AdapterLibrary


def add_parser(sub) -> None:
    p = sub.add_parser("adapters", help="the adapter library: list, import, export, remove, rename")
    asub = p.add_subparsers(dest="adapters_command", metavar="ACTION")
    ls = asub.add_parser("list", help="adapters of the installed models (the default action)")
    ls.add_argument("--model", default=None, help="only this model's adapters")
    ls.add_argument("--json", action="store_true", help="print one JSON list")
    imp = asub.add_parser("import", help="import an adapter folder or .zip")
    imp.add_argument("path")
    imp.add_argument("--name", default=None, help="library name (default: the adapter's own, or the file name)")
    imp.add_argument("--model", default=None, help="the base model (default: the one the adapter names)")
    exp = asub.add_parser("export", help="export an adapter to a .zip or a folder")
    exp.add_argument("name")
    exp.add_argument("dest", help="a path ending in .zip, or a folder")
    exp.add_argument("--model", default=None, help="the base model (needed when several have NAME)")
    rm = asub.add_parser("remove", help="delete an adapter from the library")
    rm.add_argument("name")
    rm.add_argument("--model", default=None, help="the base model (needed when several have NAME)")
    rn = asub.add_parser("rename", help="rename an adapter")
    rn.add_argument("old")
    rn.add_argument("new")
    rn.add_argument("--model", default=None, help="the base model (needed when several have OLD)")


def find(library: AdapterLibrary, name: str, model_id: str | None) -> AdapterCard:
    """The card named `name` of `model_id`, or of the one model that has an adapter of that name."""
    if model_id is not None:
        return library.get(model_id, name)
    found = [c for c in library.list() if c.name == name]
    if not found:
        raise AdapterError(f"There is no adapter '{name}' (`ponder adapters list` shows them).")
    if len({c.base_model for c in found}) > 1:
        models = ", ".join(sorted({c.base_model for c in found}))
        raise AdapterError(f"Several models have an adapter '{name}' ({models}); say which with --model.")
    return found[0]


def _metrics(card: AdapterCard) -> str:
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in card.metrics.items()
                     if isinstance(v, (int, float, str))) or "-"


def cmd_adapters(args: argparse.Namespace) -> int:
    try:
        return _run(args, AdapterLibrary())
    except AdapterError as err:
        print(f"ponder: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"ponder: {err.strerror or err}{f': {err.filename}' if err.filename else ''}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, library: AdapterLibrary) -> int:
    action = args.adapters_command or "list"
    if action == "list":
        cards = library.list(getattr(args, "model", None))
        if getattr(args, "json", False):
            print(json.dumps([c.to_dict() for c in cards], ensure_ascii=False))
            return 0
        if not cards:
            print("No adapters. `ponder train sft --name NAME` or `ponder adapters import PATH` adds one.")
        for c in cards:
            print(f"{c.name:24s} {c.kind:9s} {c.base_model:32s} {'built-in' if c.builtin else 'library ':8s} "
                  f"{c.created[:16]:16s}  {_metrics(c)}")
        return 0
    if action == "import":
        card = library.import_path(Path(args.path), args.model, args.name)
        print(f"Imported '{card.name}' ({card.kind} adapter for {card.base_model}) into {card.folder}")
    elif action == "export":
        card = find(library, args.name, args.model)
        print(f"Exported '{card.name}' to {library.export(card.base_model, card.name, Path(args.dest))}")
    elif action == "remove":
        card = find(library, args.name, args.model)
        library.remove(card.base_model, card.name)
        print(f"Removed '{card.name}' ({card.base_model}).")
    elif action == "rename":
        card = find(library, args.old, args.model)
        card = library.rename(card.base_model, card.name, args.new)
        print(f"Renamed '{args.old}' to '{card.name}' ({card.base_model}).")
    return 0


def ask_adapter(model_id: str, name: str) -> AdapterCard:
    """The library adapter `ponder ask --adapter NAME` uses (skill: answers; reasoning: thinks)."""
    return AdapterLibrary().get(model_id, name)
