"""`TranscriptActions`, the main window's chat list and transcript part (mixed into MainWindow): the sidebar's
list and search, rename, delete and undo, export, and the transcript's redraws (coalesced while an answer streams)
and card actions (copy, details, regenerate, think longer, pick a candidate, branches, delete, edit). It asks the
chat controller for everything; the window does the layout and the wiring."""
from __future__ import annotations

import re

from PySide6.QtGui import QGuiApplication

from .chat_view import details_text
from .dialogs import ConfirmDialog, EditDialog, ExportDialog, RenameDialog, show_info

RENDER_INTERVAL_MS = 50


class TranscriptActions:
    """The window's chat list and transcript; needs its controller, service, sidebar, view, status, undo_button,
    _render_timer, spawn and options."""

    # --- conversations -------------------------------------------------------------------------------
    def refresh_conversations(self) -> None:
        if self.sidebar.search.text().strip():
            self.on_search(self.sidebar.search.text())
        else:
            self.sidebar.show_conversations(self.controller.conversations(), self.controller.current)

    def on_search(self, text: str) -> None:
        if text.strip():
            self.sidebar.show_results(self.controller.search(text))
        else:
            self.sidebar.show_conversations(self.controller.conversations(), self.controller.current)

    def rename(self, cid: str) -> None:
        title = RenameDialog.ask(self, self.controller.title(cid))
        if title:
            self.controller.rename(cid, title)

    def delete(self, cid: str) -> None:
        if not self.controller.delete(cid):
            return
        self.undo_button.setVisible(True)
        self.status.setText("Chat deleted.")

    def undo_delete(self) -> None:
        if self.controller.undo_delete():
            self.status.setText("Chat restored.")
        self.undo_button.setVisible(False)

    def export(self, cid: str, fmt: str) -> None:
        safe = re.sub(r"[^\w\- ]+", "", self.controller.title(cid)).strip() or "chat"
        path = ExportDialog.ask(self, f"{safe}.{fmt}", fmt)
        if path:
            try:
                self.controller.export_to(cid, fmt, path)
            except OSError as err:
                self.status.setText(f"Could not export to {path}: {err.strerror or err}")
                return
            self.status.setText(f"Exported to {path}")

    def schedule_render(self, *_args) -> None:
        """Coalesce streaming updates: redraw the live card at most every RENDER_INTERVAL_MS, never per token."""
        if not self._render_timer.isActive():
            self._render_timer.start()

    # --- transcript actions --------------------------------------------------------------------------
    def render(self, live_only: bool = False) -> None:
        """The whole transcript (cards reused, redrawn only where a message changed); `live_only` (the streaming
        timer): just the live card, without reading the chat from the store."""
        live = self.controller.current_live
        if live_only and live is not None and self.view.update_live(live):
            return
        msgs = self.controller.messages()
        branches = {}
        for m in msgs:
            n, count = self.controller.branch(m)
            if count > 1:
                branches[m.id] = (n, count)
        self.view.render(msgs, live, self.service.busy, self.service.ready and self.service.can_reason,
                         branches=branches, can_delete=True)

    def on_action(self, verb: str, args: list) -> None:
        msgs = {m.id: m for m in self.controller.messages()}
        mid = int(args[0]) if args and args[0].lstrip("-").isdigit() else None
        if verb == "toggle":
            self.render()
        elif verb == "copy" and mid in msgs:
            QGuiApplication.clipboard().setText(msgs[mid].content)
        elif verb == "copycode":
            QGuiApplication.clipboard().setText(self.view.code_blocks.get(args[0], ""))
        elif verb == "details" and mid in msgs:
            show_info(self, "Answer details", details_text(msgs[mid]))
        elif verb in ("regen", "regenerate", "retry") and (mid is None or mid in msgs):  # that reply's question
            self.spawn(self.controller.regenerate(self.options(), mid))
        elif verb in ("longer", "think"):
            self.spawn(self.controller.think_longer(mid, 256))
        elif verb == "pick":
            self.controller.pick_candidate(mid, int(args[1]))
        elif verb == "branch" and hasattr(self.controller, "switch_branch"):
            self.controller.switch_branch(mid, int(args[1]))
        elif verb == "delete" and hasattr(self.controller, "delete_message") and mid in msgs:
            if ConfirmDialog.ask(self, "Delete message", "Delete this message and everything that follows it "
                                 "(its other versions stay)?"):
                self.controller.delete_message(mid)
        elif verb == "edit":
            m = msgs[mid]
            text = EditDialog.ask(self, m.content)
            if text:
                self.spawn(self.controller.edit_and_resend(m.id, text, self.options()))
