"""The composer: a growing input (one line, up to MAX_LINES, then it scrolls), compact controls for the
reasoning mode (Auto / Reason / Fast), thinking budget, parallel answers and the chat's skill adapter, Send
and Stop (Esc). Ctrl+Enter always sends; with "Enter sends" on, Enter sends and Shift+Enter starts a new line.
Emits what the user asked for; knows nothing about models."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from .theme import set_text_size

BUDGETS = [("128", 128), ("256", 256), ("512", 512), ("1024", 1024), ("Unlimited", None)]
MODE_LABELS = {"auto": "Auto", "reason": "Reason", "base": "Fast"}
BUDGET_TIP = "Thinking budget in tokens: at the budget Ponder closes the trace and answers."
MODE_TIP = "Auto: the switcher decides whether to think. Reason: always think. Fast: answer directly."
NO_ADAPTER = "None"
ADAPTER_TIP = "The skill adapter that answers in this chat (trained or imported in Tools ▸ Adapters…)."
NO_SKILLS_TIP = "This model has no skill adapters yet: train one (Tools ▸ Train an adapter…) or import one."
MAX_LINES = 8


class ComposerInput(QPlainTextEdit):
    """The message box: grows with its lines (wrapped ones included) up to MAX_LINES; Enter handling."""

    submitted = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.enter_sends = False
        self.setTabChangesFocus(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("Message")
        self.document().documentLayout().documentSizeChanged.connect(self.fit)
        self.fit()

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
            if mods & Qt.KeyboardModifier.ControlModifier or (self.enter_sends and not mods):
                self.submitted.emit()
                return
            if mods & Qt.KeyboardModifier.ShiftModifier or not mods:
                self.insertPlainText("\n")  # a real newline (Qt's Shift+Enter would insert U+2028)
                return
        super().keyPressEvent(event)

    def lines(self) -> int:
        """Visual lines of the text (wrapped lines count), at least 1."""
        return max(1, round(self.document().documentLayout().documentSize().height()))

    def fit(self, *_args) -> None:
        """Height for min(lines, MAX_LINES) lines plus the frame."""
        shown = min(self.lines(), MAX_LINES)
        margins = self.contentsMargins()
        doc = 2 * self.document().documentMargin()
        self.setFixedHeight(int(shown * self.fontMetrics().lineSpacing() + doc + margins.top() + margins.bottom()
                                + 2 * self.frameWidth()) + 4)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.fit()

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (event.Type.FontChange, event.Type.StyleChange):
            self.fit()


def _muted(text: str) -> QLabel:
    label = QLabel(text, objectName="muted")
    return label


class Composer(QWidget):
    sendRequested = Signal(str)
    stopRequested = Signal()
    adapterChosen = Signal(object)
    """The user picked the chat's skill adapter: its name, or None."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.input = ComposerInput()
        self.mode = QComboBox()
        for key, label in MODE_LABELS.items():
            self.mode.addItem(label, key)
        self.mode.setToolTip(MODE_TIP)
        self.mode.setAccessibleName("Reasoning mode")
        self.budget = QComboBox()
        for label, value in BUDGETS:
            self.budget.addItem(label, value)
        self.budget.setCurrentIndex(1)
        self.budget.setToolTip(BUDGET_TIP)
        self.budget.setAccessibleName("Thinking budget")
        self.parallel = QSpinBox(minimum=1, maximum=8)
        self.parallel.setToolTip("Parallel answers: sample N, score them with the verifier, vote.")
        self.parallel.setAccessibleName("Parallel answers")
        self.adapter = QComboBox()
        self.adapter.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.adapter.setAccessibleName("Skill adapter")
        self.set_adapters([], None)
        self.send_button = QPushButton("Send", objectName="primary")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.setToolTip("Stop the answer (Esc)")
        row = QHBoxLayout()
        row.setSpacing(6)
        for label, widget in (("Mode", self.mode), ("Budget", self.budget), ("Answers", self.parallel),
                              ("Adapter", self.adapter)):
            tag = _muted(label)
            tag.setBuddy(widget)
            tag.setToolTip(widget.toolTip())
            row.addWidget(tag)
            row.addWidget(widget)
            row.addSpacing(6)
        row.addStretch(1)
        row.addWidget(self.stop_button)
        row.addWidget(self.send_button)
        box = QFrame(objectName="composerBox")
        inner = QVBoxLayout(box)
        inner.setContentsMargins(0, 0, 0, 0)
        inner.setSpacing(6)
        inner.addWidget(self.input)
        inner.addLayout(row)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(box)
        self.set_enter_sends(False)
        self.input.submitted.connect(self._send)
        self.send_button.clicked.connect(self._send)
        self.stop_button.clicked.connect(self.stopRequested)
        self.adapter.activated.connect(lambda _i: self.adapterChosen.emit(self.adapter.currentData()))
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self._send_key)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self._stop_key)

    def _send_key(self) -> None:
        if not self._elsewhere():
            self._send()

    def _stop_key(self) -> None:
        if not self._elsewhere():
            self.stopRequested.emit()

    def _elsewhere(self) -> bool:
        """Focus is in an editable text field outside the composer (a chat title, the search box): the window's
        Ctrl+Enter and Esc are not the composer's there (those fields handle the keys they use themselves)."""
        focus = QApplication.focusWidget()
        if focus is None or focus is self or self.isAncestorOf(focus):
            return False
        return isinstance(focus, QLineEdit | QAbstractSpinBox | QPlainTextEdit | QTextEdit) and not focus.isReadOnly()

    def _send(self) -> None:
        text = self.input.toPlainText().strip()
        if text and self.send_button.isEnabled():
            self.input.clear()
            self.sendRequested.emit(text)

    def set_enter_sends(self, on: bool) -> None:
        """Enter sends (Shift+Enter: new line), or Enter is a new line; Ctrl+Enter sends either way."""
        self.input.enter_sends = bool(on)
        keys = "Enter to send, Shift+Enter for a new line" if on else "Ctrl+Enter to send"
        self.input.setPlaceholderText(f"Ask anything…  ({keys}, Esc to stop)")
        self.send_button.setToolTip("Send (Enter or Ctrl+Enter)" if on else "Send (Ctrl+Enter)")

    def set_font_size(self, points: int) -> None:
        set_text_size(self.input, points)

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

    def set_budget_note(self, note: str) -> None:
        """Add what the budgets measured on the loaded model (settings.budget_note) to the budget's tooltip."""
        self.budget.setToolTip(f"{BUDGET_TIP}\n{note}" if note else BUDGET_TIP)

    def set_mode(self, mode: str) -> bool:
        """Select `mode` when it is available; False (mode unchanged) when it is disabled."""
        index = self.mode.findData(mode)
        if index < 0 or not self.mode.model().item(index).isEnabled():
            return False
        self.mode.setCurrentIndex(index)
        return True

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
