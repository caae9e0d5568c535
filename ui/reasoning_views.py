"""Reasoning views inside an assistant card: the collapsible thinking card ("Thought for N s · T/budget
tokens", "cut at budget"; live "Thinking… T/budget tokens" with the trace appended in place, never reset), the
fitted read-only text browser every card uses, and one compact row per stream while parallel answers run
(phase: thinking / answering / verifying / done, tokens against the budget)."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QUrl, Signal
from PySide6.QtGui import QImage, QPalette, QTextCursor, QTextDocument
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)


class FitBrowser(QTextBrowser):
    """A read-only, selectable text browser as tall as its document (the transcript scrolls, not the card).
    Images come only from `images` (rendered math): nothing is ever loaded from a file or the network."""

    linkClicked = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setStyleSheet("QTextBrowser { background: transparent; }")
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(2)
        self.images: dict = {}
        self.revision = 0
        """Counts full content replacements (set_html / set_plain): the tests' proof a card was not rebuilt."""
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.anchorClicked.connect(lambda url: self.linkClicked.emit(url.toString()))
        self.setFixedHeight(24)

    def _fit(self, *_args) -> None:
        height = int(self.document().size().height() + 0.999) + 2 * self.frameWidth()
        if height != self.height():
            self.setFixedHeight(max(height, 8))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self.height())

    def wheelEvent(self, event) -> None:
        event.ignore()  # the transcript scrolls

    def loadResource(self, kind, url: QUrl):
        """Only the rendered math: never a file or a remote URL (an unknown one is an empty image)."""
        image = self.images.get(url.toString())
        return image if image is not None else QImage()

    def set_html(self, html: str, images: dict | None = None) -> None:
        self.images = dict(images or {})
        for url, image in self.images.items():
            self.document().addResource(QTextDocument.ResourceType.ImageResource, QUrl(url), image)
        self.setHtml(html)
        self.revision += 1

    def set_plain(self, text: str) -> None:
        self.setPlainText(text)
        self.revision += 1

    def append_plain(self, text: str) -> None:
        """Add text at the end without touching the rest (a selection in it stays)."""
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)


def thought_header(seconds: float | None, tokens: int, budget, forced: bool) -> str:
    meter = f"{tokens}/{budget} tokens" if budget else f"{tokens} tokens"
    head = f"Thought for {seconds:.1f} s · {meter}" if seconds is not None else f"Thought · {meter}"
    return head + (" · cut at budget" if forced else "")


def live_header(tokens: int, budget) -> str:
    return f"Thinking… {tokens}/{budget} tokens" if budget else f"Thinking… {tokens} tokens"


