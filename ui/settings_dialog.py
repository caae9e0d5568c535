"""Settings: defaults for new messages (mode, budget, parallel answers), sampling, threads, efficient decode, theme, text size,
Enter-to-send, the local OpenAI server switch, and where Ponder keeps its data. Edits an
`app.settings.AppSettings`; persisting and applying it is the window's job."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import psutil
from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
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
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.settings import DECODE_CHOICES, FONT_SIZES, AppSettings

from .composer import BUDGETS, MODE_LABELS

THEME_LABELS = {"system": "Follow the system", "light": "Light", "dark": "Dark"}


def _combo(items: dict) -> QComboBox:
    box = QComboBox()
    for key, label in items.items():
        box.addItem(label, key)
    return box


def _double(lo: float, hi: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    box = QDoubleSpinBox(minimum=lo, maximum=hi, singleStep=step)
    box.setDecimals(decimals)
    return box


class SettingsDialog(QDialog):
    def __init__(self, settings: AppSettings, data_dir: Path, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.data_dir = Path(data_dir)
        self.mode = _combo(MODE_LABELS)
        self.budget = _combo({0: "The model's own (0.5B: 256, 1.5B: 512)", **{value: label for label, value in BUDGETS}})
        self.parallel = QSpinBox(minimum=1, maximum=8)
        self.temperature = _double(0, 2, 0.05)
        self.parallel_temperature = _double(0, 2, 0.05)
        self.top_p = _double(0.05, 1, 0.05)
        self.top_k = QSpinBox(minimum=0, maximum=1000)
        self.top_k.setSpecialValueText("off")
        self.repetition_penalty = _double(0.8, 2, 0.01)
        self.answer_max_tokens = QSpinBox(minimum=16, maximum=8192, singleStep=64)
        self.threads = QSpinBox(minimum=0, maximum=max(1, os.cpu_count() or 1))
        self.threads.setSpecialValueText(f"automatic ({psutil.cpu_count(logical=False) or 1} physical cores)")
        self.theme = _combo(THEME_LABELS)
        self.font_size = QSpinBox(minimum=FONT_SIZES[0], maximum=FONT_SIZES[1], suffix=" pt")
        self.font_size.setToolTip("Text size of the chat and the message box (also Ctrl+= / Ctrl+− / Ctrl+0)")
        self.enter_sends = QCheckBox("Enter sends the message (Shift+Enter for a new line)")
        self.enter_sends.setToolTip("Off: Enter starts a new line. Ctrl+Enter sends either way.")
        self.serve = QCheckBox("Serve the OpenAI API on 127.0.0.1:")
        self.serve.setToolTip("Other programs on this computer can use the model through /v1/chat/completions; "
                              "their requests and yours take turns on the one engine.")
        self.serve_port = QSpinBox(minimum=1024, maximum=65535)
        self.serve_port.setEnabled(False)
        self.serve.toggled.connect(self.serve_port.setEnabled)
        self.decode = _combo({key: label for key, (label, _) in DECODE_CHOICES.items()})
        self.decode_note = QLabel(wordWrap=True)
        self.decode.currentIndexChanged.connect(
            lambda: self.decode_note.setText(DECODE_CHOICES[self.decode.currentData()][1]))
        self._model_id = settings.model_id

        defaults = QFormLayout()
        defaults.addRow("Reasoning mode", self.mode)
        defaults.addRow("Thinking budget", self.budget)
        defaults.addRow("Parallel answers", self.parallel)
        defaults.addRow("", self.enter_sends)
        sampling = QFormLayout()
        sampling.addRow("Temperature (one answer)", self.temperature)
        sampling.addRow("Temperature (parallel answers)", self.parallel_temperature)
        sampling.addRow("Top-p", self.top_p)
        sampling.addRow("Top-k", self.top_k)
        sampling.addRow("Repetition penalty", self.repetition_penalty)
        sampling.addRow("Answer length cap (tokens)", self.answer_max_tokens)
        system = QFormLayout()
        system.addRow("Compute threads", self.threads)
        system.addRow("Efficient decode", self.decode)
        system.addRow("", self.decode_note)
        system.addRow("Theme", self.theme)
        system.addRow("Text size", self.font_size)
        server = QHBoxLayout()
        server.addWidget(self.serve)
        server.addWidget(self.serve_port, 1)
        server_row = QWidget()
        server_row.setLayout(server)
        system.addRow("Local server", server_row)
        folder = QHBoxLayout()
        self.data_label = QLabel(str(self.data_dir))
        self.data_label.setTextInteractionFlags(self.data_label.textInteractionFlags().TextSelectableByMouse)
        open_button = QPushButton("Open")
        open_button.clicked.connect(lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.data_dir))))
        folder.addWidget(self.data_label, 1)
        folder.addWidget(open_button)
        holder = QWidget()
        holder.setLayout(folder)
        system.addRow("Data folder", holder)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
                                   | QDialogButtonBox.StandardButton.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(
            lambda: self.show_settings(AppSettings(model_id=self._model_id)))
        layout = QVBoxLayout(self)
        for title, form in (("New messages", defaults), ("Sampling", sampling), ("System", system)):
            group = QGroupBox(title)
            group.setLayout(form)
            layout.addWidget(group)
        layout.addWidget(buttons)
        self.show_settings(settings)

    def show_settings(self, s: AppSettings) -> None:
        self.mode.setCurrentIndex(self.mode.findData(s.mode))
        self.budget.setCurrentIndex(self.budget.findData(s.budget))
        self.parallel.setValue(s.parallel)
        self.temperature.setValue(s.temperature)
        self.parallel_temperature.setValue(s.parallel_temperature)
        self.top_p.setValue(s.top_p)
        self.top_k.setValue(s.top_k)
        self.repetition_penalty.setValue(s.repetition_penalty)
        self.answer_max_tokens.setValue(s.answer_max_tokens)
        self.threads.setValue(min(s.threads, self.threads.maximum()))
        self.decode.setCurrentIndex(self.decode.findData(s.decode))
        self.decode_note.setText(DECODE_CHOICES[s.decode][1])
        self.theme.setCurrentIndex(self.theme.findData(s.theme))
        self.font_size.setValue(s.font_size)
        self.enter_sends.setChecked(s.enter_sends)
        self.serve.setChecked(s.serve)
        self.serve_port.setValue(s.serve_port)
        self.serve_port.setEnabled(s.serve)

    def settings(self) -> AppSettings:
        return replace(AppSettings(model_id=self._model_id), mode=self.mode.currentData(),
                       budget=self.budget.currentData(), parallel=self.parallel.value(),
                       temperature=round(self.temperature.value(), 2),
                       parallel_temperature=round(self.parallel_temperature.value(), 2),
                       top_p=round(self.top_p.value(), 2), top_k=self.top_k.value(),
                       repetition_penalty=round(self.repetition_penalty.value(), 2),
                       answer_max_tokens=self.answer_max_tokens.value(), threads=self.threads.value(),
                       theme=self.theme.currentData(), serve=self.serve.isChecked(),
                       serve_port=self.serve_port.value(), font_size=self.font_size.value(),
                       enter_sends=self.enter_sends.isChecked(), decode=self.decode.currentData())

    @classmethod
    def ask(cls, parent, settings: AppSettings, data_dir: Path) -> AppSettings | None:
        dialog = cls(settings, data_dir, parent)
        return dialog.settings() if dialog.exec() == QDialog.DialogCode.Accepted else None
