"""The wizard's last three pages: TrainPage (`ponder train sft` with live loss), ConcisePage (the optional
budget-forcing RL stage, `ponder train rl`, with live reward and length; reasoning adapters only) and
EvaluatePage (before/after metrics and side-by-side samples from the "eval" event, the library card, "Use in this
chat" and "Open adapter folder"). The processes are driven through RunPanel; the library is only read here."""
from __future__ import annotations

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWizardPage,
)

from app.training_job import saved_run_differences
from ui.wizard_pages import WizardState
from ui.wizard_run import RunPanel

RL_BUDGETS = "160,256"
RL_ARGS = ("--budgets", RL_BUDGETS, "--margin", "0.5", "--group", "8", "--lr", "1e-4", "--kl", "0",
           "--temperature", "0.7", "--answer-tokens", "48", "--compute", "bf16", "--tis-cap", "0")
"""The measured run `rl3`'s arguments (docs/training.md, Budget RL; it ran before importance sampling, hence
`--tis-cap 0`): on the 0.5B, 150 steps (70 min on 2 cores) cut thinking by a quarter and budget cuts from ~30% to
6–10%, at −3 points on dev and +2 on test."""
RL_STEPS = 150


def said(words: list[str]) -> str:
    """'model', 'model and recipe', 'model, data file and recipe'."""
    return " and ".join(filter(None, (", ".join(words[:-1]), words[-1]))) if words else ""


class FolderOpener:
    @classmethod
    def open(cls, folder) -> bool:
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))


class TrainPage(QWizardPage):
    """Runs the SFT process; complete once the adapter is saved in the library."""

    def __init__(self, state: WizardState, parent=None):
        super().__init__(parent)
        self.s = state
        self.setTitle("Train")
        self.setSubTitle("Training runs in its own process; you can keep using Ponder. Pause keeps a checkpoint.")
        self.panel = RunPanel("progress", {"loss": "Training loss"})
        self.start_over = QPushButton("Start over")
        self.start_over.setToolTip("Discard the checkpoint of this run and train from the beginning")
        self.start_over.clicked.connect(lambda: self.start(resume=False))
        self.start_over.hide()
        lay = QVBoxLayout(self)
        lay.addWidget(self.panel, 1)
        lay.addWidget(self.start_over)
        self.panel.changed.connect(self.completeChanged)
        self.panel.changed.connect(self.sync)
        self.panel.saved.connect(self.on_saved)
        self.card = None
        self._args: list[str] = []

    def initializePage(self) -> None:
        args = self.s.sft_args()
        if self.panel.running or (self.card is not None and args == self._args):
            return
        if args != self._args:
            self.card = None
        self.panel.run_dir = self.s.run_dir
        self.panel.stale_checkpoint = False
        if self.panel.resumable and self.s.run_dir is not None:
            # A checkpoint of this name is there (paused, cancelled or crashed earlier). Resume trains what the run
            # was started with, so it is offered only when that is what this page would start now.
            self._args = args
            self.panel.args = args
            differ = saved_run_differences(self.s.run_dir, args)
            if not differ:
                self.panel.set_state("paused", "A checkpoint of this run exists. Press Resume to continue, or Start "
                                               "over.")
            else:
                self.panel.checkpoint_step, self.panel.stale_checkpoint = None, True
                other = "other settings" if differ == ["settings"] else f"another {said(differ)}"
                self.panel.set_state("paused", f"A checkpoint named '{self.s.name}' exists from a run with {other}. "
                                               "Press Start again to train from the beginning with these settings "
                                               "(that checkpoint is replaced).")
            self.sync()
            return
        self.start(resume=False)

    def start(self, resume: bool) -> None:
        self._args = self.s.sft_args()
        if not resume and self.s.run_dir is not None:
            self.panel.checkpoint_step = None
        self.panel.start(self._args, self.s.run_dir, resume=resume)
        self.sync()

    def sync(self) -> None:
        self.start_over.setVisible(self.panel.state in ("paused", "cancelled", "crashed", "failed")
                                   and not self.panel.running)

    def on_saved(self, ev: dict) -> None:
        try:
            self.card = self.s.library.get(self.s.model_id, ev.get("name") or self.s.name)
        except (ValueError, OSError) as err:  # a card or folder damaged on disk: say so, keep the wizard going
            self.panel.status.setText(f"Saved, but the library cannot read it: {err}")

    def isComplete(self) -> bool:
        return self.card is not None and not self.panel.running

    def nextId(self) -> int:
        wizard = self.wizard()
        return wizard.CONCISE if self.s.kind == "reasoning" else wizard.EVALUATE


