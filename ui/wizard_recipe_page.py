"""The training wizard's RecipePage: base model, adapter name, Quick/Balanced/Thorough presets with an editable
Advanced group, and a time estimate measured by `ponder train sft --estimate` (run through ui.wizard_run)."""
from __future__ import annotations

from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWizardPage,
)

from core.config import SFT_PRESETS
from ui.wizard_pages import WizardState
from ui.wizard_run import JobRunner, duration

PRESET_TITLES = {"quick": "Quick", "balanced": "Balanced", "thorough": "Thorough"}


class RecipePage(QWizardPage):
    """Base model, adapter name and training recipe; Estimate measures two real steps on this machine."""

    def __init__(self, state: WizardState, parent=None):
        super().__init__(parent)
        self.s = state
        self.setTitle("Recipe")
        self.setSubTitle("Choose the base model, a name for the adapter and how long to train.")
        self.model = QComboBox()
        self.model.addItems(state.model_ids)
        if state.model_id in state.model_ids:
            self.model.setCurrentText(state.model_id)
        self.name = QLineEdit()
        self.name.setPlaceholderText("e.g. sql-helper")
        self.name_error = QLabel("")
        self.name_error.setWordWrap(True)
        self.presets = QButtonGroup(self)
        preset_row = QHBoxLayout()
        for key, title in PRESET_TITLES.items():
            b = QRadioButton(title)
            b.setProperty("preset", key)
            self.presets.addButton(b)
            preset_row.addWidget(b)
            if key == state.preset:
                b.setChecked(True)
        preset_row.addStretch(1)
        self.advanced = QGroupBox("Advanced")
        adv = QFormLayout(self.advanced)
        self.rank, self.alpha, self.steps, self.max_tokens = QSpinBox(), QSpinBox(), QSpinBox(), QSpinBox()
        self.rank.setRange(1, 256)
        self.alpha.setRange(1, 512)
        self.steps.setRange(1, 100000)
        self.max_tokens.setRange(16, 8192)
        self.lr = QDoubleSpinBox()
        self.lr.setDecimals(6)
        self.lr.setRange(1e-6, 0.1)
        self.lr.setSingleStep(1e-5)
        adv.addRow("LoRA rank:", self.rank)
        adv.addRow("LoRA alpha:", self.alpha)
        adv.addRow("Steps:", self.steps)
        adv.addRow("Learning rate:", self.lr)
        adv.addRow("Max length (tokens):", self.max_tokens)
        self.estimate_button = QPushButton("Estimate time")
        self.estimate_button.clicked.connect(self.estimate)
        self.estimate_label = QLabel("")
        self.estimate_label.setWordWrap(True)
        self.length_note = QLabel("")
        self.length_note.setWordWrap(True)
        self.runner = JobRunner()
        self.runner.event.connect(self.on_estimate_event)
        self.seconds_per_step: float | None = None

        form = QFormLayout()
        form.addRow("Base model:", self.model)
        form.addRow("Adapter name:", self.name)
        form.addRow("", self.name_error)
        form.addRow("Preset:", preset_row)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.advanced)
        lay.addWidget(self.length_note)
        est = QHBoxLayout()
        est.addWidget(self.estimate_button)
        est.addWidget(self.estimate_label, 1)
        lay.addLayout(est)
        lay.addStretch(1)

        self.presets.buttonClicked.connect(lambda b: self.apply_preset(b.property("preset")))
        self.name.textChanged.connect(self.changed)
        self.model.currentTextChanged.connect(self.changed)
        for w in (self.rank, self.alpha, self.steps, self.max_tokens):
            w.valueChanged.connect(self.changed)
        self.lr.valueChanged.connect(self.changed)
        self.apply_preset(state.preset)

    def initializePage(self) -> None:
        if self.s.model_id in self.s.model_ids:
            self.model.setCurrentText(self.s.model_id)
        self.apply_preset(self.s.preset)  # the checked data may need a longer max length

    def apply_preset(self, key: str) -> None:
        p = SFT_PRESETS[key]
        self.s.preset = key
        for w, k in ((self.rank, "rank"), (self.alpha, "alpha"), (self.steps, "steps"), (self.max_tokens, "max_tokens")):
            w.setValue(int(p[k]))
        self.lr.setValue(float(p["lr"]))
        if self.longest() > self.max_tokens.value():  # fit the data rather than refuse it
            self.max_tokens.setValue(-(-self.longest() // 64) * 64)
        self.changed()

    def longest(self) -> int:
        return max(getattr(self.s.report, "token_lengths", None) or [0])

    def changed(self, *_):
        self.s.model_id = self.model.currentText()
        self.s.name = self.name.text().strip()
        self.s.recipe = {"rank": self.rank.value(), "alpha": self.alpha.value(), "steps": self.steps.value(),
                         "lr": self.lr.value(), "max_tokens": self.max_tokens.value()}
        self.name_error.setText(self.name_problem() or "")
        longest = self.longest()
        self.length_note.setText(f"Your longest record has {longest} tokens: raise Max length to at least {longest} "
                                 "(training refuses longer records)." if longest > self.max_tokens.value() else "")
        if self.seconds_per_step is not None:
            self.show_estimate()
        self.completeChanged.emit()

    def name_problem(self) -> str | None:
        name = self.s.name
        if not name:
            return "Give the adapter a name."
        try:
            self.s.validate_name(name)
        except (ValueError, RuntimeError) as err:  # RuntimeError: the app provides no name check
            return str(err)
        try:
            taken = {c.name for c in self.s.library.list(self.s.model_id)}
        except Exception as err:  # noqa: BLE001 - an unreadable library is shown, not raised
            return f"Cannot read the adapter library: {err}"
        if name in taken:
            return f"An adapter named '{name}' already exists for {self.s.model_id}; choose another name."
        return None

    def isComplete(self) -> bool:
        return (self.name_problem() is None and not self.runner.running
                and self.longest() <= self.max_tokens.value())

    def estimate(self) -> None:
        if self.runner.running:
            return
        self.seconds_per_step = None
        self.estimate_button.setEnabled(False)
        self.estimate_label.setText("Measuring two real training steps on this machine…")
        self.runner.start(self.s.sft_args(estimate=True))
        self.completeChanged.emit()

    def on_estimate_event(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "estimate":
            self.seconds_per_step = float(ev["seconds_per_step"])
            self.show_estimate()
        elif kind == "error":
            self.estimate_label.setText(f"Could not estimate: {ev.get('message')}")
        elif kind == "exited":
            self.estimate_button.setEnabled(True)
            if self.seconds_per_step is None and not self.estimate_label.text().startswith("Could not"):
                tail = str(ev.get("stderr_tail") or "").strip().splitlines()
                self.estimate_label.setText("Could not estimate" + (f": {tail[-1]}" if tail else "."))
            self.completeChanged.emit()

    def show_estimate(self) -> None:
        steps = self.steps.value()
        self.estimate_label.setText(f"{self.seconds_per_step:.2f} s per step × {steps} steps ≈ "
                                    f"{duration(self.seconds_per_step * steps)} (plus loading and evaluation).")
