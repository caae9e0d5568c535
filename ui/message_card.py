"""One message as a card: who wrote it, icon buttons on hover (copy, edit, regenerate, think longer, delete,
details) with tooltips and accessible names, ‹ n/m › between sibling replies, the thinking card, live rows per
parallel stream, the Markdown content (ui.markdown_render), the vote chart, and an error card with Retry.
A card re-renders its content only when its message changed; while streaming only the live card is touched."""
from __future__ import annotations

import json
import time

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QIcon, QPalette
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QLabel, QPushButton, QStyle, QToolButton, QVBoxLayout, QWidget

from .reasoning_views import FitBrowser, StreamRows, ThinkingCard
from .vote_chart import VotePanel

try:
    from .markdown_render import render_markdown
except ImportError:  # helper MD's renderer not there yet: plain text
    render_markdown = None

SP = QStyle.StandardPixmap
BUTTONS = {  # verb: (label, tooltip, theme icon, fallback standard icon)
    "copy": ("Copy", "Copy the message", "edit-copy", SP.SP_FileDialogContentsView),
    "edit": ("Edit", "Edit and ask again (the old version stays as a branch)", "document-edit",
             SP.SP_FileDialogDetailedView),
    "regenerate": ("Regenerate", "Answer again (the old answer stays as a branch)", "view-refresh",
                   SP.SP_BrowserReload),
    "think": ("Think longer", "Continue this reasoning with more budget", "media-seek-forward",
              SP.SP_MediaSeekForward),
    "details": ("Details", "Route, adapter, tokens and speed of this answer", "dialog-information",
                SP.SP_MessageBoxInformation),
    "delete": ("Delete", "Delete this message", "edit-delete", SP.SP_TrashIcon),
}
STATUS_NOTES = {"incomplete": "Incomplete: the answer stopped before it finished.", "cancelled": "Stopped."}


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_content(text: str, *, dark: bool, key_prefix: str, streaming: bool, font_px: int = 15):
    """(html, images, code_blocks) of a message's text, formulas at `font_px` (the body text's pixel size)."""
    if render_markdown is not None:
        r = render_markdown(text, dark=dark, key_prefix=key_prefix, streaming=streaming, font_px=font_px)
        return r.html, r.images, r.code_blocks
    return f"<div style='white-space: pre-wrap'>{escape(text)}</div>", {}, {}


def is_dark(widget: QWidget) -> bool:
    return widget.palette().color(QPalette.ColorRole.Base).lightness() < 128


def failed(m) -> bool:
    """A reply that ended without an answer object (the engine failed or the app stopped mid-answer)."""
    return m.role == "assistant" and (m.status == "error" or (m.status == "incomplete" and "finish_reason" not in m.meta))


CHUNK_CHARS = 1600
_ICONS: dict[str, QIcon] = {}


def icon(theme: str, fallback) -> QIcon:
    """The theme's icon, else Qt's standard one (looked up once)."""
    if theme not in _ICONS:
        _ICONS[theme] = QIcon.fromTheme(theme, QApplication.style().standardIcon(fallback))
    return _ICONS[theme]


def split_point(text: str) -> int | None:
    """Where a streaming answer can be cut into a frozen part: after a blank line, with no code fence, `$$` or
    `\\[` left open before it, at least 400 characters from the end (the tail may still change how it ends)."""
    at = len(text) - 400
    while (at := text.rfind("\n\n", 0, at)) > 200:
        head = text[: at + 2]
        fences = sum(1 for line in head.split("\n") if line.lstrip(" >").startswith(("```", "~~~")))
        if fences % 2 == 0 and head.count("$$") % 2 == 0 and head.count("\\[") == head.count("\\]"):
            return at + 2
    return None


def thinking_seconds(meta: dict) -> float | None:
    rate = meta.get("decode_tok_s") or 0
    if not rate:
        return None
    return float(meta.get("ttft_s") or 0) + meta.get("thinking_tokens", 0) / rate


