"""Conversation sidebar: new chat, the list of chats (pinned ones on top, then grouped Today / Yesterday /
Previous 7 days / Older, titles elided to the width — never a horizontal scrollbar), full-text search, and
per-chat actions (pin, rename, export, delete).

The list holds one item per chat (its text is the title); a group's heading is drawn by the item delegate
above the group's first item, so `list.count()` and `list.item(i).text()` stay about chats only."""
from __future__ import annotations

import time
from datetime import datetime, timedelta

from PySide6.QtCore import QEvent, QItemSelectionModel, QRect, QSize, Qt, Signal
from PySide6.QtGui import QFont, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QLineEdit,
    QListView,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyledItemDelegate,
    QVBoxLayout,
    QWidget,
)

GROUP_ROLE = Qt.ItemDataRole.UserRole + 1
"""The heading drawn above an item that starts a group ('Pinned', 'Today', …), or None."""
PINNED_ROLE = Qt.ItemDataRole.UserRole + 2
GROUPS = ("Pinned", "Today", "Yesterday", "Previous 7 days", "Older")
HEADING_PX = 26


def date_group(updated: float, now: float | None = None) -> str:
    """'Today', 'Yesterday', 'Previous 7 days' or 'Older' for a chat last updated at `updated` (epoch s)."""
    today = datetime.fromtimestamp(now if now is not None else time.time()).date()
    day = datetime.fromtimestamp(updated).date()
    if day >= today:
        return "Today"
    if day == today - timedelta(days=1):
        return "Yesterday"
    if day >= today - timedelta(days=7):
        return "Previous 7 days"
    return "Older"


def grouped(conversations: list[dict], now: float | None = None) -> list[tuple[str, dict]]:
    """(group, chat) in display order: pinned first, then by date group, most recently updated first."""
    rows = [("Pinned" if c.get("pinned") else date_group(c.get("updated") or 0, now), c) for c in conversations]
    return sorted(rows, key=lambda r: (GROUPS.index(r[0]), -(r[1].get("updated") or 0)))


class GroupDelegate(QStyledItemDelegate):
    """Draws an item's group heading (when it starts a group) above the normal, elided item."""

    def sizeHint(self, option, index):
        size = super().sizeHint(option, index)
        width = min(size.width(), max(40, self.parent().viewport().width() - 2))  # elided, never wider
        return QSize(width, size.height() + (HEADING_PX if index.data(GROUP_ROLE) else 0))

    def paint(self, painter, option, index):
        heading = index.data(GROUP_ROLE)
        if not heading:
            return super().paint(painter, option, index)
        top = QRect(option.rect.left() + 8, option.rect.top() + 6, option.rect.width() - 16, HEADING_PX - 6)
        painter.save()
        font = QFont(option.font)
        font.setPointSizeF(max(6.0, font.pointSizeF() * 0.85))
        font.setWeight(QFont.Weight.DemiBold)
        painter.setFont(font)
        painter.setPen(option.palette.color(QPalette.ColorRole.PlaceholderText))
        painter.drawText(top, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, heading)
        painter.restore()
        item = type(option)(option)
        item.rect = option.rect.adjusted(0, HEADING_PX, 0, 0)
        super().paint(painter, item, index)


