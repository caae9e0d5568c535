"""The training wizard's shared state and its first page: WizardState (what the pages agree on, turned into
`ponder train sft` arguments) and DataPage (file, kind, CSV columns, a full check in a worker thread listing every
problem with its line, a preview, a token-length histogram, the held-out split). The checking itself is injected
(WizardState.check_data); this module only shows its DataReport. The Recipe page is in ui.wizard_recipe_page."""
from __future__ import annotations

import csv
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWizardPage,
)

from core.config import SFT_PRESETS
from ui.line_plot import BarPlot

RECIPE_FIELDS = ("rank", "alpha", "steps", "lr", "max_tokens")


@dataclass
class WizardState:
    """What the pages agree on; the Train page turns it into `ponder train sft` arguments."""

    model_ids: list[str]
    check_data: Callable
    """(path, model_id, kind, max_tokens, csv_columns) -> (DataReport, [(lo, hi, count)]); blocking."""
    validate_name: Callable[[str], str]
    """Raises ValueError with a user-facing message for a bad adapter name."""
    library: object
    model_id: str = ""
    data_path: str = ""
    kind: str = "skill"
    csv_columns: tuple[str, str] | None = None
    held_out: float = 0.1
    report: object = None
    checked_for: tuple | None = None
    name: str = ""
    preset: str = "quick"
    recipe: dict = field(default_factory=dict)
    runs_dir: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    """Appended to every `train` command (tests: ["--precision", "bf16"])."""
    rl_args: list[str] = field(default_factory=list)
    """Appended to the `train rl` command only (e.g. ["--group", "2"])."""

    def data_key(self) -> tuple:
        return (self.data_path, self.kind, self.csv_columns)

    @property
    def run_dir(self) -> Path | None:
        return self.runs_dir / self.name if self.runs_dir and self.name else None

    def sft_args(self, estimate: bool = False) -> list[str]:
        args = ["train", "sft", "--data", self.data_path] + ([] if estimate else ["--name", self.name])
        args += ["--model-id", self.model_id, "--kind", self.kind, "--preset", self.preset, "--held-out", f"{self.held_out:g}",
                "--json-progress"]
        for key in RECIPE_FIELDS:
            if key in self.recipe:
                args += ["--" + key.replace("_", "-"), f"{self.recipe[key]:g}"]
        if self.csv_columns:
            args += ["--columns", ",".join(self.csv_columns)]
        if estimate:
            args.append("--estimate")
        elif self.run_dir is not None:
            args += ["--run-dir", str(self.run_dir)]
        return args + list(self.extra_args)


class DataFileDialog:
    @classmethod
    def ask(cls, parent) -> str | None:
        path, _ = QFileDialog.getOpenFileName(parent, "Choose training data", "",
                                              "Training data (*.jsonl *.json *.csv);;All files (*)")
        return path or None


def csv_header(path: str) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return [h.strip() for h in next(csv.reader(f), []) if h.strip()]
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