class MessageCard(QFrame):
    action = Signal(str, list)
    expandedChanged = Signal(int, bool)

    def __init__(self, message_id: int, role: str, parent=None):
        super().__init__(parent)
        self.message_id, self.role = message_id, role
        self.setObjectName("userCard" if role == "user" else "assistantCard")
        self.setAttribute(Qt.WidgetAttribute.WA_Hover, True)
        self.code_blocks: dict[str, str] = {}
        self._key = None
        self.font_px = 15
        """The body text's pixel size (ChatView.set_font_size): formulas are drawn to match."""
        self._live_answer: str | None = None
        self.chunks: list[FitBrowser] = []
        """Frozen leading parts of a long streaming answer (see _set_tail)."""
        self._frozen = 0
        self._chunk_blocks: dict[str, str] = {}
        self._thought_s: float | None = None
        self._shown: tuple | None = None
        """The last show_message arguments: redrawn in the new colours when the theme changes."""
        self.setAccessibleName("Your message" if role == "user" else "Ponder's reply")
        self.who = QLabel("You" if role == "user" else "Ponder")
        self.who.setObjectName("cardAuthor")
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.who)
        top.addStretch(1)
        self.nav = self._nav()
        top.addWidget(self.nav)
        self.bar = QWidget()
        """The icon buttons, built the first time the pointer or focus comes to the card (a long chat opens fast)."""
        self._buttons: dict[str, QToolButton] = {}
        self._offers: dict[str, bool] = {}
        keep = self.bar.sizePolicy()
        keep.setRetainSizeWhenHidden(True)
        self.bar.setSizePolicy(keep)
        self.bar.setVisible(False)
        top.addWidget(self.bar)
        self.thinking = ThinkingCard() if role == "assistant" else None
        self.streams: StreamRows | None = None
        self.content = FitBrowser()
        self.content.setObjectName("cardContent")
        self.content.linkClicked.connect(self._link)
        self.note = QLabel(visible=False, wordWrap=True)
        self.note.setObjectName("cardNote")
        self.error = self._error_box()
        self.vote: VotePanel | None = None
        self.box = QVBoxLayout(self)
        self.box.setContentsMargins(14, 8, 14, 10)
        self.box.setSpacing(4)
        self.box.addLayout(top)
        if self.thinking is not None:
            self.thinking.setVisible(False)
            self.thinking.toggled.connect(lambda on: self.expandedChanged.emit(self.message_id, on))
            self.box.addWidget(self.thinking)
        self.box.addWidget(self.content)
        self.box.addWidget(self.note)
        self.box.addWidget(self.error)

    # --- parts ---------------------------------------------------------------------------------------
    @property
    def buttons(self) -> dict[str, QToolButton]:
        if not self._buttons:
            row = QHBoxLayout(self.bar)
            row.setContentsMargins(0, 0, 0, 0)
            row.setSpacing(0)
            for verb, (label, tip, theme, fallback) in BUTTONS.items():
                b = QToolButton(autoRaise=True)
                b.setIcon(icon(theme, fallback))
                b.setToolTip(tip)
                b.setAccessibleName(label)
                b.clicked.connect(lambda _=False, v=verb: self.action.emit(v, [str(self.message_id)]))
                b.setVisible(self._offers.get(verb, False))
                row.addWidget(b)
                self._buttons[verb] = b
        return self._buttons

    def show_buttons(self, on: bool) -> None:
        if on:
            self.buttons  # noqa: B018 (built on first use)
        self.bar.setVisible(on)

    def _nav(self) -> QWidget:
        nav = QWidget(visible=False)
        row = QHBoxLayout(nav)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        self.prev_button = QToolButton(autoRaise=True, text="‹")
        self.next_button = QToolButton(autoRaise=True, text="›")
        self.branch_label = QLabel()
        for b, delta, name in ((self.prev_button, "-1", "Previous version"), (self.next_button, "+1", "Next version")):
            b.setAccessibleName(name)
            b.setToolTip(name)
            b.clicked.connect(lambda _=False, d=delta: self.action.emit("branch", [str(self.message_id), d]))
        row.addWidget(self.prev_button)
        row.addWidget(self.branch_label)
        row.addWidget(self.next_button)
        return nav

    def _error_box(self) -> QWidget:
        box = QFrame(visible=False)
        box.setObjectName("errorCard")
        row = QHBoxLayout(box)
        self.error_label = QLabel(wordWrap=True)
        self.retry_button = QPushButton("Retry")
        self.retry_button.setAccessibleName("Retry")
        self.retry_button.setToolTip("Ask for this answer again")
        self.retry_button.clicked.connect(lambda: self.action.emit("retry", [str(self.message_id)]))
        row.addWidget(self.error_label, 1)
        row.addWidget(self.retry_button)
        return box

    def _link(self, url: str) -> None:
        """A link clicked in the rendered text: only the renderer's Copy link of one of this card's code blocks
        does something; a link written in a message never runs an action (those come from the buttons)."""
        key = url.removeprefix("ponder:copycode/")
        if url.startswith("ponder:copycode/") and key in self.code_blocks:
            self.action.emit("copycode", [key])

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and self._shown is not None and self._live_answer is None:
            m, expanded, error = self._shown
            self.show_message(m, expanded=expanded, error=error)  # light ↔ dark: code and math colours follow

    def set_font_px(self, px: int) -> None:
        """Formulas at `px`: a shown message is redrawn now, a streaming one from its next update."""
        if px == self.font_px:
            return
        self.font_px = px
        if self._shown is not None and self._live_answer is None:
            m, expanded, error = self._shown
            self.show_message(m, expanded=expanded, error=error)

    # --- hover ---------------------------------------------------------------------------------------
    def enterEvent(self, event) -> None:
        self.show_buttons(True)
        super().enterEvent(event)

    def leaveEvent(self, event) -> None:
        focus = QApplication.focusWidget()
        if focus is None or not self.isAncestorOf(focus):  # keyboard users keep the buttons
            self.bar.setVisible(False)
        super().leaveEvent(event)

    def offered(self, verb: str) -> bool:
        """Whether the card offers the button `verb` (shown while the pointer or focus is on the card)."""
        return self._offers.get(verb, False)

    def offer(self, **verbs: bool) -> None:
        self._offers.update(verbs)
        for verb, on in verbs.items():
            if verb in self._buttons:
                self._buttons[verb].setVisible(on)

    def set_branch(self, branch: tuple[int, int] | None) -> None:
        n, m = branch or (1, 1)
        self.nav.setVisible(m > 1)
        self.branch_label.setText(f"{n}/{m}")
        self.branch_label.setAccessibleName(f"Version {n} of {m}")
        self.prev_button.setEnabled(n > 1)
        self.next_button.setEnabled(n < m)

    # --- content -------------------------------------------------------------------------------------
    def _set_content(self, text: str, streaming: bool) -> None:
        self._drop_chunks()
        html, images, self.code_blocks = render_content(text, dark=is_dark(self), font_px=self.font_px,
                                                        key_prefix=f"{self.message_id}-",
                                                        streaming=streaming)
        self.content.set_html(html, images)

    def _selecting(self) -> bool:
        return any(part.textCursor().hasSelection() for part in (*self.chunks, self.content))

    def _render_thinking(self, text: str) -> tuple[str, dict]:
        html, images, _blocks = render_content(text, dark=is_dark(self), font_px=self.font_px,
                                               key_prefix=f"{self.message_id}-think-",
                                               streaming=False)
        return html, images

    def _drop_chunks(self) -> None:
        for chunk in self.chunks:
            self.box.removeWidget(chunk)
            chunk.deleteLater()
        self.chunks, self._frozen, self._chunk_blocks = [], 0, {}

    def _set_tail(self, answer: str, streaming: bool) -> None:
        """A long streaming answer is drawn as frozen chunks (complete blocks, drawn once) and a tail redrawn
        per tick, so a tick costs the same at token 2,000 as at token 20."""
        tail = answer[self._frozen:]
        if streaming and len(tail) > CHUNK_CHARS:
            cut = split_point(tail)
            if cut:
                html, images, blocks = render_content(tail[:cut], dark=is_dark(self), font_px=self.font_px, streaming=False,
                                                      key_prefix=f"{self.message_id}-c{len(self.chunks)}-")
                chunk = FitBrowser()
                chunk.linkClicked.connect(self._link)
                chunk.set_html(html, images)
                self.box.insertWidget(self.box.indexOf(self.content), chunk)
                self.chunks.append(chunk)
                self._chunk_blocks.update(blocks)
                self._frozen += cut
                tail = tail[cut:]
        if streaming and not tail.strip():  # nothing to lay out yet (and no renderer warm-up before a token)
            self.code_blocks = dict(self._chunk_blocks)
            self.content.set_html("<p>▌</p>")
            return
        html, images, blocks = render_content(tail + ("▌" if streaming else ""), dark=is_dark(self), font_px=self.font_px,
                                              key_prefix=f"{self.message_id}-t{len(self.chunks)}-", streaming=streaming)
        self.code_blocks = {**self._chunk_blocks, **blocks}
        self.content.set_html(html, images)

    def show_message(self, m, *, expanded: bool = False, error: str | None = None) -> None:
        """A stored message; nothing is redrawn when neither it nor how it is shown changed."""
        self._shown = (m, expanded, error)
        key = (m.content, m.thinking, m.status, json.dumps(m.meta, sort_keys=True, default=str), error, is_dark(self),
               self.font_px)
        if self.thinking is not None:
            self.thinking.set_expanded(expanded)
        if key == self._key:
            return
        streamed, self._key, self._live_answer = self._live_answer, key, None
        if self.streams is not None:
            self.streams.setVisible(False)
        if self.chunks and streamed is not None and m.content == streamed and self._selecting():
            self._set_tail(m.content, streaming=False)  # just finished under a selection: the chunks stay as they are
        else:  # one document: a selection can run across the whole answer
            self._set_content(m.content, streaming=False)
        self.content.setVisible(bool(m.content) or m.role == "user")
        meta = m.meta
        if self.thinking is not None:
            reasoned = bool((meta.get("route") or {}).get("reason"))
            self.thinking.setVisible(bool(m.thinking or reasoned))
            seconds = self._thought_s if self._thought_s is not None else thinking_seconds(meta)
            self.thinking.show_done(m.thinking, seconds, meta.get("thinking_tokens", 0), meta.get("budget"),
                                    bool(meta.get("budget_forced")), self._render_thinking)
        broken = failed(m)
        self.setProperty("failed", broken)
        self.error.setVisible(broken)
        if broken:
            self.error_label.setText(f"This answer failed: {error}" if error else
                                     "This answer did not finish (the model failed or Ponder was closed).")
        note = "" if broken else STATUS_NOTES.get(m.status, "")
        self.note.setText(note)
        self.note.setVisible(bool(note))
        if self.vote is not None:
            self.vote.deleteLater()
            self.vote = None
        if meta.get("candidates"):
            self.vote = VotePanel(m.id, meta)
            self.vote.action.connect(self.action)
            self.box.insertWidget(self.box.indexOf(self.note), self.vote)

    def show_live(self, live) -> None:
        """The reply streaming into this card: only what grew is redrawn."""
        self._key = None
        elapsed = time.monotonic() - live.started
        if self.thinking is not None and (live.thinking or live.budget):
            if not self.thinking.isVisible():
                self.thinking.setVisible(True)
                self.thinking.set_expanded(True)
            if not live.answer:
                self.thinking.show_live(live.thinking, live.thinking_tokens, live.budget)
            elif self._thought_s is None:
                self._thought_s = elapsed
                self.thinking.show_done(live.thinking, elapsed, live.thinking_tokens, live.budget,
                                        live.thinking_tokens >= (live.budget or 1 << 30), self._render_thinking)
        if len(live.streams) > 1:
            if self.streams is None:
                self.streams = StreamRows()
                self.box.insertWidget(self.box.indexOf(self.content), self.streams)
            self.streams.setVisible(True)
            self.streams.update_streams(live.streams, live.budget)
        replacing = "The earlier answer stays until this one has finished." if getattr(live, "replaces", ()) else ""
        if self.note.text() != replacing:
            self.note.setText(replacing)
            self.note.setVisible(bool(replacing))
        self.error.setVisible(False)
        if live.answer != self._live_answer:
            if self._live_answer is None or not live.answer.startswith(self._live_answer[:self._frozen]):
                self._drop_chunks()
            self._live_answer = live.answer
            self._set_tail(live.answer, streaming=True)
        self.content.setVisible(bool(live.answer) or len(live.streams) <= 1)

    def plain_text(self) -> str:
        parts = [self.who.text()]
        if self.nav.isVisible() or not self.nav.isHidden():
            parts.append(f"‹ {self.branch_label.text()} ›")
        if self.thinking is not None and not self.thinking.isHidden():
            parts.append(self.thinking.plain_text())
        if self.streams is not None and not self.streams.isHidden():
            parts.append(self.streams.plain_text())
        if not self.content.isHidden():
            parts.extend(chunk.toPlainText() for chunk in self.chunks)
            parts.append(self.content.toPlainText())
        for label in (self.note, self.error_label):
            if not label.isHidden() and (label is self.note or not self.error.isHidden()):
                parts.append(label.text())
        if self.vote is not None:
            parts.append(self.vote.plain_text())
        return "\n".join(p for p in parts if p)
