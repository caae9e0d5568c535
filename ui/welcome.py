"""The welcome panel shown in place of an empty chat: example prompts as clickable cards, each explaining the
reasoning mode it uses (Auto / Reason / Fast), and a line saying that everything runs on this computer.
Clicking a card emits `exampleChosen(text, mode)`; the window fills the composer with it."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QFrame, QGridLayout, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

EXAMPLES = (
    ("auto", "Auto", "Plan a relaxed three-day visit to Lisbon on a small budget.",
     "The switcher decides, question by question, whether thinking first helps."),
    ("reason", "Reason", "A train leaves at 9:40 and arrives at 13:05. How long is the trip, in minutes?",
     "Always thinks step by step first, within the thinking budget you set."),
    ("base", "Fast", "Write a friendly two-line reminder about tomorrow's team lunch.",
     "Answers directly, without a thinking trace: quickest for simple requests."),
    ("reason", "Reason", "Is 221 a prime number? Explain briefly.",
     "Math and logic are where thinking pays off; “Think longer” can extend it."),
)
OFFLINE_NOTE = ("Everything runs on this computer: the model, your chats and any adapters you train. "
                "Nothing is sent anywhere.")


class ExampleCard(QFrame):
    """One example: the mode as a tag, the prompt, and what the mode does. Click or Enter/Space chooses it."""

    chosen = Signal(str, str)

    def __init__(self, mode: str, label: str, prompt: str, explain: str, parent=None):
        super().__init__(parent, objectName="card")
        self.mode, self.prompt = mode, prompt
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAccessibleName(f"Example, {label} mode: {prompt}")
        self.setToolTip(f"Ask this in {label} mode")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        tag = QLabel(label.upper(), objectName="muted")
        font = QFont(tag.font())
        font.setPointSizeF(max(6.0, font.pointSizeF() * 0.8))
        font.setWeight(QFont.Weight.DemiBold)
        tag.setFont(font)
        text = QLabel(prompt, wordWrap=True)
        note = QLabel(explain, wordWrap=True, objectName="muted")
        for w in (tag, text, note):
            w.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 12, 14, 12)
        layout.setSpacing(4)
        layout.addWidget(tag)
        layout.addWidget(text)
        layout.addWidget(note)
        layout.addStretch(1)

    def mouseReleaseEvent(self, event) -> None:
        if event.button() == Qt.MouseButton.LeftButton and self.rect().contains(event.position().toPoint()):
            self.chosen.emit(self.prompt, self.mode)
        super().mouseReleaseEvent(event)

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space):
            self.chosen.emit(self.prompt, self.mode)
            return
        super().keyPressEvent(event)


class Welcome(QWidget):
    exampleChosen = Signal(str, str)
    """(prompt, mode) of the example card the user clicked."""

    def __init__(self, parent=None):
        super().__init__(parent, objectName="welcome")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        title = QLabel("What would you like to work on?")
        font = QFont(title.font())
        font.setPointSizeF(font.pointSizeF() * 1.5)
        font.setWeight(QFont.Weight.DemiBold)
        title.setFont(font)
        title.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        intro = QLabel("Pick an example or type below. The mode next to the message box decides whether Ponder "
                       "thinks before it answers.", wordWrap=True, objectName="muted")
        intro.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.cards = [ExampleCard(*example) for example in EXAMPLES]
        grid = QGridLayout()
        grid.setSpacing(10)
        for i, card in enumerate(self.cards):
            grid.addWidget(card, i // 2, i % 2)
            card.chosen.connect(self.exampleChosen)
        self.offline = QLabel(OFFLINE_NOTE, wordWrap=True, objectName="muted")
        self.offline.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        column = QWidget()
        column.setMinimumWidth(360)
        column.setMaximumWidth(760)
        column.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        inner = QVBoxLayout(column)
        inner.setSpacing(14)
        inner.addWidget(title)
        inner.addWidget(intro)
        inner.addLayout(grid)
        inner.addWidget(self.offline)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(column, 100)
        row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 24, 24, 24)
        layout.addStretch(1)
        layout.addLayout(row)
        layout.addStretch(2)
