"""Chat settings: the open chat's system prompt (typed, or from a preset: Default, Concise, Teacher, Coder) and
its sampling overrides (temperature, top-p, top-k, repetition penalty, answer cap), each either "use global"
(the Settings value, shown) or a value of its own. Edits a dict shaped like `controller.chat_settings()`:
{"system_prompt": str | None, "sampling": {name: value}}; saving it is the window's job."""
from __future__ import annotations

from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

PRESETS = {
    "Default": None,
    "Concise": "You are a helpful assistant. Answer briefly and directly: short sentences, no filler, no "
               "repetition of the question. Use a list only when it is clearer.",
    "Teacher": "You are a patient teacher. Explain step by step, check understanding with a short example, "
               "and point out common mistakes. Keep the tone encouraging.",
    "Coder": "You are an expert programmer. Give working, idiomatic code in fenced blocks with the language "
             "named, explain only what is not obvious, and mention edge cases and how to test the code.",
}
CUSTOM = "Custom"
SAMPLING = (
    # name, label, (min, max, step, decimals) — decimals 0 = a whole number
    ("temperature", "Temperature", (0.0, 2.0, 0.05, 2)),
    ("top_p", "Top-p", (0.05, 1.0, 0.05, 2)),
    ("top_k", "Top-k", (0, 1000, 1, 0)),
    ("repetition_penalty", "Repetition penalty", (0.8, 2.0, 0.01, 2)),
    ("answer_max_tokens", "Answer length cap (tokens)", (16, 8192, 64, 0)),
)


def preset_of(prompt: str | None) -> str:
    """The preset whose text `prompt` is, 'Default' for none, else 'Custom'."""
    if not (prompt or "").strip():
        return "Default"
    return next((name for name, text in PRESETS.items() if text == prompt.strip()), CUSTOM)


class Override(QWidget):
    """A value with a "use global" box: checked, the spin box shows the global value and is disabled."""

    def __init__(self, spec: tuple, global_value, parent=None):
        super().__init__(parent)
        lo, hi, step, decimals = spec
        if decimals:
            self.spin = QDoubleSpinBox(minimum=lo, maximum=hi, singleStep=step)
            self.spin.setDecimals(decimals)
        else:
            self.spin = QSpinBox(minimum=int(lo), maximum=int(hi), singleStep=int(step))
        self.global_value = global_value
        self.use_global = QCheckBox("Use global")
        self.use_global.setToolTip(f"Use the value from Settings ({global_value})")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.spin, 1)
        layout.addWidget(self.use_global)
        self.use_global.toggled.connect(self._toggled)

    def _toggled(self, on: bool) -> None:
        self.spin.setEnabled(not on)
        if on:
            self.spin.setValue(self.global_value)

    def set(self, value) -> None:
        self.use_global.setChecked(value is None)
        self._toggled(value is None)
        if value is not None:
            self.spin.setValue(value)

    def value(self):
        """The override, or None for "use global"."""
        if self.use_global.isChecked():
            return None
        v = self.spin.value()
        return round(v, 2) if isinstance(self.spin, QDoubleSpinBox) else int(v)


class ChatSettingsDialog(QDialog):
    def __init__(self, current: dict, global_settings, title: str = "", parent=None):
        super().__init__(parent)
        self.setWindowTitle(f"Chat settings — {title}" if title else "Chat settings")
        self.resize(560, 520)
        self.preset = QComboBox()
        for name in (*PRESETS, CUSTOM):
            self.preset.addItem(name, name)
        self.preset.model().item(self.preset.findData(CUSTOM)).setEnabled(False)  # set by typing
        self.prompt = QPlainTextEdit(placeholderText="No system prompt: the model's default behaviour.")
        self.prompt.setAccessibleName("System prompt")
        self.overrides = {name: Override(spec, getattr(global_settings, name)) for name, _label, spec in SAMPLING}
        prompt_box = QGroupBox("System prompt")
        prompt_layout = QVBoxLayout(prompt_box)
        top = QHBoxLayout()
        top.addWidget(QLabel("Preset"))
        top.addWidget(self.preset, 1)
        prompt_layout.addLayout(top)
        prompt_layout.addWidget(self.prompt, 1)
        sampling_box = QGroupBox("Sampling for this chat")
        form = QFormLayout(sampling_box)
        for name, label, _spec in SAMPLING:
            form.addRow(label, self.overrides[name])
        note = QLabel("Unchecked values apply to this chat only; the rest follow Settings.", wordWrap=True,
                      objectName="muted")
        form.addRow(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.setSpacing(10)
        layout.addWidget(prompt_box, 1)
        layout.addWidget(sampling_box)
        layout.addWidget(buttons)
        self.preset.activated.connect(lambda _i: self.use_preset(self.preset.currentData()))
        self.prompt.textChanged.connect(self._typed)
        self.show_settings(current)

    def use_preset(self, name: str) -> None:
        if name in PRESETS:
            self.prompt.setPlainText(PRESETS[name] or "")
            self.prompt.moveCursor(QTextCursor.MoveOperation.End)  # ready to add to it

    def _typed(self) -> None:
        self.preset.setCurrentIndex(self.preset.findData(preset_of(self.prompt.toPlainText())))

    def show_settings(self, current: dict) -> None:
        self.prompt.setPlainText(current.get("system_prompt") or "")
        sampling = current.get("sampling") or {}
        for name, widget in self.overrides.items():
            widget.set(sampling.get(name))

    def chat_settings(self) -> dict:
        """{"system_prompt": str | None, "sampling": {overridden name: value}}."""
        prompt = self.prompt.toPlainText().strip() or None
        sampling = {name: w.value() for name, w in self.overrides.items() if w.value() is not None}
        return {"system_prompt": prompt, "sampling": sampling}

    @classmethod
    def ask(cls, parent, current: dict, global_settings, title: str = "") -> dict | None:
        dialog = cls(current, global_settings, title, parent)
        return dialog.chat_settings() if dialog.exec() == QDialog.DialogCode.Accepted else None
