"""The transcript: a scroll area with one card per message (ui.message_card). `render` reconciles the cards
with the chat (a card is reused for its message id and redrawn only when that message changed); `update_live`
redraws only the card the reply streams into, so a selection in another card, the scroll position and a screen
reader's place survive streaming. Auto-scroll follows new text only while the user is at the bottom. Card
actions come out as `action(verb, args)`."""
from __future__ import annotations

from typing import NamedTuple

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QApplication, QFrame, QLabel, QScrollArea, QVBoxLayout, QWidget
from shiboken6 import isValid

from .message_card import MessageCard, failed
from .vote_chart import tie_note

__all__ = ["ChatView", "details_text", "tie_note"]

STYLE = """
QFrame#userCard { background: palette(alternate-base); border: 1px solid palette(midlight); border-radius: 12px; }
QFrame#assistantCard { background: palette(base); border: 1px solid palette(midlight); border-radius: 12px; }
QFrame#assistantCard[failed="true"] { border: 1px solid #d93025; }
QFrame#thinkingCard { background: palette(window); border-radius: 8px; }
QFrame#errorCard { background: rgba(217, 48, 37, 0.12); border-radius: 8px; }
QLabel#cardAuthor { font-weight: 600; }
QLabel#cardNote { color: palette(placeholder-text); font-style: italic; }
"""


class LiveRow(NamedTuple):
    """The row of a reply that streams as an alternative (regenerate, think longer): not on the shown branch
    until it has finished, shown below the reply it may replace."""

    id: int
    role: str
    content: str
    thinking: str
    status: str
    meta: dict


