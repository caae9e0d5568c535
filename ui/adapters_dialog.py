"""The Adapters dialog (Tools ▸ Adapters…): the current model's adapters from the adapter library, with import,
export, rename, delete, "use for reasoning", "use in this chat" and "train new".

It works on the library object the window hands it (app's `EngineService.library`) and says what it did, or why it
could not, in a line under the list; a failed operation changes nothing. Choosing an adapter is only signalled:
`AdapterActions` (ui.adapter_actions, mixed into MainWindow) applies the choices.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
)

from .dialogs import ConfirmDialog

KIND_LABELS = {"reasoning": "Reasoning", "skill": "Skill"}
METRICS_SHOWN = 3
FAILED = object()


class ImportPathDialog:
    @classmethod
    def ask(cls, parent) -> str | None:
        """A .zip, or an adapter folder (picked by its adapter_config.json)."""
        path, _ = QFileDialog.getOpenFileName(parent, "Import an adapter (a .zip, or a folder's adapter_config.json)",
                                              "", "Adapters (*.zip adapter_config.json)")
        if not path:
            return None
        return str(Path(path).parent) if Path(path).name == "adapter_config.json" else path


class ExportPathDialog:
    @classmethod
    def ask(cls, parent, name: str) -> str | None:
        path, _ = QFileDialog.getSaveFileName(parent, "Export the adapter", f"{name}.zip", "Zip archives (*.zip)")
        return path or None


class AdapterNameDialog:
    @classmethod
    def ask(cls, parent, current: str, error: str = "") -> str | None:
        """The new name (None: cancelled); `current` is filled in, `error` (why the last try failed) shown above."""
        label = "New name (lower-case letters, digits, . - _):"
        text, ok = QInputDialog.getText(parent, "Rename adapter", f"{error}\n\n{label}" if error else label,
                                        text=current)
        return text.strip() if ok and text.strip() else None


def metrics_text(metrics: dict) -> str:
    """A few of the card's numbers ("accuracy 0.62 · mean_tokens 118"); an evaluation's "after" when it has one."""
    if isinstance(metrics.get("after"), dict):
        metrics = metrics["after"]
    shown = []
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        shown.append(f"{key.replace('_', ' ')} {value:.3g}")
        if len(shown) == METRICS_SHOWN:
            break
    return " · ".join(shown)


class AdaptersDialog(QDialog):
    trainRequested = Signal()
    reasoningChosen = Signal(str)
    """Make this adapter the model's reasoning adapter."""
    skillChosen = Signal(object)
    """Use this skill adapter (or None) in the open chat."""
    renamed = Signal(str, str)
    """(old name, new name) of an adapter of the current model."""
    removed = Signal(str)
    libraryChanged = Signal()

    def __init__(self, library, model_id: str, parent=None):
        super().__init__(parent)
        self.library, self.model_id = library, model_id
        self.reasoning: str | None = None
        self.skill: str | None = None
        self.setWindowTitle("Adapters")
        self.resize(640, 460)
        self.header = QLabel(wordWrap=True)
        self.list = QListWidget()
        self.list.setAlternatingRowColors(True)
        self.list.setWordWrap(True)
        self.list.setSpacing(2)
        self.message = QLabel(wordWrap=True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.import_button = QPushButton("Import…")
        self.export_button = QPushButton("Export…")
        self.rename_button = QPushButton("Rename…")
        self.delete_button = QPushButton("Delete")
        self.reason_button = QPushButton("Use for reasoning")
        self.chat_button = QPushButton("Use in this chat")
        self.train_button = QPushButton("Train new…")
        close = QPushButton("Close")
        top = QHBoxLayout()
        for b in (self.import_button, self.export_button, self.rename_button, self.delete_button):
            top.addWidget(b)
        top.addStretch(1)
        top.addWidget(self.train_button)
        bottom = QHBoxLayout()
        bottom.addWidget(self.reason_button)
        bottom.addWidget(self.chat_button)
        bottom.addStretch(1)
        bottom.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.header)
        layout.addLayout(top)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.message)
        layout.addLayout(bottom)
        self.import_button.clicked.connect(self.import_adapter)
        self.export_button.clicked.connect(self.export_adapter)
        self.rename_button.clicked.connect(self.rename_adapter)
        self.delete_button.clicked.connect(self.delete_adapter)
        self.reason_button.clicked.connect(self.use_for_reasoning)
        self.chat_button.clicked.connect(self.use_in_chat)
        self.train_button.clicked.connect(self.trainRequested)
        close.clicked.connect(self.close)
        self.list.currentItemChanged.connect(lambda *_: self._update_buttons())
        QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.list, activated=self.delete_adapter)

    # --- showing -------------------------------------------------------------------------------------
    def show_state(self, model_id: str, reasoning: str | None, skill: str | None) -> None:
        """The model whose adapters are listed, its reasoning adapter and the open chat's skill adapter."""
        self.model_id, self.reasoning, self.skill = model_id, reasoning, skill
        self.refresh()

    def cards(self) -> list:
        try:
            return self.library.list(self.model_id)
        except Exception as err:  # an unreadable library folder: say so, list nothing
            self.say(f"The adapter library could not be read: {err}")
            return []

    def refresh(self, select: str | None = None) -> None:
        select = select or self.selected_name()
        reasoning = self.reasoning or "none — Reason and Auto are off for this model"
        self.header.setText(f"<b>Adapters for {self.model_id}</b><br>Reasoning adapter: {reasoning}"
                            f"<br>This chat's adapter: {self.skill or 'none'}")
        self.list.clear()
        for card in self.cards():
            item = QListWidgetItem(self._item_text(card))
            item.setData(Qt.ItemDataRole.UserRole, card)
            item.setToolTip(str(card.folder))
            self.list.addItem(item)
            if card.name == select:
                self.list.setCurrentItem(item)
        if self.list.count() == 0:
            item = QListWidgetItem("No adapters for this model yet. Train one (Train new…) or import one (Import…).")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.list.addItem(item)
        self._update_buttons()

    def _item_text(self, card) -> str:
        marks = [KIND_LABELS.get(card.kind, card.kind)]
        if card.builtin:
            marks.append("built-in")
        if card.kind == "reasoning" and card.name == self.reasoning:
            marks.append("reasons for this model")
        if card.kind == "skill" and card.name == self.skill:
            marks.append("used in this chat")
        details = [f"for {card.base_model}", f"created {card.created.replace('T', ' ')[:16]}" if card.created else ""]
        details.append(metrics_text(card.metrics))
        return f"{card.name}   ({', '.join(marks)})\n{' · '.join(d for d in details if d)}"

    def selected(self):
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item is not None else None

    def selected_name(self) -> str | None:
        card = self.selected()
        return card.name if card is not None else None

    def select(self, name: str) -> None:
        for i in range(self.list.count()):
            card = self.list.item(i).data(Qt.ItemDataRole.UserRole)
            if card is not None and card.name == name:
                self.list.setCurrentRow(i)
                return

    def _update_buttons(self) -> None:
        card = self.selected()
        own = card is not None and not card.builtin
        self.export_button.setEnabled(card is not None)
        self.rename_button.setEnabled(own)
        self.delete_button.setEnabled(own)
        self.delete_button.setToolTip("Built-in adapters cannot be deleted." if card is not None and not own else "")
        self.reason_button.setEnabled(card is not None and card.kind == "reasoning" and card.name != self.reasoning)
        self.chat_button.setEnabled(card is not None and card.kind == "skill")
        self.chat_button.setText("Stop using in this chat" if card is not None and card.kind == "skill"
                                 and card.name == self.skill else "Use in this chat")

    def say(self, text: str) -> None:
        self.message.setText(text)

    def _do(self, what: str, fn, *args):
        """Run a library operation; on failure say why (the library changes nothing then) and return FAILED."""
        try:
            return fn(*args)
        except Exception as err:  # AdapterError, a bad name, a full disk: one line for the user
            self.say(f"Could not {what}: {err}")
            return FAILED

    # --- actions -------------------------------------------------------------------------------------
    def import_adapter(self, path: str | None = None) -> None:
        path = path or ImportPathDialog.ask(self)
        if not path:
            return
        card = self._do("import the adapter", self.library.import_path, Path(path), self.model_id)
        if card is not FAILED:
            self.say(f"Imported “{card.name}” ({KIND_LABELS.get(card.kind, card.kind).lower()} adapter).")
            self.refresh(select=card.name)
            self.libraryChanged.emit()

    def export_adapter(self) -> None:
        card = self.selected()
        if card is None:
            return
        dest = ExportPathDialog.ask(self, card.name)
        if not dest:
            return
        out = self._do("export the adapter", self.library.export, self.model_id, card.name, Path(dest))
        if out is not FAILED:
            self.say(f"Exported “{card.name}” to {out}.")

    def rename_adapter(self) -> None:
        card = self.selected()
        if card is None:
            return
        if card.builtin:
            self.say(f"“{card.name}” is built in: it cannot be renamed (export it to get a copy).")
            return
        new, error = card.name, ""
        while True:  # a name that fails is asked again, as typed, with why (until renamed or cancelled)
            new = AdapterNameDialog.ask(self, new, error=error)
            if not new or new == card.name:
                return
            renamed = self._do("rename the adapter", self.library.rename, self.model_id, card.name, new)
            if renamed is not FAILED:
                break
            error = self.message.text()
        self.say(f"Renamed “{card.name}” to “{renamed.name}”.")
        self.renamed.emit(card.name, renamed.name)
        self.refresh(select=renamed.name)
        self.libraryChanged.emit()

    def delete_adapter(self) -> None:
        card = self.selected()
        if card is None:
            return
        if card.builtin:
            self.say(f"“{card.name}” is built in: it cannot be deleted.")
            return
        if not ConfirmDialog.ask(self, "Delete adapter", f"Delete the adapter “{card.name}” for {self.model_id}? "
                                 "Chats that use it will answer without it. This cannot be undone."):
            return
        if self._do("delete the adapter", self.library.remove, self.model_id, card.name) is FAILED:
            return
        self.say(f"Deleted “{card.name}”.")
        self.removed.emit(card.name)
        self.refresh()
        self.libraryChanged.emit()

    def use_for_reasoning(self) -> None:
        card = self.selected()
        if card is not None and card.kind == "reasoning":
            self.reasoningChosen.emit(card.name)

    def use_in_chat(self) -> None:
        card = self.selected()
        if card is not None and card.kind == "skill":
            self.skillChosen.emit(None if card.name == self.skill else card.name)
