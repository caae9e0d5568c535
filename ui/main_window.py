"""The main window: sidebar | transcript + composer, status bar with model state and undo. Layout and wiring
only; behaviour lives in app.chat_controller and app.engine_service, injected by the constructor. Adapters: the
chat's skill adapter (composer), each model's reasoning adapter (settings, applied on load without a reload),
the Adapters dialog and the training wizard."""
from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import replace

from PySide6.QtCore import QByteArray, QTimer
from PySide6.QtWidgets import (
    QLabel,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.settings import AppSettings, budget_note, composer_budget

from .adapter_actions import NO_REASONING, AdapterActions
from .chat_header import ChatHeader, ShellActions  # ShellActions: the menus, header, welcome, text size
from .chat_view import ChatView
from .composer import Composer
from .dialogs import ConfirmDialog, show_info
from .main_stages import STAGES
from .settings_dialog import SettingsDialog
from .sidebar import Sidebar
from .theme import apply_theme
from .transcript_actions import RENDER_INTERVAL_MS, TranscriptActions  # the chat list and the transcript's actions
from .welcome import Welcome


def eta(elapsed: float, done: int, left: int) -> str:
    """' — about N s left' at the stage's rate so far, once it has measured something (else '')."""
    if done <= 0 or left <= 0 or elapsed < 1:
        return ""
    seconds = elapsed / done * left
    return f" — about {seconds / 60:.0f} min left" if seconds >= 90 else f" — about {max(1, round(seconds))} s left"


class MainWindow(TranscriptActions, QMainWindow, AdapterActions, ShellActions):
    def __init__(self, service, controller, model_service=None, parent=None):
        super().__init__(parent)
        self.service, self.controller, self.model_service = service, controller, model_service
        self.settings = controller.load_settings()
        self.model_manager = None
        self.server = None
        """app.server.InAppServer once the local OpenAI server switch has been used."""
        self._offered_gguf = False
        self._loading = False
        self._pending_question: tuple | None = None
        """(text, options) of a question asked while the model loads."""
        self.chosen_note = ""
        self._stage: tuple[str, float, int] = ("", 0.0, 0)
        """The stage in progress: its name, when it started and where it started (for the time left)."""
        """First launch: which model was chosen for this computer and why (core.machine_fit)."""
        """Asked while the model was still loading: sent as soon as it is ready."""
        self._tasks: set[asyncio.Task] = set()
        self.setWindowTitle("Ponder")
        self.resize(1100, 760)
        self.sidebar = Sidebar()
        self.header = ChatHeader()
        self.view = ChatView()
        self.welcome = Welcome()
        self.stack = QStackedWidget()
        """The welcome panel for an empty chat, else the transcript."""
        self.stack.addWidget(self.welcome)
        self.stack.addWidget(self.view)
        self.composer = Composer()
        self.progress_bar = QProgressBar(visible=False)
        right = QWidget()
        col = QVBoxLayout(right)
        col.setContentsMargins(0, 0, 10, 10)
        col.setSpacing(8)
        col.addWidget(self.header)
        col.addWidget(self.stack, 1)
        col.addWidget(self.progress_bar)
        col.addWidget(self.composer)
        split = QSplitter()
        split.setChildrenCollapsible(False)
        split.addWidget(self.sidebar)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([260, 840])
        self.setCentralWidget(split)
        self.status = QLabel("Starting…")
        self.undo_button = QPushButton("Undo delete", visible=False)
        self.statusBar().addWidget(self.status, 1)
        self.statusBar().addPermanentWidget(self.undo_button)
        self._render_timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(lambda: self.render(live_only=True))
        self.controller.replyFailed.connect(self.view.set_error)  # on that reply's card; all errors: status bar
        self._menus()
        self._wire()
        self._restore_settings()
        self.refresh_conversations()
        self.render()

    def _wire(self) -> None:
        s, c = self.service, self.controller
        s.stateChanged.connect(self.on_state)
        s.progress.connect(self.on_progress)
        s.busyChanged.connect(self.on_busy)
        s.failed.connect(self.on_failed)
        s.warned.connect(lambda text: show_info(self, "Ponder", text))
        s.answerFinished.connect(self.on_answer)
        c.conversationsChanged.connect(self.refresh_conversations)
        c.messagesChanged.connect(self.render)
        c.liveUpdated.connect(self.schedule_render)
        c.notice.connect(lambda text: show_info(self, "Ponder", text))
        c.sendFailed.connect(self.composer.input.setPlainText)
        c.conversationOpened.connect(self.refresh_adapters)
        s.adaptersChanged.connect(self.on_adapters_changed)
        s.modelChosen.connect(self.on_model_chosen)
        self.composer.adapterChosen.connect(self.choose_skill)
        self.sidebar.newRequested.connect(self.new_chat)
        self.sidebar.selected.connect(c.open)
        self.sidebar.searchChanged.connect(self.on_search)
        self.sidebar.renameRequested.connect(self.rename)
        self.sidebar.deleteRequested.connect(self.delete)
        self.sidebar.exportRequested.connect(self.export)
        self.sidebar.pinRequested.connect(self.set_pinned)
        c.conversationOpened.connect(self.on_conversation_opened)
        c.conversationsChanged.connect(self.refresh_header)
        c.messagesChanged.connect(self.update_welcome)
        self.header.renameRequested.connect(self.rename_from_header)
        self.header.modelChosen.connect(lambda model_id: self.choose_model(model_id))
        self.header.settingsRequested.connect(self.open_chat_settings)
        self.welcome.exampleChosen.connect(self.use_example)
        if self.model_service is not None:
            self.model_service.changed.connect(self.refresh_models)
        self.composer.sendRequested.connect(self.on_send)
        self.composer.stopRequested.connect(s.cancel)
        self.view.action.connect(self.on_action)
        self.undo_button.clicked.connect(self.undo_delete)
        self.on_busy(False)

    def new_chat(self) -> None:
        self.controller.new_chat()
        self.apply_composer_defaults()

    def apply_composer_defaults(self) -> None:
        s = self.settings
        self.composer.apply(s.mode, composer_budget(s, self.service.model_name), s.parallel)
        self.update_reasoning_available()

    def update_reasoning_available(self) -> None:
        ready = self.service.ready
        self.composer.set_reasoning_available(ready and self.service.can_reason, NO_REASONING if ready else "")
        model = self.service.model_name  # the figures are the shipped adapter's: none for a library one
        shipped = ready and self.service.can_reason and not self.settings.reasoning_adapters.get(model)
        self.composer.set_budget_note(budget_note(model) if shipped else "")

    # --- settings and models --------------------------------------------------------------------------
    def open_settings(self) -> None:
        chosen = SettingsDialog.ask(self, self.settings, self.controller.data_dir)
        if chosen is not None:  # the dialog shows neither the reasoning adapters nor the model: both are kept as
            self.apply_settings(replace(chosen, reasoning_adapters=self.settings.reasoning_adapters,  # they are now
                                        model_id=self.settings.model_id))  # (a switch may finish while it is open)

    def apply_settings(self, new: AppSettings) -> None:
        old, self.settings = self.settings, new
        self.controller.save_settings(new)
        apply_theme(new.theme)
        self.apply_composer_defaults()
        self.composer.set_enter_sends(new.enter_sends)
        if new.font_size != old.font_size:
            self.apply_font_size()
        if new.threads != old.threads:
            self.spawn(self.service.set_threads(new.threads or None))
        self.status.setText("Settings saved.")
        if new.decode != old.decode:
            self.spawn(self._apply_decode(new.decode))
        if (new.serve, new.serve_port) != (old.serve, old.serve_port):
            self.apply_server(new)

    async def _apply_decode(self, decode: str) -> None:
        note = await self.service.set_decode(decode)
        if note:
            self.status.setText(note)

    def apply_server(self, s: AppSettings) -> None:
        """Start or stop the local OpenAI server on the window's engine (its requests queue with the window's)."""
        if self.server is None and not s.serve:
            return
        if self.server is None:
            from app.server import InAppServer

            self.server = InAppServer(self.service.worker)
        try:
            url = self.server.apply(s.serve, s.serve_port)
        except OSError as err:
            show_info(self, "Ponder", f"The OpenAI API could not be served on port {s.serve_port}: "
                                      f"{err.strerror or err}")
            return
        self.status.setText(f"Serving the OpenAI API at {url}" if url else "The OpenAI API server is stopped.")

    def open_models(self) -> None:
        from .model_manager import ModelManager

        if self.model_service is None:
            from app.model_service import ModelService

            self.model_service = ModelService(active_id=self.service.model_name)
        if self.model_manager is None:
            self.model_manager = ModelManager(self.model_service, self)
            self.model_manager.useRequested.connect(self.choose_model)
            self.model_service.changed.connect(self.refresh_models)
        self.model_service.active_id = self.service.model_name
        self.model_manager.refresh()
        self.model_manager.show()
        self.model_manager.raise_()

    def switch_model(self, model_id: str) -> None:
        async def run():
            if await self.service.switch_model(model_id, self.settings.reasoning_adapters.get(model_id)):
                self.settings = replace(self.settings, model_id=model_id)
                self.controller.save_settings(self.settings)
            if self.model_service is not None:
                self.model_service.active_id = self.service.model_name
            if self.model_manager is not None:
                self.model_manager.refresh()
            self.header.set_loading(False)
            self.refresh_models()

        self.spawn(run())

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # keep a reference until it finishes
        task.add_done_callback(self._tasks.discard)
        return task

    def options(self):
        from app.chat_controller import ReplyOptions

        o, s = self.composer.options(), self.settings
        return ReplyOptions(mode=o["mode"], budget=o["budget"], parallel=o["parallel"],
                            temperature=s.parallel_temperature if o["parallel"] > 1 else s.temperature, top_p=s.top_p,
                            top_k=s.top_k, repetition_penalty=s.repetition_penalty,
                            answer_max_tokens=s.answer_max_tokens, max_tokens=s.answer_max_tokens,
                            skill=self.controller.adapter)

    # --- state ---------------------------------------------------------------------------------------
    def on_send(self, text: str) -> None:
        """Send now; while the model loads, keep the question and send it when ready (never drop it silently)."""
        if self.service.ready:
            self.spawn(self.controller.send(text, self.options()))
        elif self._loading and self._pending_question is not None:  # one question waits already: keep this one
            self.composer.input.setPlainText(text)
            self.status.setText("A question is already waiting for the model; send this one after it.")
        elif self._loading:
            self._pending_question = (text, self.options())  # sent with the options it was asked with
            self.status.setText("Loading the model — your question will be sent as soon as it is ready.")
            self.header.set_loading(True, "Loading… your question is queued")
        else:
            self.composer.input.setPlainText(text)
            self.status.setText("No model is loaded — open Tools ▸ Models (Ctrl+M) to install or pick one.")

    def on_state(self, state: str) -> None:
        text = {"loading": "Loading model…", "ready": f"Ready — {self.service.model_name}",
                "error": "The model failed to load"}
        self._loading = state == "loading"
        self.status.setText(" ".join(filter(None, (text.get(state, state) + ".", self.chosen_note))))
        self.header.set_loading(self._loading, "Loading…" if self._loading else "")
        if state == "ready":
            self.refresh_models()
        if state != "loading":
            self.progress_bar.setVisible(False)
        if state == "ready":
            self.apply_composer_defaults()
            self.refresh_adapters()
            self.apply_reasoning_adapter()
            if not self.service.can_reason:
                self.status.setText(f"{self.status.text()}. {NO_REASONING}")
        self.on_busy(self.service.busy)
        pending, self._pending_question = self._pending_question, None
        if pending and state == "ready":
            self.spawn(self.controller.send(*pending))
        elif pending:  # the model did not load: the question goes back into the box
            self.composer.input.setPlainText(pending[0])

    def on_progress(self, stage: str, done: int, total: int) -> None:
        self.progress_bar.setVisible(True)
        now = time.monotonic()
        if stage != self._stage[0] or done < self._stage[2]:
            self._stage = (stage, now, done)
        left = eta(now - self._stage[1], done - self._stage[2], total - done)
        self.progress_bar.setFormat(f"{STAGES.get(stage, stage)} %p%{left}")
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(int(1000 * done / total) if total else 0)

    def on_busy(self, busy: bool) -> None:
        self.composer.set_busy(busy, self.service.ready)
        self.render()  # the cards' actions (edit, regenerate, think longer) follow: none while an answer runs

    def on_failed(self, message: str) -> None:
        hint = "" if self.service.ready else " — open Tools ▸ Models (Ctrl+M) to install or pick a model"
        self.status.setText(f"Error: {message}{hint}")
        if not self.service.ready:
            self.offer_gguf()

    def offer_gguf(self) -> None:
        """No model at all (first run offline, or the download failed): offer a local GGUF file instead, once."""
        if self._offered_gguf or self.model_service is None or any(r.installed for r in self.model_service.rows()):
            return
        self._offered_gguf = True
        if ConfirmDialog.ask(self, "Ponder needs a model", "Ponder could not set up its model (the status bar "
                             "says why). Without internet you can pick a Qwen2.5 GGUF file on this computer "
                             "instead, then choose “Use this model”. Pick a file now?"):
            self.open_models()
            self.model_manager.gguf_button.click()

    def on_answer(self, answer) -> None:
        if answer is None:
            return
        s = answer.stats
        note = " (stopped)" if answer.finish_reason == "cancelled" else ""
        self.status.setText(f"{answer.model}: {s.completion_tokens} tokens, TTFT {s.ttft_s:.2f}s, "
                            f"{s.decode_tok_s:.1f} tok/s{note}")

    # --- window state --------------------------------------------------------------------------------
    def _restore_settings(self) -> None:
        self.apply_composer_defaults()
        self.composer.set_enter_sends(self.settings.enter_sends)
        self.apply_font_size()
        self.refresh_models()
        self.refresh_header()
        self.update_welcome()
        self.apply_server(self.settings)
        geometry = self.controller.window_state()
        if geometry:
            self.restoreGeometry(QByteArray(base64.b64decode(geometry)))

    def closeEvent(self, event) -> None:
        if self.server is not None:
            self.server.stop()
        self.service.cancel()
        self.service.stop_loading()  # a model still loading is given up: closing never waits for it
        if self.model_service is not None:  # nor for a model install, download or import (Tools ▸ Models)
            self.model_service.cancel()
        geometry = bytes(self.saveGeometry().data())
        self.controller.save_window_state(base64.b64encode(geometry).decode())
        super().closeEvent(event)

