"""ChatController: one conversation at a time, between the chat store and the EngineService.

The answering (send, regenerate, edit, think longer: the reply streamed into the store, the live reply kept for
the view) is `ChatAnswering` (app.chat_answering), mixed in here. A chat is a tree: regenerate, edit and think
longer add a sibling (nothing is deleted) and `messages()` is the branch shown, switched with `switch_branch`.
Each chat may have a skill adapter (by library name, kept in the store; it goes with every request as
`ReplyOptions.skill`), a system prompt and sampling overrides applied on top of the options the window passes.
Widgets call it; it never touches widgets.
"""
from __future__ import annotations

import os
import sqlite3
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from core.storage.chats import KEEP, ChatStore, ReplyWriter, export_json, export_markdown

from .chat_answering import ChatAnswering
from .replies import LiveReply, ReplyOptions, answer_meta, history, sampling_of
from .settings import AppSettings, chat_sampling, load_settings, save_settings

__all__ = ["MODES", "ChatController", "LiveReply", "ReplyOptions", "answer_meta", "history", "sampling_of"]

MODES = {"Auto": "auto", "Reason": "reason", "Fast": "base"}


class ChatController(QObject, ChatAnswering):
    conversationsChanged = Signal()
    conversationOpened = Signal(str)
    messagesChanged = Signal()
    liveUpdated = Signal(object)
    notice = Signal(str)
    sendFailed = Signal(str)
    """A question could not be saved (disk full, database locked): its text, to put back in the box."""
    replyFailed = Signal(int, str)
    """(message id, why): the reply in that row failed; emitted before the chat is redrawn."""

    def __init__(self, service, store: ChatStore):
        super().__init__()
        self.service = service
        self.store = store
        self.current: str | None = None
        self.adapter: str | None = None
        """The open chat's skill adapter (a new chat: the one it is created with)."""
        self.live: LiveReply | None = None
        self._writer: ReplyWriter | None = None
        self._write_error: sqlite3.Error | None = None
        self._undo: dict | None = None
        self._pending: dict = {"system_prompt": None, "sampling": {}}
        """A new chat's system prompt and sampling overrides, stored once its first message creates it."""
        service.tokenReceived.connect(self._on_token)
        if store.recovered_from is not None:
            self.notice.emit(f"The chat database was unreadable; it was kept as {store.recovered_from.name} "
                             "and a fresh one was started.")

    # --- conversations -------------------------------------------------------------------------------
    def new_chat(self) -> None:
        self.current = None
        self.adapter = None
        self._pending = {"system_prompt": None, "sampling": {}}
        self.conversationOpened.emit("")
        self.messagesChanged.emit()

    def open(self, cid: str) -> None:
        self.current = cid
        self.adapter = self.store.adapter(cid)
        self.conversationOpened.emit(cid)
        self.messagesChanged.emit()

    def set_adapter(self, name: str | None, remember: bool = True) -> None:
        """Use skill adapter `name` (None: none) in the open chat; `remember`: stored with the chat."""
        self.adapter = name or None
        if remember and self.current is not None:
            self.store.set_adapter(self.current, self.adapter)

    def rename_adapter(self, old: str, new: str | None) -> None:
        """A library adapter was renamed (`new`) or removed (None): the chats using it follow."""
        self.store.rename_adapter(old, new)
        if self.adapter == old:
            self.adapter = new

    def conversations(self) -> list[dict]:
        """Every chat, pinned first, then most recently updated first: {'id', 'title', 'created', 'updated',
        'pinned' (0/1), ...}."""
        return self.store.conversations()

    def set_pinned(self, cid: str, pinned: bool) -> None:
        self.store.set_pinned(cid, pinned)
        self.conversationsChanged.emit()

    def chat_settings(self) -> dict:
        """The open chat's {'system_prompt': str | None, 'sampling': {key: value}} (a new chat: what it will get)."""
        if self.current is None:
            return {"system_prompt": self._pending["system_prompt"], "sampling": dict(self._pending["sampling"])}
        stored = self.store.chat_settings(self.current)
        return {**stored, "sampling": chat_sampling(stored["sampling"], strict=False)}

    def set_chat_settings(self, system_prompt=KEEP, sampling=KEEP) -> None:
        """Set the open chat's system prompt (None or blank: Ponder's own) and/or sampling overrides (a dict of
        `settings.CHAT_SAMPLING_KEYS`; None or {}: none); an argument left out is kept. A bad value raises
        ValueError and changes nothing."""
        if sampling is not KEEP:
            sampling = chat_sampling(sampling)
        if system_prompt is not KEEP:
            system_prompt = (system_prompt or "").strip() or None
        if self.current is not None:
            self.store.set_chat_settings(self.current, system_prompt=system_prompt, sampling=sampling)
            return
        if system_prompt is not KEEP:
            self._pending["system_prompt"] = system_prompt
        if sampling is not KEEP:
            self._pending["sampling"] = sampling

    def with_chat_settings(self, options: ReplyOptions) -> ReplyOptions:
        """`options` (the window's, from the preferences) with the open chat's system prompt and overrides."""
        settings = self.chat_settings()
        over = dict(settings["sampling"])
        if "answer_max_tokens" in over:
            over["max_tokens"] = over["answer_max_tokens"]
        return replace(options, system=settings["system_prompt"], **over)

    def search(self, text: str) -> list[dict]:
        """Full-text hits over all chats: {'id', 'conversation_id', 'title', 'snippet'}."""
        return self.store.search(text)

    def title(self, cid: str) -> str:
        return next((c["title"] for c in self.store.conversations() if c["id"] == cid), "")

    def export(self, cid: str, fmt: str) -> str:
        """The chat as Markdown ('md') or JSON ('json') text."""
        return export_markdown(self.store, cid) if fmt == "md" else export_json(self.store, cid)

    def export_to(self, cid: str, fmt: str, path: Path) -> None:
        """Write the export to `path` atomically: a full disk or a refused write (OSError) leaves any file already
        there as it was."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(self.export(cid, fmt), encoding="utf-8")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def rename(self, cid: str, title: str) -> None:
        self.store.rename(cid, title)
        self.conversationsChanged.emit()

    def delete(self, cid: str) -> bool:
        """Delete a chat (undoable); refused while that chat is being answered."""
        if self.live is not None and self.live.conversation_id == cid:
            self.notice.emit("Stop the answer before deleting this chat.")
            return False
        self._undo = self.store.delete(cid)
        if self.current == cid:
            self.new_chat()
        self.conversationsChanged.emit()
        return True

    def undo_delete(self) -> bool:
        if not self._undo:
            return False
        self.store.restore(self._undo)
        self._undo = None
        self.conversationsChanged.emit()
        return True

    def messages(self):
        """The open chat's shown branch, first message to last."""
        return self.store.path(self.current) if self.current else []

    # --- branches ------------------------------------------------------------------------------------
    def branch(self, message) -> tuple[int, int]:
        """(n, m): `message` (or its id) is alternative n of m (1-based) among its siblings."""
        mid = getattr(message, "id", message)
        sibs = self.store.siblings(mid)
        return (sibs.index(mid) + 1, len(sibs)) if mid in sibs else (1, 1)

    def switch_branch(self, message_id: int, delta: int) -> bool:
        """Show the sibling `delta` places from shown message `message_id` (‹ -1, › +1; no wrap around)."""
        if not self._can_change_branches(message_id):
            return False
        sibs = self.store.siblings(message_id)
        target = sibs[max(0, min(len(sibs) - 1, sibs.index(message_id) + delta))]
        if target == message_id:
            return False
        self.store.select(self.current, target)
        self.messagesChanged.emit()
        return True

    def delete_message(self, message_id: int) -> bool:
        """Delete shown message `message_id` and everything that follows it on any branch; a sibling (else its
        parent's branch) is shown instead."""
        if not self._can_change_branches(message_id):
            return False
        self.store.delete_branch(self.current, message_id)
        self.store.touch(self.current)
        self.conversationsChanged.emit()
        self.messagesChanged.emit()
        return True

    def _can_change_branches(self, message_id: int) -> bool:
        if self.current is None or all(m.id != message_id for m in self.messages()):
            return False
        if self.current_live is not None:
            self.notice.emit("Wait for the answer to finish (or stop it) before changing this chat's branches.")
            return False
        return True

    @property
    def current_live(self) -> LiveReply | None:
        """The streaming reply when it belongs to the open chat."""
        live = self.live
        return live if live is not None and live.conversation_id == self.current else None

    # --- preferences and window state (kept in the chat database) -------------------------------------
    @property
    def data_dir(self) -> Path:
        return self.store.file.parent

    def load_settings(self) -> AppSettings:
        return load_settings(self.store)

    def save_settings(self, settings: AppSettings) -> None:
        save_settings(self.store, settings)

    def window_state(self) -> str | None:
        return self.store.get_setting("window_geometry")

    def save_window_state(self, value: str) -> None:
        self.store.set_setting("window_geometry", value)