class ConcisePage(QWizardPage):
    """Optional RL stage that rewards right answers within a thinking budget; saves '<name>-concise'."""

    def __init__(self, state: WizardState, parent=None):
        super().__init__(parent)
        self.s = state
        self.setTitle("Concise reasoning (optional)")
        self.setSubTitle("Teach the adapter to reach the same answers with fewer thinking tokens (budgets "
                         f"{RL_BUDGETS}). Measured on the 0.5B: {RL_STEPS} steps (about 70 minutes on 2 cores) "
                         "cut thinking by a quarter, at up to 3 points of accuracy. You can skip this.")
        self.skip = QCheckBox("Skip this step")
        self.steps = QSpinBox()
        self.steps.setRange(1, 10000)
        self.steps.setValue(RL_STEPS)
        self.start_button = QPushButton("Start")
        self.start_button.clicked.connect(self.start)
        form = QHBoxLayout()
        form.addWidget(self.skip)
        form.addStretch(1)
        form.addWidget(QLabel("Steps:"))
        form.addWidget(self.steps)
        form.addWidget(self.start_button)
        self.panel = RunPanel("rl_progress", {"reward": "Reward", "length": "Thinking length (tokens)"})
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.panel, 1)
        self.skip.toggled.connect(self.sync)
        self.panel.changed.connect(self.sync)
        self.panel.saved.connect(self.on_saved)
        self.card = None

    @property
    def name(self) -> str:
        return f"{self.s.name}-concise"

    def args(self) -> list[str]:
        return ["train", "rl", "--adapter", self.s.name, "--data", self.s.data_path, "--model-id", self.s.model_id,
                *RL_ARGS, "--steps", str(self.steps.value()), "--name", self.name,
                "--json-progress", *self.s.extra_args, *self.s.rl_args]

    def run_dir(self):
        return self.s.runs_dir / self.name if self.s.runs_dir else None

    def start(self) -> None:
        if not self.panel.running:
            self.panel.start(self.args(), self.run_dir())
            self.sync()

    def on_saved(self, ev: dict) -> None:
        try:
            self.card = self.s.library.get(self.s.model_id, ev.get("name") or self.name)
        except (ValueError, OSError) as err:  # a card or folder damaged on disk: say so, keep the wizard going
            self.panel.status.setText(f"Saved, but the library cannot read it: {err}")

    def sync(self) -> None:
        running = self.panel.running
        self.skip.setEnabled(not running)
        self.steps.setEnabled(not running and self.card is None)
        self.start_button.setEnabled(not running and not self.skip.isChecked() and self.card is None
                                     and self.panel.state in ("idle", "failed", "finished"))
        self.panel.setEnabled(not self.skip.isChecked() or running)
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return not self.panel.running and (self.skip.isChecked() or self.card is not None)

    def nextId(self) -> int:
        return self.wizard().EVALUATE


def metric_text(metrics: dict | None, key: str) -> str:
    value = (metrics or {}).get(key)
    if key == "accuracy":
        return "not checkable" if value is None else f"{100 * float(value):.0f} %"
    return "—" if value is None else f"{float(value):.0f} tokens"


class EvaluatePage(QWizardPage):
    """Before/after on the held-out split, side-by-side samples, and the adapter as saved in the library."""

    def __init__(self, state: WizardState, train: TrainPage, concise: ConcisePage, on_use=None, parent=None):
        super().__init__(parent)
        self.s, self.train, self.concise, self.on_use = state, train, concise, on_use
        self.setTitle("Evaluate and save")
        self.setSubTitle("How the adapter does on records it did not train on.")
        self.metrics = QTableWidget(2, 2)
        self.metrics.setHorizontalHeaderLabels(["Before (base model)", "After (adapter)"])
        self.metrics.setVerticalHeaderLabels(["Accuracy", "Mean answer length"])
        self.metrics.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.metrics.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.metrics.setMaximumHeight(90)
        self.samples = QTableWidget(0, 4)
        self.samples.setHorizontalHeaderLabels(["Prompt", "Before", "After", "Expected"])
        self.samples.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.samples.setWordWrap(True)
        self.samples.verticalHeader().hide()
        self.samples.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.saved_label = QLabel("")
        self.saved_label.setWordWrap(True)
        self.use_button = QPushButton("Use in this chat")
        self.use_button.clicked.connect(self.use)
        self.open_button = QPushButton("Open adapter folder")
        self.open_button.clicked.connect(self.open_folder)
        buttons = QHBoxLayout()
        buttons.addWidget(self.use_button)
        buttons.addWidget(self.open_button)
        buttons.addStretch(1)
        form = QFormLayout()
        form.addRow(self.saved_label)
        lay = QVBoxLayout(self)
        lay.addWidget(self.metrics)
        lay.addWidget(QLabel("Samples:"))
        lay.addWidget(self.samples, 1)
        lay.addLayout(form)
        lay.addLayout(buttons)
        self.used = None

    @property
    def card(self):
        """The adapter to use: the concise one when that stage ran, else the SFT one."""
        return self.concise.card or self.train.card

    def initializePage(self) -> None:
        ev = self.concise.panel.eval_event or self.train.panel.eval_event or {}
        for col, side in enumerate(("before", "after")):
            for row, key in enumerate(("accuracy", "mean_tokens")):
                self.metrics.setItem(row, col, QTableWidgetItem(metric_text(ev.get(side), key) if ev else "—"))
        self.samples.setRowCount(0)
        for sample in ev.get("samples", []):
            r = self.samples.rowCount()
            self.samples.insertRow(r)
            for c, key in enumerate(("prompt", "before", "after", "gold")):
                self.samples.setItem(r, c, QTableWidgetItem(str(sample.get(key) or "")))
        self.samples.resizeRowsToContents()
        card = self.card
        if card is None:
            self.saved_label.setText("The adapter was not saved.")
        else:
            names = [c.name for c in (self.train.card, self.concise.card) if c is not None]
            self.saved_label.setText(f"In the adapter library for {card.base_model}: "
                                     + ", ".join(f"'{n}'" for n in names) + f". Folder: {card.folder}")
        self.use_button.setEnabled(card is not None and self.on_use is not None)
        self.open_button.setEnabled(card is not None)

    def use(self) -> None:
        if self.card is not None and self.on_use is not None:
            self.used = self.card
            self.on_use(self.card)
            self.use_button.setText("In use in this chat")
            self.use_button.setEnabled(False)

    def open_folder(self) -> None:
        if self.card is not None:
            FolderOpener.open(self.card.folder)
