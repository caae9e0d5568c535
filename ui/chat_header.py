"""The chat header above the transcript: the chat's title (double-click to rename it in place), the model
picker (the installed models; choosing one asks the window to switch the running model, and it shows the
loading state meanwhile), and the "Chat settings" button (system prompt, preset and sampling for this chat).
Emits what the user asked for; the window does it, through `ShellActions` (mixed into MainWindow): the menus,
the header, the welcome panel, the text size and pinned chats."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QAction, QFont, QFontMetrics, QKeySequence
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSizePolicy,
    QStackedWidget,
    QToolButton,
    QWidget,
)

from .dialogs import show_info

NEW_CHAT = "New chat"
SHORTCUTS = """Ctrl+Enter  send (Enter too, with "Enter sends" in Settings)
Shift+Enter  new line
Esc  stop the answer
Ctrl+=  /  Ctrl+−  /  Ctrl+0  bigger / smaller / default text
Ctrl+N  new chat
Ctrl+F  search all chats
Ctrl+,  settings
Ctrl+Shift+,  this chat's settings (system prompt, sampling); double-click its title to rename it
Ctrl+M  models
Ctrl+Shift+A  adapters
Ctrl+Q  quit"""


class TitleLabel(QLabel):
    """The title, elided to its width; double-click asks to edit it."""

    doubleClicked = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.full = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        font = QFont(self.font())
        font.setPointSizeF(font.pointSizeF() * 1.15)
        font.setWeight(QFont.Weight.DemiBold)
        self.setFont(font)

    def set_full(self, text: str) -> None:
        self.full = text
        self.setToolTip(text)
        self._elide()

    def _elide(self) -> None:
        self.setText(QFontMetrics(self.font()).elidedText(self.full, Qt.TextElideMode.ElideRight, max(40, self.width())))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def mouseDoubleClickEvent(self, event) -> None:
        self.doubleClicked.emit()


class ChatHeader(QWidget):
    renameRequested = Signal(str)
    """The new title typed in place."""
    modelChosen = Signal(str)
    """The model id picked (only when it differs from the running one)."""
    settingsRequested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent, objectName="chatHeader")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.editable = False
        self.chat: str | None = None
        """The id of the chat whose title is shown (None: a new chat)."""
        self.current_model = ""
        self.title = TitleLabel()
        self.title.setAccessibleName("Chat title")
        self.title_edit = QLineEdit()
        self.title_edit.setAccessibleName("New chat title")
        self.title_stack = QStackedWidget()
        self.title_stack.addWidget(self.title)
        self.title_stack.addWidget(self.title_edit)
        self.title_stack.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.title_stack.setFixedHeight(self.title_edit.sizeHint().height())
        self.models = QComboBox()
        self.models.setAccessibleName("Model")
        self.models.setToolTip("The model answering: pick another installed one to switch (Tools ▸ Models to "
                               "install more)")
        self.models.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.loading = QLabel("", objectName="muted")
        self.loading.setVisible(False)
        self.summary = QLabel("", objectName="muted")
        self.settings_button = QToolButton(text="Chat settings", objectName="chip")
        self.settings_button.setToolTip("System prompt, preset and sampling for this chat")
        self.settings_button.setAccessibleName("Chat settings")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 8, 6)
        layout.setSpacing(8)
        layout.addWidget(self.title_stack, 1)
        layout.addWidget(self.loading)
        layout.addWidget(self.models)
        layout.addWidget(self.summary)
        layout.addWidget(self.settings_button)
        self.title.doubleClicked.connect(self.start_rename)
        self.title_edit.editingFinished.connect(self.finish_rename)
        self.title_edit.installEventFilter(self)
        self.models.activated.connect(self._model_activated)
        self.settings_button.clicked.connect(self.settingsRequested)
        self.set_title(NEW_CHAT, editable=False)

    # --- title ---------------------------------------------------------------------------------------
    def set_title(self, title: str, editable: bool = True, chat: str | None = None) -> None:
        """Show `title` of chat `chat`; `editable`: a saved chat (a new, empty one has nothing to rename yet).
        A rename being typed for the same chat stays open (the chat list refreshing, e.g. when a reply
        finishes, must not save half a title); another chat's title cancels it."""
        if self.title_stack.currentWidget() is self.title_edit and (chat != self.chat or not editable):
            self.cancel_rename()
        self.editable, self.chat = editable, chat
        self.title.set_full(title or NEW_CHAT)
        self.title.setToolTip(f"{title} — double-click to rename" if editable else title)

    def start_rename(self) -> None:
        if not self.editable:
            return
        self.title_edit.setText(self.title.full)
        self.title_stack.setCurrentWidget(self.title_edit)
        self.title_edit.selectAll()
        self.title_edit.setFocus()

    def finish_rename(self) -> None:
        if self.title_stack.currentWidget() is not self.title_edit:
            return
        text = self.title_edit.text().strip()
        self.title_stack.setCurrentWidget(self.title)
        if text and text != self.title.full:
            self.title.set_full(text)
            self.renameRequested.emit(text)

    def cancel_rename(self) -> None:
        self.title_edit.setText(self.title.full)  # editingFinished (focus leaving) then changes nothing
        self.title_stack.setCurrentWidget(self.title)

    def eventFilter(self, obj, event) -> bool:
        """Esc in the title editor cancels the rename and Ctrl+Enter finishes it (before the window's Esc = Stop
        and Ctrl+Enter = Send shortcuts see them)."""
        if obj is self.title_edit and event.type() in (QEvent.Type.ShortcutOverride, QEvent.Type.KeyPress):
            if event.key() == Qt.Key.Key_Escape:
                event.accept()
                if event.type() == QEvent.Type.KeyPress:
                    self.cancel_rename()
                return True
            if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and event.type() == QEvent.Type.ShortcutOverride:
                event.accept()  # the editor gets the key press: Enter with any modifier finishes the rename
                return True
        return super().eventFilter(obj, event)

    # --- model picker --------------------------------------------------------------------------------
    def set_models(self, models: list[tuple[str, str]], current: str) -> None:
        """The installed models as (id, display name), `current` (the running one) selected; emits nothing."""
        self.current_model = current
        self.models.blockSignals(True)
        self.models.clear()
        for model_id, name in models:
            self.models.addItem(name or model_id, model_id)
        if current and self.models.findData(current) < 0:
            self.models.addItem(current, current)  # running but not in the store (e.g. an injected engine)
        self.models.setCurrentIndex(max(0, self.models.findData(current)))
        self.models.blockSignals(False)

    def model_ids(self) -> list[str]:
        return [self.models.itemData(i) for i in range(self.models.count())]

    def set_loading(self, loading: bool, text: str = "Loading…") -> None:
        """While a model loads the picker is disabled and says so."""
        self.loading.setText(text if loading else "")
        self.loading.setVisible(loading)
        self.models.setEnabled(not loading)

    def _model_activated(self, _index: int) -> None:
        chosen = self.models.currentData()
        if chosen and chosen != self.current_model:
            self.modelChosen.emit(chosen)

    # --- chat settings -------------------------------------------------------------------------------
    def set_summary(self, text: str, available: bool = True) -> None:
        """A short note next to the button (e.g. 'Teacher · T 0.2'); `available`: the chat can have settings."""
        self.summary.setText(text)
        self.summary.setVisible(bool(text))
        self.settings_button.setEnabled(available)


