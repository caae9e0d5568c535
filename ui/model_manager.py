"""The model manager: installed models with size and memory estimate, installing the shipped ones, importing
a GGUF file or a Hugging Face folder, downloading from the hub (with progress; a clear message offline),
removing, and choosing the model Ponder runs. Operations go through `app.model_service.ModelService`."""
from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from .dialogs import ConfirmDialog, GgufFileDialog, HfFolderDialog, RepoDialog
from .main_stages import STAGES

COLUMNS = ("Model", "Status", "Weights", "On disk", "Memory to run", "Source")


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GB" if n else "—"


class ModelManager(QDialog):
    useRequested = Signal(str)
    """The user chose to run this model id."""

    def __init__(self, service, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(860, 380)
        self.service = service
        self._tasks: set[asyncio.Task] = set()
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.table.horizontalHeader()  # every header and value whole: no clipped column or row
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setVisible(False)  # a list of models, not a spreadsheet
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setShowGrid(False)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.use_button = QPushButton("Use this model")
        self.install_button = QPushButton("Install")
        self.remove_button = QPushButton("Remove…")
        self.gguf_button = QPushButton("Import GGUF…")
        self.folder_button = QPushButton("Import folder…")
        self.download_button = QPushButton("Download from hub…")
        self.progress = QProgressBar(visible=False)
        self.cancel_button = QPushButton("Cancel", visible=False)
        self.cancel_button.setToolTip("Stop the install, download or import at its next step; nothing is kept")
        self._cancelled = False
        self.message = QLabel("Memory is estimated for 4-bit weights, an 8-bit KV cache and a 4k-token context.")
        self.message.setWordWrap(True)
        buttons = QHBoxLayout()
        for b in (self.use_button, self.install_button, self.remove_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        for b in (self.gguf_button, self.folder_button, self.download_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)
        working = QHBoxLayout()
        working.addWidget(self.progress, 1)
        working.addWidget(self.cancel_button)
        layout.addLayout(working)
        layout.addWidget(self.message)
        self.use_button.clicked.connect(self._use)
        self.install_button.clicked.connect(lambda: self._spawn(self.service.install(self.selected_id())))
        self.remove_button.clicked.connect(self._remove)
        self.gguf_button.clicked.connect(self._import_gguf)
        self.folder_button.clicked.connect(self._import_folder)
        self.download_button.clicked.connect(self._download)
        self.cancel_button.clicked.connect(self._cancel)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        service.changed.connect(self.refresh)
        service.progress.connect(self._on_progress)
        service.busyChanged.connect(self._on_busy)
        service.failed.connect(lambda text: self.message.setText(f"⚠ {text}"))
        service.done.connect(lambda text: self.message.setText(f"✓ {text}."))
        self.refresh()

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def refresh(self) -> None:
        keep = self.selected_id()
        self.rows = self.service.rows()
        self.table.setRowCount(len(self.rows))
        for i, r in enumerate(self.rows):
            status = "In use" if r.active else ("Installed" if r.installed else "Not installed")
            values = (r.name, status, r.weights, gib(r.disk_bytes), gib(r.memory_bytes), r.source)
            for j, value in enumerate(values):
                item = QTableWidgetItem(value)
                item.setData(Qt.ItemDataRole.UserRole, r.id)
                item.setToolTip(r.weights_detail if j == 2 and r.weights_detail else (r.blurb or r.id))
                self.table.setItem(i, j, item)
            if r.id == keep:
                self.table.selectRow(i)
        self._update_buttons()

    def selected_id(self) -> str | None:
        items = self.table.selectedItems() if hasattr(self, "rows") else []
        return items[0].data(Qt.ItemDataRole.UserRole) if items else None

    def select(self, model_id: str) -> None:
        for i, r in enumerate(self.rows):
            if r.id == model_id:
                self.table.selectRow(i)

    def _selected_row(self):
        mid = self.selected_id()
        return next((r for r in self.rows if r.id == mid), None)

    def _update_buttons(self) -> None:
        row, idle = self._selected_row(), not self.service.busy
        self.use_button.setEnabled(idle and row is not None and row.installed and not row.active)
        self.install_button.setEnabled(idle and row is not None and row.installable)
        self.remove_button.setEnabled(idle and row is not None and row.installed and not row.active)
        for b in (self.gguf_button, self.folder_button, self.download_button):
            b.setEnabled(idle)

    def _on_busy(self, busy: bool) -> None:
        self.progress.setVisible(busy)
        self.cancel_button.setVisible(busy)
        self.cancel_button.setEnabled(busy)
        if busy:
            self._cancelled = False
            self.progress.setRange(0, 0)
            self.message.setText("Working…")
        elif self._cancelled:
            self.message.setText("Cancelled: nothing was kept.")
        self._update_buttons()

    def _cancel(self) -> None:
        """Give the running operation up at its next progress report (the store keeps nothing half-written)."""
        self._cancelled = True
        self.cancel_button.setEnabled(False)
        self.message.setText("Cancelling… (at the next step)")
        self.service.cancel()

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        self.progress.setFormat(f"{STAGES.get(stage, stage)} %p%")
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * done / total) if total else 0)

    def _use(self) -> None:
        mid = self.selected_id()
        if mid:
            self.useRequested.emit(mid)
            self.message.setText(f"Loading {mid}… (the main window shows the progress)")

    def _remove(self) -> None:
        row = self._selected_row()
        if row and ConfirmDialog.ask(self, "Remove model", f"Delete {row.name} ({gib(row.disk_bytes)}) from this computer?"):
            self._spawn(self.service.remove(row.id))

    def _import_gguf(self) -> None:
        path = GgufFileDialog.ask(self)
        if path:
            self._spawn(self.service.import_gguf(path))

    def _import_folder(self) -> None:
        folder = HfFolderDialog.ask(self)
        if folder:
            self._spawn(self.service.import_folder(folder))

    def _download(self) -> None:
        repo = RepoDialog.ask(self)
        if repo:
            self._spawn(self.service.download(repo))
