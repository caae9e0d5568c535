"""The composer: multi-line input, reasoning mode (Auto / Reason / Fast), thinking budget, parallel answers, the
chat's skill adapter, Send (Ctrl+Enter) and Stop (Esc). Emits what the user asked for; knows nothing about models."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget

BUDGETS = [("128", 128), ("256", 256), ("512", 512), ("1024", 1024), ("Unlimited", None)]
MODE_LABELS = {"auto": "Auto", "reason": "Reason", "base": "Fast"}
MODE_TIP = "Auto: the switcher decides whether to think. Reason: always think. Fast: answer directly."
NO_ADAPTER = "None"
ADAPTER_TIP = "The skill adapter that answers in this chat (trained or imported in Tools ▸ Adapters…)."
NO_SKILLS_TIP = "This model has no skill adapters yet: train one (Tools ▸ Train an adapter…) or import one."


class Composer(QWidget):
    sendRequested = Signal(str)
    stopRequested = Signal()
    adapterChosen = Signal(object)
    """The user picked the chat's skill adapter: its name, or None."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.input = QPlainTextEdit(placeholderText="Ask anything…  (Ctrl+Enter to send, Esc to stop)")
        self.input.setMaximumHeight(110)
        self.mode = QComboBox()
        for key, label in MODE_LABELS.items():
            self.mode.addItem(label, key)
        self.mode.setToolTip(MODE_TIP)
        self.budget = QComboBox()
        for label, value in BUDGETS:
            self.budget.addItem(label, value)
        self.budget.setCurrentIndex(1)
        self.budget.setToolTip("Thinking budget in tokens: at the budget Ponder closes the trace and answers.")
        self.parallel = QSpinBox(minimum=1, maximum=8)
        self.parallel.setToolTip("Parallel answers: sample N, score them with the verifier, vote.")
        self.adapter = QComboBox()
        self.adapter.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.set_adapters([], None)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        row = QHBoxLayout()
        for label, widget in (("Mode", self.mode), ("Budget", self.budget), ("Answers", self.parallel),
                              ("Adapter", self.adapter)):
            row.addWidget(QLabel(label))
            row.addWidget(widget)
        row.addStretch(1)
        row.addWidget(self.stop_button)
        row.addWidget(self.send_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.input)
        layout.addLayout(row)
        self.send_button.clicked.connect(self._send)
        self.stop_button.clicked.connect(self.stopRequested)
        self.adapter.activated.connect(lambda _i: self.adapterChosen.emit(self.adapter.currentData()))
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self._send)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.stopRequested)

    def _send(self) -> None:
        text = self.input.toPlainText().strip()
        if text and self.send_button.isEnabled():
            self.input.clear()
            self.sendRequested.emit(text)

    def set_busy(self, busy: bool, ready: bool = True) -> None:
        """Send stays available while the model loads (the window keeps the question until it is ready)."""
        self.send_button.setEnabled(not busy)
        self.send_button.setToolTip("" if ready else "The model is not ready yet: the question waits for it")
        self.stop_button.setEnabled(busy)

    def set_reasoning_available(self, available: bool, why: str = "") -> None:
        """Enable or disable Auto and Reason; `why` (shown as their tooltip) says what would enable them."""
        for i in range(self.mode.count()):
            if self.mode.itemData(i) != "base":
                item = self.mode.model().item(i)
                item.setEnabled(available)
                item.setToolTip("" if available else why)
        self.mode.setToolTip(MODE_TIP if available or not why else f"{MODE_TIP}\n{why}")
        if not available:
            self.mode.setCurrentIndex(self.mode.findData("base"))

    def set_adapters(self, names: list[str], current: str | None) -> None:
        """The model's skill adapters to choose from (and None), with `current` selected; emits nothing."""
        self.adapter.blockSignals(True)
        self.adapter.clear()
        self.adapter.addItem(NO_ADAPTER, None)
        for name in names:
            self.adapter.addItem(name, name)
        self.adapter.setCurrentIndex(max(0, self.adapter.findData(current)) if current else 0)
        self.adapter.setEnabled(bool(names))
        self.adapter.setToolTip(ADAPTER_TIP if names else NO_SKILLS_TIP)
        self.adapter.blockSignals(False)

    def current_adapter(self) -> str | None:
        return self.adapter.currentData()

    def options(self) -> dict:
        return {"mode": self.mode.currentData(), "budget": self.budget.currentData(), "parallel": self.parallel.value()}

    def apply(self, mode: str, budget: int | None, parallel: int) -> None:
        self.mode.setCurrentIndex(max(0, self.mode.findData(mode)))
        self.budget.setCurrentIndex(max(0, self.budget.findData(budget)))
        self.parallel.setValue(parallel)
