"""Memory benchmark: resident memory of `ponder ask` and of the open window on the embedded model.

Each case runs in its own process so its peak is its own:
- `ask`: `ponder ask "What is 2+2?"` (load, one Fast answer, exit): peak RSS (ru_maxrss).
- `window`: the app's MainWindow offscreen: RSS once the model is ready, after answering "What is 2+2?", and the
  process peak.
`python -m bench.memory [--json]` writes bench/results/memory.json and memory.md. Target: ≤ 1.2 GB (issue #12).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import cpu_name
from models.registry import DEFAULT_MODEL_ID

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_MB = {DEFAULT_MODEL_ID: 1200, "qwen2.5-coder-1.5b-instruct": 2000}
"""Resident-memory targets: issue #12 for the 0.5B, issue #38 for the 1.5B (the window)."""
QUESTION = "What is 2+2?"


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def window_case(model_id: str) -> dict:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.chat_controller import ChatController
    from app.engine_service import EngineService
    from core.config import EngineConfig
    from core.memory import rss_mb
    from core.storage.chats import ChatStore
    from ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = ChatStore(Path(tmp) / "chats.db")
        service = EngineService(EngineConfig(model_id=model_id))
        window = MainWindow(service, ChatController(service, store))
        window.show()
        out["launch_rss_mb"] = rss_mb()
        if not loop.run_until_complete(service.start()):
            raise SystemExit("the embedded model could not be loaded (run `make model` first)")
        app.processEvents()
        out["ready_rss_mb"] = rss_mb()
        window.composer.apply("base", 256, 1)
        window.composer.input.setPlainText(QUESTION)
        window.composer.send_button.click()

        async def answered():
            end = time.perf_counter() + 300
            while not service.busy and time.perf_counter() < end:
                await asyncio.sleep(0.01)
            while service.busy and time.perf_counter() < end:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # the window renders the finished answer

        loop.run_until_complete(answered())
        out["answered_rss_mb"] = rss_mb()
        out["answer"] = window.controller.messages()[-1].content[:80]
        service.shutdown()
        window.close()
        store.close()
    out["peak_rss_mb"] = peak_mb()
    return out


def ask_case(model_id: str) -> dict:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "app", "ask", "--model", model_id, QUESTION], capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"ponder ask failed: {proc.stderr[-400:]}")
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "seconds": time.perf_counter() - started, "answer": proc.stdout.strip()[:80]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory")
    p.add_argument("--json", action="store_true")
    p.add_argument("--one", choices=("window",), help=argparse.SUPPRESS)
    p.add_argument("--model", default=DEFAULT_MODEL_ID, help="an installed model (default: the embedded 0.5B)")
    args = p.parse_args(argv)
    if args.one == "window":
        print(json.dumps(window_case(args.model)))
        return 0
    cases = {"ask": ask_case(args.model)}
    proc = subprocess.run([sys.executable, "-m", "bench.memory", "--one", "window", "--model", args.model],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"the window case failed: {proc.stderr[-600:]}")
    cases["window"] = json.loads(proc.stdout.strip().splitlines()[-1])
    worst = max(cases["ask"]["peak_rss_mb"], cases["window"]["peak_rss_mb"], cases["window"]["answered_rss_mb"])
    target = TARGET_MB.get(args.model, TARGET_MB[DEFAULT_MODEL_ID])
    summary = {"cpu": cpu_name(), "model": args.model, "cases": cases, "target_mb": target, "met": worst <= target}
    RESULTS.mkdir(exist_ok=True)
    name = "memory" if args.model == DEFAULT_MODEL_ID else f"memory_{args.model}"
    (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=2))
    w = cases["window"]
    md = [f"CPU: {summary['cpu']}", "", "| case | launch MB | ready MB | after one answer MB | peak MB |",
          "|---|---:|---:|---:|---:|",
          f"| `ponder ask \"{QUESTION}\"` | | | | {cases['ask']['peak_rss_mb']:.0f} |",
          f"| window | {w['launch_rss_mb']:.0f} | {w['ready_rss_mb']:.0f} | {w['answered_rss_mb']:.0f} | "
          f"{w['peak_rss_mb']:.0f} |", "", f"{args.model}: target ≤ {target} MB: {'met' if summary['met'] else 'not met'}."]
    (RESULTS / f"{name}.md").write_text("\n".join(md) + "\n")
    print(json.dumps(summary) if args.json else "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
