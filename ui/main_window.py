"""The main window: transcript, composer, send/stop, and model status. Layout and wiring only.

Talks to the model through an injected EngineService (signals in, async calls out).
"""
from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from core.config import SamplingConfig

STAGES = {"assemble": "Assembling the embedded model", "convert": "Converting the model (once)",
          "quantize": "Quantizing to 4 bits (once)", "download": "Downloading", "copy": "Copying"}


class MainWindow(QMainWindow):
    def __init__(self, service, parent=None):
        super().__init__(parent)
        self.service = service
        self.messages: list[dict] = []
        self.current = ""
        self._tasks: set[asyncio.Task] = set()
        self.setWindowTitle("Ponder")
        self.resize(900, 700)

        self.transcript = QTextBrowser(openExternalLinks=False)
        self.composer = QPlainTextEdit(placeholderText="Ask anything… (Ctrl+Enter to send, Esc to stop)")
        self.composer.setMaximumHeight(120)
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.new_button = QPushButton("New chat")
        self.progress_bar = QProgressBar()
        self.progress_bar.setVisible(False)
        self.status = QLabel("Starting…")

        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button)
        buttons.addStretch(1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        layout = QVBoxLayout()
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.progress_bar)
        layout.addWidget(self.composer)
        layout.addLayout(buttons)
        central = QWidget()
        central.setLayout(layout)
        self.setCentralWidget(central)
        self.statusBar().addWidget(self.status, 1)

        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.service.cancel)
        self.new_button.clicked.connect(self.new_chat)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.send)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.service.cancel)

        service.stateChanged.connect(self.on_state)
        service.progress.connect(self.on_progress)
        service.busyChanged.connect(self.on_busy)
        service.tokenReceived.connect(self.on_token)
        service.answerFinished.connect(self.on_answer)
        service.failed.connect(self.on_failed)
        self.on_busy(False)

    # --- slots -----------------------------------------------------------------------------------------
    def on_state(self, state: str) -> None:
        text = {"loading": "Loading model…", "ready": f"Ready — {self.service.model_name}", "error": "Model failed to load"}
        self.status.setText(text.get(state, state))
        if state != "loading":
            self.progress_bar.setVisible(False)
        self.on_busy(self.service.busy)

    def on_progress(self, stage: str, done: int, total: int) -> None:
        self.progress_bar.setVisible(True)
        self.progress_bar.setFormat(f"{STAGES.get(stage, stage)} %p%")
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(int(1000 * done / total) if total else 0)

    def on_busy(self, busy: bool) -> None:
        self.send_button.setEnabled(not busy and self.service.ready)
        self.stop_button.setEnabled(busy)

    def on_token(self, event) -> None:
        self.current += event.text
        self.render()

    def on_answer(self, answer) -> None:
        if answer is None:
            return
        self.messages.append({"role": "assistant", "content": answer.text})
        self.current = ""
        s = answer.stats
        note = " (stopped)" if answer.finish_reason == "cancelled" else ""
        self.status.setText(f"{answer.model}: {s.completion_tokens} tokens, TTFT {s.ttft_s:.2f}s, "
                            f"{s.decode_tok_s:.1f} tok/s{note}")
        self.render()

    def on_failed(self, message: str) -> None:
        self.status.setText(f"Error: {message}")
        self.transcript.append(f"<p style='color:#b00020'><b>Error:</b> {message}</p>")

    # --- actions ---------------------------------------------------------------------------------------
    def send(self) -> None:
        text = self.composer.toPlainText().strip()
        if not text or self.service.busy or not self.service.ready:
            return
        self.composer.clear()
        self.messages.append({"role": "user", "content": text})
        self.current = ""
        self.render()
        task = asyncio.ensure_future(self.service.ask(list(self.messages), SamplingConfig()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def new_chat(self) -> None:
        self.service.cancel()
        self.messages.clear()
        self.current = ""
        self.render()

    def render(self) -> None:
        parts = []
        for m in self.messages:
            who = "**You**" if m["role"] == "user" else "**Ponder**"
            parts.append(f"{who}\n\n{m['content']}")
        if self.service.busy or self.current:
            parts.append(f"**Ponder**\n\n{self.current}▌")
        self.transcript.setMarkdown("\n\n---\n\n".join(parts))
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())
