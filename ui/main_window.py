"""The main window: sidebar | transcript + composer, status bar with model state and undo. Layout and wiring
only; behaviour lives in app.chat_controller and app.engine_service, injected by the constructor."""
from __future__ import annotations

import asyncio
import base64
import re

from PySide6.QtCore import QByteArray
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import QLabel, QMainWindow, QProgressBar, QPushButton, QSplitter, QVBoxLayout, QWidget

from .chat_view import ChatView, details_text
from .composer import Composer
from .dialogs import EditDialog, ExportDialog, RenameDialog, show_info
from .sidebar import Sidebar

STAGES = {"assemble": "Assembling the embedded model", "convert": "Converting the model (once)",
          "quantize": "Quantizing to 4 bits (once)", "download": "Downloading", "copy": "Copying", "verify": "Verifying"}


class MainWindow(QMainWindow):
    def __init__(self, service, controller, parent=None):
        super().__init__(parent)
        self.service, self.controller = service, controller
        self._tasks: set[asyncio.Task] = set()
        self.setWindowTitle("Ponder")
        self.resize(1100, 760)
        self.sidebar = Sidebar()
        self.view = ChatView()
        self.composer = Composer()
        self.progress_bar = QProgressBar(visible=False)
        right = QWidget()
        col = QVBoxLayout(right)
        col.addWidget(self.view, 1)
        col.addWidget(self.progress_bar)
        col.addWidget(self.composer)
        split = QSplitter()
        split.addWidget(self.sidebar)
        split.addWidget(right)
        split.setSizes([260, 840])
        self.setCentralWidget(split)
        self.status = QLabel("Starting…")
        self.undo_button = QPushButton("Undo delete", visible=False)
        self.statusBar().addWidget(self.status, 1)
        self.statusBar().addPermanentWidget(self.undo_button)
        self._wire()
        self._restore_settings()
        self.refresh_conversations()
        self.render()

    def _wire(self) -> None:
        s, c = self.service, self.controller
        s.stateChanged.connect(self.on_state)
        s.progress.connect(self.on_progress)
        s.busyChanged.connect(self.on_busy)
        s.failed.connect(self.on_failed)
        s.answerFinished.connect(self.on_answer)
        c.conversationsChanged.connect(self.refresh_conversations)
        c.messagesChanged.connect(self.render)
        c.liveUpdated.connect(lambda live: self.render())
        c.notice.connect(lambda text: show_info(self, "Ponder", text))
        self.sidebar.newRequested.connect(c.new_chat)
        self.sidebar.selected.connect(c.open)
        self.sidebar.searchChanged.connect(self.on_search)
        self.sidebar.renameRequested.connect(self.rename)
        self.sidebar.deleteRequested.connect(self.delete)
        self.sidebar.exportRequested.connect(self.export)
        self.composer.sendRequested.connect(lambda text: self.spawn(c.send(text, self.options())))
        self.composer.stopRequested.connect(s.cancel)
        self.view.action.connect(self.on_action)
        self.undo_button.clicked.connect(self.undo_delete)
        QShortcut(QKeySequence("Ctrl+N"), self, activated=c.new_chat)
        QShortcut(QKeySequence("Ctrl+F"), self, activated=self.sidebar.search.setFocus)
        self.on_busy(False)

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # keep a reference until it finishes
        task.add_done_callback(self._tasks.discard)
        return task

    def options(self):
        from app.chat_controller import ReplyOptions

        o = self.composer.options()
        self.controller.store.set_setting("composer", o)
        return ReplyOptions(mode=o["mode"], budget=o["budget"], parallel=o["parallel"],
                            temperature=0.7 if o["parallel"] > 1 else 0.3)

    # --- state ---------------------------------------------------------------------------------------
    def on_state(self, state: str) -> None:
        text = {"loading": "Loading model…", "ready": f"Ready — {self.service.model_name}",
                "error": "The model failed to load"}
        self.status.setText(text.get(state, state))
        if state != "loading":
            self.progress_bar.setVisible(False)
        if state == "ready":
            self.composer.set_reasoning_available(self.service.can_reason)
            saved = self.controller.store.get_setting("composer")
            if saved and self.service.can_reason:
                self.composer.apply(saved["mode"], saved["budget"], saved["parallel"])
        self.on_busy(self.service.busy)

    def on_progress(self, stage: str, done: int, total: int) -> None:
        self.progress_bar.setVisible(True)
        self.progress_bar.setFormat(f"{STAGES.get(stage, stage)} %p%")
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(int(1000 * done / total) if total else 0)

    def on_busy(self, busy: bool) -> None:
        self.composer.set_busy(busy, self.service.ready)

    def on_failed(self, message: str) -> None:
        self.status.setText(f"Error: {message}")

    def on_answer(self, answer) -> None:
        if answer is None:
            return
        s = answer.stats
        note = " (stopped)" if answer.finish_reason == "cancelled" else ""
        self.status.setText(f"{answer.model}: {s.completion_tokens} tokens, TTFT {s.ttft_s:.2f}s, "
                            f"{s.decode_tok_s:.1f} tok/s{note}")

    # --- conversations -------------------------------------------------------------------------------
    def refresh_conversations(self) -> None:
        if self.sidebar.search.text().strip():
            self.on_search(self.sidebar.search.text())
        else:
            self.sidebar.show_conversations(self.controller.store.conversations(), self.controller.current)

    def on_search(self, text: str) -> None:
        if text.strip():
            self.sidebar.show_results(self.controller.store.search(text))
        else:
            self.sidebar.show_conversations(self.controller.store.conversations(), self.controller.current)

    def rename(self, cid: str) -> None:
        current = self.controller.store.db["conversations"].get(cid)["title"]
        title = RenameDialog.ask(self, current)
        if title:
            self.controller.rename(cid, title)

    def delete(self, cid: str) -> None:
        self.controller.delete(cid)
        self.undo_button.setVisible(True)
        self.status.setText("Chat deleted.")

    def undo_delete(self) -> None:
        if self.controller.undo_delete():
            self.status.setText("Chat restored.")
        self.undo_button.setVisible(False)

    def export(self, cid: str, fmt: str) -> None:
        from core.store import export_json, export_markdown

        title = self.controller.store.db["conversations"].get(cid)["title"]
        safe = re.sub(r"[^\w\- ]+", "", title).strip() or "chat"
        path = ExportDialog.ask(self, f"{safe}.{fmt}", fmt)
        if path:
            text = export_markdown(self.controller.store, cid) if fmt == "md" else export_json(self.controller.store, cid)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            self.status.setText(f"Exported to {path}")

    # --- transcript actions --------------------------------------------------------------------------
    def render(self) -> None:
        self.view.render(self.controller.messages(), self.controller.live, self.service.busy)

    def on_action(self, verb: str, args: list) -> None:
        msgs = {m.id: m for m in self.controller.messages()}
        if verb == "toggle":
            self.render()
        elif verb == "copy":
            QGuiApplication.clipboard().setText(msgs[int(args[0])].content)
        elif verb == "copycode":
            QGuiApplication.clipboard().setText(self.view.code_blocks.get(args[0], ""))
        elif verb == "details":
            show_info(self, "Answer details", details_text(msgs[int(args[0])]))
        elif verb == "regen":
            self.spawn(self.controller.regenerate(self.options()))
        elif verb == "longer":
            self.spawn(self.controller.think_longer(256))
        elif verb == "pick":
            self.controller.pick_candidate(int(args[0]), int(args[1]))
        elif verb == "edit":
            m = msgs[int(args[0])]
            text = EditDialog.ask(self, m.content)
            if text:
                self.spawn(self.controller.edit_and_resend(m.id, text, self.options()))

    # --- window state --------------------------------------------------------------------------------
    def _restore_settings(self) -> None:
        geometry = self.controller.store.get_setting("window_geometry")
        if geometry:
            self.restoreGeometry(QByteArray(base64.b64decode(geometry)))

    def closeEvent(self, event) -> None:
        self.service.cancel()
        geometry = bytes(self.saveGeometry().data())
        self.controller.store.set_setting("window_geometry", base64.b64encode(geometry).decode())
        super().closeEvent(event)

