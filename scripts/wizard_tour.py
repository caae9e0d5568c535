"""The proof run of the fine-tuning wizard on the embedded 0.5B: from a JSONL file to an adapter answering in a
chat, entirely through the window (offscreen), timed, with a screenshot of every page in docs/wizard/.

    .venv/bin/python scripts/wizard_tour.py [--data FILE] [--preset quick] [--name gsm8k-style]

Without --data it writes a demo file: 120 GSM8K *train* questions with their short worked answers (calculator
notes removed, `#### n` at the end), so the skill the adapter learns — GSM8K's answer format — is visible in
the chat and checkable.
Writes docs/wizard/*.png and docs/wizard/timing.json (CPU named). Uses the real `ponder train sft` subprocess.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DOCS = ROOT / "docs" / "wizard"
GSM8K_TRAIN = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
CALCULATOR_NOTES = re.compile(r"<<[^>]*>>")
QUESTION = "A baker makes 24 muffins and sells them in boxes of 4. Each box costs $3. How much money does she make?"


def demo_data(path: Path, n: int = 120) -> Path:
    rows = []
    with open(GSM8K_TRAIN, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            answer = CALCULATOR_NOTES.sub("", row["answer"])  # GSM8K's <<48/2=24>> annotations are noise to a reader
            if len(answer) <= 260:  # short worked answers: a Quick run fits them in its token cap
                rows.append({"question": row["question"], "answer": answer})
            if len(rows) >= n:
                break
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


async def until(predicate, timeout: float, what: str, step: float = 0.1):
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(step)


def shot(widget, name: str) -> None:
    widget.grab().save(str(DOCS / f"{name}.png"))
    print(f"screenshot {name}", flush=True)


async def tour(window, app, data: Path, preset: str, name: str) -> dict:
    from PySide6.QtWidgets import QWizard

    t = {}
    start = time.monotonic()
    window.open_train_wizard()
    w = window.train_wizard
    w.resize(900, 700)
    w.show()
    page = w.data_page
    page.path_edit.setText(str(data))
    page.kind.setCurrentIndex(page.kind.findData("skill"))
    before = page._check_id
    page.check_button.click()
    await until(lambda: page._check_id > before and page.check_button.isEnabled(), 120, "the data check")
    t["data_checked_s"] = time.monotonic() - start
    app.processEvents()
    shot(w, "1-data")
    w.next()
    recipe = w.recipe_page
    recipe.name.setText(name)
    button = next(b for b in recipe.presets.buttons() if b.property("preset") == preset)
    button.click()
    recipe.estimate_button.click()
    await until(lambda: recipe.estimate_button.isEnabled(), 600, "the time estimate")
    t["estimate_text"] = recipe.estimate_label.text()
    t["estimated_s"] = time.monotonic() - start
    shot(w, "2-recipe")
    w.next()
    panel = w.train_page.panel
    train_start = time.monotonic()
    halfway = False
    while panel.state == "running" or not panel.events:
        await asyncio.sleep(0.5)
        if not halfway and panel.bar.maximum() and panel.bar.value() >= panel.bar.maximum() // 2:
            shot(w, "3-train")
            halfway = True
        if time.monotonic() - train_start > 1800:
            raise TimeoutError("training took over 30 minutes")
    if panel.state != "done":
        raise RuntimeError(f"training ended as {panel.state}: {panel.status.text()} {panel.stderr.toPlainText()[-800:]}")
    t["train_s"] = time.monotonic() - train_start
    if not halfway:
        shot(w, "3-train")
    w.next()
    await asyncio.sleep(0.5)
    shot(w, "5-evaluate")
    evaluate = w.currentPage()
    t["eval_event"] = next((e for e in panel.events if e.get("event") == "eval"), None)
    evaluate.use_button.click()
    t["adapter_in_chat_s"] = time.monotonic() - start
    w.button(QWizard.WizardButton.FinishButton).click()
    window.composer.apply("base", 256, 1)
    window.composer.input.setPlainText(QUESTION)
    window.composer.send_button.click()
    await until(lambda: window.service.busy, 60, "the answer to start")
    await until(lambda: not window.service.busy, 600, "the answer")
    await asyncio.sleep(0.5)
    reply = window.controller.messages()[-1]
    t["answered_s"] = time.monotonic() - start
    t["answer"] = reply.content
    t["answered_by"] = reply.meta.get("adapter")
    shot(window, "6-chat")
    return t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/wizard_tour.py")
    p.add_argument("--data", type=Path)
    p.add_argument("--preset", default="quick")
    p.add_argument("--name", default="gsm8k-style")
    args = p.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    DOCS.mkdir(parents=True, exist_ok=True)

    import qasync
    from PySide6.QtWidgets import QApplication

    from app.chat_controller import ChatController
    from app.engine_service import EngineService
    from app.model_service import ModelService
    from bench.machine import cpu_name
    from core.config import EngineConfig
    from core.storage.chats import ChatStore
    from ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    from core.adapters.cards import AdapterError
    from core.adapters.library import AdapterLibrary
    from core.storage.paths import data_dir

    try:  # a rerun trains the demo adapter again under the same name, from scratch
        AdapterLibrary().remove(EngineConfig().model_id, args.name)
    except AdapterError:
        pass
    shutil.rmtree(data_dir() / "training" / args.name, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or demo_data(Path(tmp) / "gsm8k_style.jsonl")
        store = ChatStore(Path(tmp) / "chats.db")
        service = EngineService(EngineConfig())
        window = MainWindow(service, ChatController(service, store), ModelService())
        window.resize(1200, 800)
        window.show()
        if not loop.run_until_complete(service.start()):
            raise SystemExit("the embedded model could not be loaded (run `make model` first)")
        window.new_chat()
        timing = loop.run_until_complete(tour(window, app, data, args.preset, args.name))
        service.shutdown()
        window.close()
        store.close()
    timing.update(cpu=cpu_name(), cores=os.cpu_count(), preset=args.preset, data=str(args.data or "demo: 120 GSM8K train rows"))
    (DOCS / "timing.json").write_text(json.dumps(timing, indent=2))
    print(json.dumps({k: v for k, v in timing.items() if k != "eval_event"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