class ChatView(QScrollArea):
    action = Signal(str, list)
    """(verb, args) from a card, e.g. ('pick', [message_id, index]), ('branch', [message_id, '+1'])."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.body = QWidget()
        self.body.setObjectName("transcript")
        self.body.setStyleSheet(STYLE)
        self.column = QVBoxLayout(self.body)
        self.column.setContentsMargins(16, 12, 16, 12)
        self.column.setSpacing(12)
        self.placeholder = QLabel("Start a conversation below.", alignment=Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setObjectName("cardNote")
        self.column.addWidget(self.placeholder)
        self.column.addStretch(1)
        self.setWidget(self.body)
        self.cards: dict[int, MessageCard] = {}
        self.order: list[int] = []
        self.expanded: set[int] = set()
        self.live_id: int | None = None
        self.errors: dict[int, str] = {}
        """Why a reply failed, by its message id (shown on that reply's card only)."""
        self.font_px = 15
        """The body text's pixel size: formulas are set to match."""
        self._stick = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._range_changed)
        self._watching_focus = False

    # --- scrolling -----------------------------------------------------------------------------------
    def _scrolled(self, value: int) -> None:
        self._stick = value >= self.verticalScrollBar().maximum() - 4

    def _range_changed(self, _low: int, high: int) -> None:
        if self._stick:
            self.verticalScrollBar().setValue(high)

    def at_bottom(self) -> bool:
        return self._stick

    # The application-wide focus signal is followed only while the view is shown: a window destroyed later (by
    # the garbage collector, after it was closed) moves focus as its widgets go, and a slot running then on
    # half-destroyed cards crashed the process.
    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        if not self._watching_focus:
            QApplication.instance().focusChanged.connect(self._focus_changed)
            self._watching_focus = True
        super().showEvent(event)

    def hideEvent(self, event) -> None:  # noqa: N802 (Qt override)
        self._stop_watching_focus()
        super().hideEvent(event)

    def _stop_watching_focus(self) -> None:
        if self._watching_focus:
            self._watching_focus = False
            try:
                QApplication.instance().focusChanged.disconnect(self._focus_changed)
            except (RuntimeError, TypeError):
                pass

    def _focus_changed(self, _old, new) -> None:
        """Keyboard users get a card's buttons when focus is inside it (the pointer gets them on hover)."""
        if not isValid(self) or not self.isVisible():  # the window is closing or gone
            return
        for card in self.cards.values():
            if not isValid(card):
                continue
            inside = new is not None and card.isAncestorOf(new)
            if inside or not card.underMouse():
                card.show_buttons(inside)

    # --- cards ---------------------------------------------------------------------------------------
    @property
    def code_blocks(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for card in self.cards.values():
            out.update(card.code_blocks)
        return out

    def card(self, message_id: int) -> MessageCard | None:
        return self.cards.get(message_id)

    def offered(self, message_id: int, verb: str) -> bool:
        card = self.cards.get(message_id)
        return card is not None and card.offered(verb)

    def _card(self, m) -> MessageCard:
        card = self.cards.get(m.id)
        if card is None or card.role != m.role:
            card = MessageCard(m.id, m.role)
            card.font_px = self.font_px
            card.action.connect(self.action)
            card.expandedChanged.connect(self._expanded)
            self.cards[m.id] = card
        return card

    def _expanded(self, message_id: int, on: bool) -> None:
        if on:
            self.expanded.add(message_id)
        else:
            self.expanded.discard(message_id)

    def set_error(self, message_id: int, message: str) -> None:
        """Reply `message_id` failed because of `message` (shown on its card when it is drawn failed)."""
        self.errors[message_id] = message

    def set_font_size(self, points: int) -> None:
        """Formulas at the body text's size: the shown cards are redrawn, later ones drawn at it."""
        self.font_px = round(points * 4 / 3)
        for card in self.cards.values():
            card.set_font_px(self.font_px)

    def render(self, messages, live=None, busy: bool = False, can_reason: bool = False, *,
               branches: dict | None = None, can_delete: bool = False) -> None:
        """Show `messages` (the active path); `live` streams into its stored row; `branches`: message id →
        (n, m) among its siblings; `can_reason`: the engine can think longer."""
        branches = branches or {}
        self.live_id = getattr(live, "message_id", None)
        last_assistant = max((m.id for m in messages if m.role == "assistant"), default=None)
        # Retry asks its reply's question again: only the branch's last reply (the last row) offers it
        last_reply = messages[-1].id if messages and messages[-1].role == "assistant" else None
        ids = [m.id for m in messages]
        asked = False  # a question comes before the row: only then can a reply be answered again
        if self.live_id is not None and self.live_id not in ids:  # an alternative streams after the shown reply
            messages = [*messages, LiveRow(self.live_id, "assistant", "", "", "streaming", {})]
            ids.append(self.live_id)
        for m in messages:
            asked = asked or m.role == "user"
            card = self._card(m)
            if m.id == self.live_id:
                card.show_live(live)
            else:
                card.show_message(m, expanded=m.id in self.expanded, error=self.errors.get(m.id) if failed(m) else None)
            done = m.id != self.live_id
            reasoned = bool(m.thinking) and m.role == "assistant"
            card.offer(copy=done, edit=m.role == "user" and not busy,
                       regenerate=m.role == "assistant" and m.id == last_assistant and asked and not busy and done,
                       think=reasoned and can_reason and not busy and done,
                       details=m.role == "assistant" and done, delete=can_delete and not busy and done)
            card.retry_button.setVisible(m.id == last_reply and asked)
            card.retry_button.setEnabled(not busy)
            card.set_branch(branches.get(m.id))
        if ids != self.order:
            if not set(ids) & set(self.order):  # another chat: open it at its end
                self._stick = True
            self._relayout(ids)
        self.placeholder.setVisible(not ids)

    def _relayout(self, ids: list[int]) -> None:
        keep = set(ids)
        for mid in [k for k in self.cards if k not in keep]:
            card = self.cards.pop(mid)
            self.column.removeWidget(card)
            card.deleteLater()
            self.expanded.discard(mid)
        for pos, mid in enumerate(ids):
            card = self.cards[mid]
            if self.column.indexOf(card) != pos + 1:
                self.column.removeWidget(card)
                self.column.insertWidget(pos + 1, card)  # after the placeholder, before the stretch
        self.order = ids

    def update_live(self, live) -> bool:
        """Redraw only the card `live` streams into; False when that card is not shown (a full render is due)."""
        card = self.cards.get(getattr(live, "message_id", None))
        if card is None or live.message_id != self.live_id:
            return False
        card.show_live(live)
        return True

    def toPlainText(self) -> str:  # noqa: N802 (Qt naming, as the text widgets it replaced)
        if not self.order:
            return self.placeholder.text()
        return "\n\n".join(self.cards[mid].plain_text() for mid in self.order)


def details_text(m) -> str:
    meta = m.meta
    route = meta.get("route") or {}
    prob = route.get("probability")
    lines = [
        f"Route: {'reasoning' if route.get('reason') else 'direct answer'} "
        f"({route.get('source', '?')}{f', p={prob:.2f}' if prob is not None else ''})",
        f"Adapter: {meta.get('adapter') or 'none'}",
        f"Thinking tokens: {meta.get('thinking_tokens', 0)} / budget {meta.get('budget') or '—'}"
        f"{' (cut)' if meta.get('budget_forced') else ''}",
        f"Answer tokens: {meta.get('answer_tokens', 0)}",
        f"TTFT: {meta.get('ttft_s', 0):.2f} s · {meta.get('decode_tok_s', 0):.1f} tok/s",
        f"Model: {meta.get('model', '?')} · weights {meta.get('precision', '?')} · KV {meta.get('kv', '?')}",
    ]
    if meta.get("resumed"):
        how = "on the kept trace" if meta["resumed"] == "cache" else "on the trace rebuilt from its text"
        lines.append(f"Thought longer {how}")
    return "\n".join(lines)