class DataPage(QWizardPage):
    """Choose and check the training file; Next stays disabled until the check found no problem."""

    checked = Signal(object, object)

    def __init__(self, state: WizardState, parent=None):
        super().__init__(parent)
        self.s = state
        self.setTitle("Training data")
        self.setSubTitle("A JSONL file (chat messages, prompt/response, question/answer or thinking traces) "
                         "or a CSV file with two columns. Every line is checked before training.")
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText("path/to/data.jsonl")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self.browse)
        row = QHBoxLayout()
        row.addWidget(self.path_edit, 1)
        row.addWidget(browse)
        self.kind = QComboBox()
        self.kind.addItem("Skill (how to answer: style, format, a domain)", "skill")
        self.kind.addItem("Reasoning (think, then a checkable answer)", "reasoning")
        self.prompt_col, self.response_col = QComboBox(), QComboBox()
        self.csv_box = QGroupBox("CSV columns")
        csv_form = QFormLayout(self.csv_box)
        csv_form.addRow("Prompt column:", self.prompt_col)
        csv_form.addRow("Response column:", self.response_col)
        self.csv_box.hide()
        self.held_out = QSpinBox()
        self.held_out.setRange(0, 50)
        self.held_out.setSuffix(" % held out for evaluation")
        self.held_out.setValue(round(state.held_out * 100))
        self.check_button = QPushButton("Check")
        self.check_button.clicked.connect(self.check)
        self.status = QLabel("Choose a file, then press Check.")
        self.status.setWordWrap(True)
        self.problems = QListWidget()
        self.problems.setMaximumHeight(110)
        self.preview = QTableWidget(0, 3)
        self.preview.setHorizontalHeaderLabels(["Line", "Prompt", "Response"])
        header = self.preview.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        self.preview.verticalHeader().hide()
        self.preview.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.preview.setMaximumHeight(140)
        self.histogram = BarPlot(x_label="tokens per record", y_label="records")
        self.histogram.setMinimumHeight(130)

        form = QFormLayout()
        form.addRow("File:", row)
        form.addRow("Kind:", self.kind)
        form.addRow("Held-out split:", self.held_out)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.csv_box)
        check_row = QHBoxLayout()
        check_row.addWidget(self.check_button)
        check_row.addWidget(self.status, 1)
        lay.addLayout(check_row)
        self.problems_label = QLabel("Problems (fix them in the file, then Check again):")
        lay.addWidget(self.problems_label)
        self.problems_label.hide()
        self.problems.hide()
        lay.addWidget(self.problems)
        lay.addWidget(self.preview)
        lay.addWidget(self.histogram, 1)

        self.path_edit.textChanged.connect(self.inputs_changed)
        self.kind.currentIndexChanged.connect(self.inputs_changed)
        self.prompt_col.currentIndexChanged.connect(self.inputs_changed)
        self.response_col.currentIndexChanged.connect(self.inputs_changed)
        self.held_out.valueChanged.connect(lambda v: setattr(self.s, "held_out", v / 100))
        self.checked.connect(self.show_report)
        self._check_id = 0

    def browse(self) -> None:
        path = DataFileDialog.ask(self)
        if path:
            self.path_edit.setText(path)

    def inputs_changed(self) -> None:
        path = self.path_edit.text().strip()
        is_csv = path.lower().endswith(".csv")
        if is_csv and self.sender() is self.path_edit:
            header = csv_header(path)
            response = next((h for h in header if h.lower() in ("response", "answer", "output", "completion")),
                            header[-1] if header else "")
            prompt = next((h for h in header if h.lower() in ("prompt", "question", "input", "instruction")),
                          next((h for h in header if h != response and h.lower() != "id"), ""))
            for box, choice in ((self.prompt_col, prompt), (self.response_col, response)):
                box.blockSignals(True)
                box.clear()
                box.addItems(header)
                box.setCurrentText(choice)
                box.blockSignals(False)
        self.csv_box.setVisible(is_csv)
        self.s.data_path, self.s.kind = path, self.kind.currentData()
        self.s.csv_columns = ((self.prompt_col.currentText(), self.response_col.currentText())
                              if is_csv and self.prompt_col.currentText() else None)
        self.completeChanged.emit()

    def check(self) -> None:
        """Validate the whole file in a worker thread (the tokenizer load and the check can take seconds)."""
        self.inputs_changed()
        path = self.s.data_path
        if not path or not Path(path).is_file():
            self.status.setText(f"No such file: {path}" if path else "Choose a file first.")
            return
        self._check_id += 1
        ticket, key = self._check_id, self.s.data_key()
        self.check_button.setEnabled(False)
        self.status.setText("Checking every line…")
        max_tokens = max(p["max_tokens"] for p in SFT_PRESETS.values())

        def work() -> None:
            try:
                result = self.s.check_data(Path(path), self.s.model_id, self.s.kind, max_tokens, self.s.csv_columns)
            except Exception as err:  # noqa: BLE001 - a bad file or a missing model is shown, not raised
                result = err
            self.checked.emit((ticket, key), result)

        threading.Thread(target=work, name="ponder-data-check", daemon=True).start()

    def show_report(self, ticket, result) -> None:
        if ticket[0] != self._check_id:
            return
        self.check_button.setEnabled(True)
        self.problems.clear()
        self.preview.setRowCount(0)
        if isinstance(result, Exception):
            self.s.report, self.s.checked_for = None, None
            self.status.setText(f"Could not check the file: {result}")
            self.histogram.set_bins([])
            self.completeChanged.emit()
            return
        report, bins = result
        self.s.report, self.s.checked_for = report, ticket[1]
        for p in report.problems:
            self.problems.addItem(f"line {p.line}: {p.message}")
        for rec in report.records[:5]:
            prompt = next((m["content"] for m in reversed(rec.messages) if m["role"] == "user"), "")
            r = self.preview.rowCount()
            self.preview.insertRow(r)
            for c, text in enumerate((str(rec.line), prompt, rec.response)):
                self.preview.setItem(r, c, QTableWidgetItem(text.replace("\n", " ")[:300]))
        self.histogram.set_bins(bins)
        self.problems.setVisible(bool(report.problems))
        self.problems_label.setVisible(bool(report.problems))
        n = len(report.records)
        if report.ok:
            longest = max(report.token_lengths, default=0)
            self.status.setText(f"OK: {n} records ({report.format}), longest {longest} tokens.")
        elif report.problems:
            self.status.setText(f"{len(report.problems)} problem(s) to fix (listed below with their lines); "
                                f"{n} good records.")
        else:
            self.status.setText("No training records found in this file.")
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        r = self.s.report
        return bool(r is not None and r.ok and self.s.checked_for == self.s.data_key())