class Sidebar(QWidget):
    newRequested = Signal()
    selected = Signal(str)
    renameRequested = Signal(str)
    deleteRequested = Signal(str)
    exportRequested = Signal(str, str)
    """(conversation id, 'md' or 'json')"""
    pinRequested = Signal(str, bool)
    """(conversation id, pinned)"""
    searchChanged = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.new_button = QPushButton("＋  New chat")
        self.new_button.setToolTip("Start a new chat (Ctrl+N)")
        self.search = QLineEdit(placeholderText="Search all chats…")
        self.search.setClearButtonEnabled(True)
        self.list = QListWidget()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setWordWrap(False)
        self.list.setUniformItemSizes(False)
        self.list.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.list.setResizeMode(QListView.ResizeMode.Adjust)  # items re-laid out (re-elided) on resize
        self.list.setItemDelegate(GroupDelegate(self.list))
        self.list.setAccessibleName("Chats")
        self.setMinimumWidth(180)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        layout.setSpacing(8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        self.new_button.clicked.connect(self.newRequested)
        self.search.textChanged.connect(self.searchChanged)
        self.search.installEventFilter(self)
        self._clicked: tuple[str | None, float] = (None, 0.0)
        """The chat last opened by a click, and when (monotonic s)."""
        self._current: str | None = None
        """The open chat at the last rebuild (while it stays open, a rebuild keeps the list's place)."""
        self._searched: str | None = None
        """The search the hits shown are for."""
        self.list.itemClicked.connect(self._clicked_item)
        self.list.itemActivated.connect(self._activated)
        self.list.customContextMenuRequested.connect(self._menu)

    def show_conversations(self, conversations: list[dict], current: str | None, now: float | None = None) -> None:
        """The chats, pinned first then by date group; `now` (epoch s) is for tests. A rebuild (any chat changed)
        keeps the scroll position and the highlighted row while the open chat stays the same."""
        same_chat = current == self._current and self._searched is None  # not coming back from search hits
        self._current, self._searched = current, None
        keep = self._highlighted() if same_chat else current
        value = self.list.verticalScrollBar().value()
        self.list.clear()
        previous = None
        for group, c in grouped(conversations, now):
            item = QListWidgetItem(c["title"])
            item.setData(Qt.ItemDataRole.UserRole, c["id"])
            item.setData(PINNED_ROLE, bool(c.get("pinned")))
            item.setData(GROUP_ROLE, group if group != previous else None)
            item.setToolTip(c["title"])
            previous = group
            self.list.addItem(item)
        self._restore(keep, value if same_chat else None)

    def _highlighted(self) -> str | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item is not None else None

    def _restore(self, cid: str | None, value: int | None) -> None:
        """Highlight `cid` again and scroll back to `value` (None: to the highlighted row) after a rebuild."""
        bar = self.list.verticalScrollBar()
        self.list.doItemsLayout()  # the new items' heights, so the old position is in range again
        for i in range(self.list.count()):
            if cid is not None and self.list.item(i).data(Qt.ItemDataRole.UserRole) == cid:
                self.list.setCurrentRow(i, QItemSelectionModel.SelectionFlag.ClearAndSelect)
                break
        if value is not None:
            bar.setValue(value)
        elif self.list.currentItem() is not None:
            self.list.scrollToItem(self.list.currentItem())

    def eventFilter(self, obj, event) -> bool:
        """Esc in the search box clears it (before the window's Esc = Stop shortcut sees it)."""
        if obj is self.search and event.type() in (QEvent.Type.ShortcutOverride, QEvent.Type.KeyPress) \
                and event.key() == Qt.Key.Key_Escape:
            event.accept()
            if event.type() == QEvent.Type.KeyPress:
                self.search.clear()
            return True
        return super().eventFilter(obj, event)

    def _clicked_item(self, item: QListWidgetItem) -> None:
        cid = item.data(Qt.ItemDataRole.UserRole)
        self._clicked = (cid, time.monotonic())
        self.selected.emit(cid)

    def _activated(self, item: QListWidgetItem) -> None:
        """Return/Enter on the highlighted chat opens it; the activation that comes with a click (a double
        click, or a style that activates on one click) does not open it a second time."""
        cid = item.data(Qt.ItemDataRole.UserRole)
        last, at = self._clicked
        if cid == last and time.monotonic() - at < QApplication.doubleClickInterval() / 1000:
            return
        self.selected.emit(cid)

    def select(self, cid: str | None) -> None:
        """Highlight chat `cid` (none for a new chat) without rebuilding the list."""
        self._current = cid
        self.list.setCurrentItem(None)
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.ItemDataRole.UserRole) == cid:
                self.list.setCurrentItem(self.list.item(i))
                break

    def show_results(self, hits: list[dict]) -> None:
        """Search hits; refreshed while the search stays the same, the list keeps its place."""
        same = self.search.text() == self._searched
        self._searched = self.search.text()
        keep, value = self._highlighted(), self.list.verticalScrollBar().value()
        self.list.clear()
        for h in hits:
            item = QListWidgetItem(f"{h['title']}\n  {h['snippet']}")
            item.setData(Qt.ItemDataRole.UserRole, h["conversation_id"])
            item.setToolTip(h["title"])
            self.list.addItem(item)
        if same:
            self._restore(keep, value)

    def groups(self) -> list[tuple[str, list[str]]]:
        """What the list shows: (heading, [titles]) in order."""
        out: list[tuple[str, list[str]]] = []
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(GROUP_ROLE) or not out:
                out.append((item.data(GROUP_ROLE) or "", []))
            out[-1][1].append(item.text())
        return out

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        self.context_menu(item).popup(self.list.mapToGlobal(pos))

    def context_menu(self, item: QListWidgetItem) -> QMenu:
        cid, pinned = item.data(Qt.ItemDataRole.UserRole), item.data(PINNED_ROLE)
        menu = QMenu(self)
        if pinned is not None:  # a chat row (not a search hit)
            menu.addAction("Unpin" if pinned else "Pin to top", lambda: self.pinRequested.emit(cid, not pinned))
        menu.addAction("Rename…", lambda: self.renameRequested.emit(cid))
        menu.addAction("Export as Markdown…", lambda: self.exportRequested.emit(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self.exportRequested.emit(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.deleteRequested.emit(cid))
        return menu