def settings_summary(chat: dict) -> str:
    """'Teacher · 2 overrides' for a chat's settings; '' when it uses the defaults."""
    from .chat_settings_dialog import preset_of

    parts = []
    if (chat.get("system_prompt") or "").strip():
        parts.append(preset_of(chat["system_prompt"]))
    n = len(chat.get("sampling") or {})
    if n:
        parts.append(f"{n} override{'s' if n != 1 else ''}")
    return " · ".join(parts)


class ShellActions:
    """The window's menus, and its side of the chat header, the welcome panel, the text size and pinned chats
    (mixed into MainWindow, which has `controller`, `service`, `model_service`, `settings`, `header`, `welcome`,
    `view`, `composer`, `stack`, `sidebar` and `status`)."""

    # --- menus ---------------------------------------------------------------------------------------
    def _menus(self) -> None:
        """Chat, Tools, View and Help menus with their shortcuts."""
        def add(menu, text, slot, shortcut=None):
            action = QAction(text, self)
            if shortcut:
                action.setShortcut(QKeySequence(shortcut))
            action.triggered.connect(slot)
            menu.addAction(action)
            return action

        bar = self.menuBar()
        chat = bar.addMenu("&Chat")
        add(chat, "New chat", self.new_chat, "Ctrl+N")
        add(chat, "Search all chats", self.sidebar.search.setFocus, "Ctrl+F")
        add(chat, "Export as Markdown…", lambda: self.controller.current and self.export(self.controller.current, "md"))
        add(chat, "Export as JSON…", lambda: self.controller.current and self.export(self.controller.current, "json"))
        chat.addSeparator()
        add(chat, "Quit", self.close, "Ctrl+Q")
        tools = bar.addMenu("&Tools")
        self.models_action = add(tools, "Models…", self.open_models, "Ctrl+M")
        add(tools, "Adapters…", self.open_adapters, "Ctrl+Shift+A")
        add(tools, "Train an adapter…", self.open_train_wizard)
        add(tools, "Settings…", self.open_settings, "Ctrl+,")
        view = bar.addMenu("&View")
        self.bigger_action = add(view, "Bigger text", lambda: self.zoom(1), "Ctrl+=")
        self.bigger_action.setShortcuts([QKeySequence("Ctrl+="), QKeySequence("Ctrl++")])
        self.smaller_action = add(view, "Smaller text", lambda: self.zoom(-1), "Ctrl+-")
        self.reset_size_action = add(view, "Default text size", lambda: self.zoom(0), "Ctrl+0")
        view.addSeparator()
        add(view, "Chat settings…", self.open_chat_settings, "Ctrl+Shift+,")
        help_menu = bar.addMenu("&Help")
        add(help_menu, "Keyboard shortcuts", lambda: show_info(self, "Keyboard shortcuts", SHORTCUTS))
        add(help_menu, "About Ponder", lambda: show_info(
            self, "About Ponder", "Ponder: an offline reasoning assistant. Everything runs on this computer; "
            "nothing is sent anywhere."))


    # --- header --------------------------------------------------------------------------------------
    def refresh_header(self, *_args) -> None:
        c = self.controller
        cid = c.current
        self.header.set_title(c.title(cid) if cid else NEW_CHAT, editable=cid is not None, chat=cid)
        chat = self.current_chat_settings()
        self.header.set_summary(settings_summary(chat) if chat else "")

    def rename_from_header(self, title: str) -> None:
        if self.controller.current is not None:
            self.controller.rename(self.controller.current, title)

    def refresh_models(self, *_args) -> None:
        """The picker: installed models (the model service's store), the running one selected."""
        running = self.service.model_name
        models = []
        if self.model_service is not None:
            try:
                models = [(r.id, r.name) for r in self.model_service.rows() if r.installed]
            except OSError:  # an unreadable model folder: the running model is still listed
                models = []
        self.header.set_models(models, running)

    def on_model_chosen(self, model_id: str, reason: str) -> None:
        """First launch: remember the model chosen for this machine and say which one and why, in the status bar
        while it is set up and once it is ready; the picker and Tools ▸ Models change it."""
        from dataclasses import replace

        self.settings = replace(self.settings, model_id=model_id)
        self.controller.save_settings(self.settings)
        if self.model_service is not None:
            self.model_service.active_id = model_id
        self.chosen_note = f"Chosen for this computer: {reason} Change it with the model picker or Tools ▸ Models."
        self.status.setText(self.chosen_note)
        self.header.set_loading(True, "Setting up the model…")

    def choose_model(self, model_id: str) -> None:
        name = self.header.models.currentText() or model_id
        self.header.set_loading(True, f"Loading {name}…")
        self.status.setText(f"Switching to {name}…")
        self.switch_model(model_id)

    # --- chat settings (system prompt, preset, sampling overrides) -----------------------------------
    def current_chat_settings(self) -> dict:
        """The open chat's settings (a new chat: what it will be created with)."""
        return self.controller.chat_settings()

    def open_chat_settings(self) -> None:
        from .chat_settings_dialog import ChatSettingsDialog

        current = self.current_chat_settings()
        title = self.controller.title(self.controller.current) if self.controller.current else NEW_CHAT
        chosen = ChatSettingsDialog.ask(self, current, self.settings, title)
        if chosen is not None:
            self.save_chat_settings(chosen)

    def save_chat_settings(self, chosen: dict) -> bool:
        """Store the open chat's settings (a new chat keeps them until its first message creates it)."""
        try:
            self.controller.set_chat_settings(system_prompt=chosen.get("system_prompt"),
                                              sampling=chosen.get("sampling") or {})
        except ValueError as err:
            self.status.setText(f"Chat settings not saved: {err}")
            return False
        self.status.setText("Chat settings saved." if self.controller.current else
                            "Chat settings saved: they apply from this chat's first message.")
        self.refresh_header()
        return True

    def on_conversation_opened(self, cid: str) -> None:
        self.sidebar.select(cid or None)
        self.refresh_header()
        self.update_welcome()

    # --- welcome panel -------------------------------------------------------------------------------
    def update_welcome(self, *_args) -> None:
        """The welcome panel in place of an empty chat (nothing stored, nothing streaming)."""
        c = self.controller
        empty = c.current is None or (c.current_live is None and not c.messages())
        self.stack.setCurrentWidget(self.welcome if empty else self.view)

    def use_example(self, text: str, mode: str) -> None:
        self.composer.input.setPlainText(text)
        if not self.composer.set_mode(mode):
            self.status.setText("This model cannot reason yet, so the example is asked in Fast mode.")
        self.composer.input.setFocus()
        self.composer.input.moveCursor(self.composer.input.textCursor().MoveOperation.End)

    # --- text size -----------------------------------------------------------------------------------
    def apply_font_size(self) -> None:
        """The transcript and the composer at the settings' font size."""
        from .theme import set_text_size

        points = self.settings.font_size
        set_text_size(self.view, points)
        sized = getattr(self.view, "set_font_size", None)
        if callable(sized):
            sized(points)
        self.composer.set_font_size(points)

    def zoom(self, step: int) -> None:
        """Bigger (+1), smaller (-1) or the default size (0); saved with the settings."""
        from dataclasses import replace

        from app.settings import FONT_SIZES, AppSettings

        lo, hi = FONT_SIZES
        size = AppSettings().font_size if step == 0 else min(hi, max(lo, self.settings.font_size + step))
        if size != self.settings.font_size:
            self.settings = replace(self.settings, font_size=size)
            self.controller.save_settings(self.settings)
            self.apply_font_size()
        self.status.setText(f"Text size {size} pt")

    # --- pinned chats --------------------------------------------------------------------------------
    def set_pinned(self, cid: str, pinned: bool) -> None:
        self.controller.set_pinned(cid, pinned)
        self.refresh_conversations()
