"""Conversation sidebar: new chat, the list of chats, full-text search, and per-chat actions."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLineEdit, QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget


class Sidebar(QWidget):
    newRequested = Signal()
    selected = Signal(str)
    renameRequested = Signal(str)
    deleteRequested = Signal(str)
    exportRequested = Signal(str, str)
    """(conversation id, 'md' or 'json')"""
    searchChanged = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.new_button = QPushButton("+ New chat")
        self.search = QLineEdit(placeholderText="Search all chats…")
        self.search.setClearButtonEnabled(True)
        self.list = QListWidget()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        self.new_button.clicked.connect(self.newRequested)
        self.search.textChanged.connect(self.searchChanged)
        self.list.itemClicked.connect(lambda item: self.selected.emit(item.data(Qt.ItemDataRole.UserRole)))
        self.list.customContextMenuRequested.connect(self._menu)

    def show_conversations(self, conversations: list[dict], current: str | None) -> None:
        self.list.clear()
        for c in conversations:
            item = QListWidgetItem(c["title"])
            item.setData(Qt.ItemDataRole.UserRole, c["id"])
            self.list.addItem(item)
            if c["id"] == current:
                self.list.setCurrentItem(item)

    def show_results(self, hits: list[dict]) -> None:
        self.list.clear()
        for h in hits:
            item = QListWidgetItem(f"{h['title']}\n  {h['snippet']}")
            item.setData(Qt.ItemDataRole.UserRole, h["conversation_id"])
            self.list.addItem(item)

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.renameRequested.emit(cid))
        menu.addAction("Export as Markdown…", lambda: self.exportRequested.emit(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self.exportRequested.emit(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.deleteRequested.emit(cid))
        menu.popup(self.list.mapToGlobal(pos))