class ThinkingCard(QFrame):
    """The trace of one reply, collapsed by default once answered; live, the trace grows in place."""

    toggled = Signal(bool)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("thinkingCard")
        self.header = QToolButton(checkable=True)
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setAutoRaise(True)
        self.header.setArrowType(Qt.ArrowType.RightArrow)
        self.header.setAccessibleName("Show or hide the thinking")
        self.header.toggled.connect(self._toggled)
        self.body = FitBrowser()
        self.body.setObjectName("thinkingBody")
        self.body.setVisible(False)
        box = QVBoxLayout(self)
        box.setContentsMargins(8, 2, 8, 4)
        box.setSpacing(2)
        box.addWidget(self.header, 0, Qt.AlignmentFlag.AlignLeft)
        box.addWidget(self.body)
        self._text = ""
        self._typeset: tuple[str, bool] | None = None
        """(trace, dark theme) last typeset by show_done; None while the body holds plain text."""
        self._apply(False)

    def _toggled(self, on: bool) -> None:
        self._apply(on)
        self.toggled.emit(on)  # the user's choice, kept by the transcript

    def _apply(self, on: bool) -> None:
        self.header.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.header.setToolTip("Hide the thinking" if on else "Show the thinking")
        self.body.setVisible(on)

    def set_expanded(self, on: bool) -> None:
        if self.header.isChecked() != on:
            self.header.blockSignals(True)
            self.header.setChecked(on)
            self.header.blockSignals(False)
            self._apply(on)

    @property
    def expanded(self) -> bool:
        return self.header.isChecked()

    def set_text(self, text: str) -> None:
        """The whole trace; a trace that only grew is appended in place."""
        if text == self._text and self._typeset is None:
            return
        if self._text and text.startswith(self._text) and self._typeset is None:
            self.body.append_plain(text[len(self._text):])
        else:
            self.body.set_plain(text)
        self._text, self._typeset = text, None

    def show_live(self, text: str, tokens: int, budget) -> None:
        self.header.setText(live_header(tokens, budget))
        self.set_text(text)

    def show_done(self, text: str, seconds: float | None, tokens: int, budget, forced: bool, render=None) -> None:
        """The finished trace; with `render` (text → (html, images)) it is typeset like an answer (Markdown,
        math): it streamed as plain text, appended in place."""
        self.header.setText(thought_header(seconds, tokens, budget, forced))
        if render is None:
            self.set_text(text)
        elif (text, self._dark()) != self._typeset:
            html, images = render(text)
            self.body.set_html(html, images)
            self._text, self._typeset = text, (text, self._dark())

    def _dark(self) -> bool:
        return self.palette().color(QPalette.ColorRole.Base).lightness() < 128

    def plain_text(self) -> str:
        return self.header.text() + ("\n" + self._text if self.expanded else "")


PHASES = ("thinking", "answering", "verifying", "done")


class StreamRows(QWidget):
    """One row per parallel stream: phase (thinking, answering, verifying, done — the engine's PhaseEvents), a bar
    of tokens against the budget, the count."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(8, 2, 8, 2)
        self.grid.setHorizontalSpacing(8)
        self.grid.setVerticalSpacing(2)
        self.rows: dict[int, tuple[QLabel, QLabel, QProgressBar, QLabel]] = {}
        self.phases: dict[int, str] = {}

    def _row(self, i: int):
        if i not in self.rows:
            name, phase, count = QLabel(f"Answer {i + 1}"), QLabel(), QLabel()
            bar = QProgressBar(textVisible=False, maximumHeight=6)
            bar.setAccessibleName(f"Answer {i + 1} progress")
            for col, w in enumerate((name, phase, bar, count)):
                self.grid.addWidget(w, i, col)
            self.grid.setColumnStretch(2, 1)
            self.rows[i] = (name, phase, bar, count)
        return self.rows[i]

    @staticmethod
    def tokens(stream: dict, kind: str) -> tuple[int, bool]:
        """(count, exact): the controller's count when it keeps one, else about 4 characters a token."""
        exact = stream.get(f"{kind}_tokens")
        if exact is not None:
            return int(exact), True
        return (len(stream.get(kind, "")) + 3) // 4, False

    @staticmethod
    def phase(stream: dict) -> str:
        told = {"verify": "verifying", "done": "done"}.get(stream.get("phase", ""))
        return told or ("answering" if stream.get("answer") else "thinking")

    def update_streams(self, streams: dict, budget) -> None:
        for i in sorted(streams):
            s = streams[i]
            think, exact = self.tokens(s, "thinking")
            answer, exact_a = self.tokens(s, "answer")
            self.phases[i] = phase = self.phase(s)
            _, label, bar, count = self._row(i)
            label.setText(phase)
            bar.setRange(0, int(budget or max(think, 1)))
            bar.setValue(min(think, bar.maximum()))
            approx = "" if exact and exact_a else "≈"
            count.setText(f"{approx}{think}/{budget} thinking · {answer} answer" if budget
                          else f"{approx}{think + answer} tokens")

    def plain_text(self) -> str:
        return "\n".join(f"{r[0].text()}: {r[1].text()} {r[3].text()}" for _, r in sorted(self.rows.items()))
