"""Running a `ponder train ...` subprocess from the wizard: JobRunner turns TrainingJob's reader-thread callbacks
into a Qt signal on the GUI thread, and RunPanel is the shared progress view of the Train and Concise pages
(progress bar, step/total, ETA, tokens/s, live plots, Pause/Resume and Cancel, the stderr tail of a crash).
It knows the JSON event shapes of `--json-progress`, not what is being trained."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.training_job import TrainingJob
from ui.dialogs import ConfirmDialog
from ui.line_plot import LinePlot

LIVE_RUNNERS: set[JobRunner] = set()
"""Runners whose process still runs: kept alive here when their wizard closes, until the process exits."""


def duration(seconds: float | None) -> str:
    """'42 s', '3 min 05 s', '1 h 02 min'; an em dash when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "—"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class JobRunner(QObject):
    """One TrainingJob at a time; `event` carries every JSON line (and the final "exited") on the GUI thread."""

    event = Signal(object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.job: TrainingJob | None = None
        self.event.connect(self._forget_when_exited)

    def start(self, args: list[str], run_dir: Path | None = None) -> None:
        if self.running:
            raise RuntimeError("a training process is already running")
        # Emitted from the job's reader thread; Qt queues it to this object's (the GUI) thread.
        self.job = TrainingJob(list(args), self.event.emit, run_dir=run_dir)
        self.job.start()
        LIVE_RUNNERS.add(self)

    def _forget_when_exited(self, ev: dict) -> None:
        if ev.get("event") == "exited":
            LIVE_RUNNERS.discard(self)

    @property
    def running(self) -> bool:
        return self.job is not None and self.job.running

    def stop(self) -> None:
        """Graceful: the process checkpoints, says "stopped" and exits."""
        if self.running:
            self.job.stop()

    def kill(self) -> None:
        if self.running:
            self.job.kill()


class RunPanel(QWidget):
    """Progress of one training process with Pause/Resume and Cancel.

    `progress_event` is "progress" (SFT: loss, tokens/s) or "rl_progress" (RL: reward, length); `series` maps a
    field of that event to the plot that draws it. States: idle → running → (paused | cancelled | crashed |
    failed | done); `changed` fires on each state change, `saved` with the "saved" event."""

    changed = Signal()
    saved = Signal(object)

    def __init__(self, progress_event: str, series: dict[str, str], parent=None):
        super().__init__(parent)
        self.progress_event = progress_event
        self.runner = JobRunner()
        self.runner.event.connect(self.on_event)
        self.args: list[str] = []
        self.run_dir: Path | None = None
        self.state = "idle"
        self.events: list[dict] = []
        self.checkpoint_step: int | None = None
        self.stale_checkpoint = False
        """The run folder's checkpoint belongs to other settings or other data: not offered for resuming; a fresh
        start replaces it."""
        self.saved_event: dict | None = None
        self.eval_event: dict | None = None
        self.error = ""
        self._stopping_for = ""
        self._stopped_seen = False

        self.status = QLabel("Not started.")
        self.status.setWordWrap(True)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        self.step_label, self.eta_label, self.speed_label = QLabel("Step —"), QLabel("ETA —"), QLabel("")
        stats = QHBoxLayout()
        stats.setSpacing(24)
        for w in (self.step_label, self.eta_label, self.speed_label):
            stats.addWidget(w)
        stats.addStretch(1)
        self.plots: dict[str, LinePlot] = {}
        plots = QHBoxLayout()
        for field, title in series.items():
            self.plots[field] = LinePlot(title=title, x_label="step")
            plots.addWidget(self.plots[field])
        self.pause_button = QPushButton("Pause")
        self.pause_button.setToolTip("Stop after the current step and keep a checkpoint to resume from")
        self.pause_button.clicked.connect(self.toggle_pause)
        self.cancel_button = QPushButton("Cancel training")
        self.cancel_button.clicked.connect(self.cancel)
        buttons = QHBoxLayout()
        buttons.addWidget(self.pause_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        self.stderr = QPlainTextEdit()
        self.stderr.setReadOnly(True)
        self.stderr.setMaximumHeight(120)
        self.stderr.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        for w in (self.status, self.bar):
            lay.addWidget(w)
        lay.addLayout(stats)
        lay.addLayout(plots, 1)
        lay.addLayout(buttons)
        lay.addWidget(self.stderr)
        self._sync_buttons()

    # --- control -------------------------------------------------------------------------------------------
    def start(self, args: list[str], run_dir: Path | None = None, resume: bool = False) -> None:
        """Start (or, with `resume`, continue from the run folder's checkpoint) the process for `args`."""
        self.args, self.run_dir = list(args), run_dir
        self.saved_event, self.error, self._stopping_for, self._stopped_seen = None, "", "", False
        self.stale_checkpoint = False
        if not resume:
            for plot in self.plots.values():
                plot.clear()
        self.stderr.hide()
        self.runner.start(self.args + (["--resume"] if resume else []), run_dir)
        self.set_state("running", "Resuming from the last checkpoint…" if resume else "Starting…")

    @property
    def resumable(self) -> bool:
        """A checkpoint exists to resume from (seen in this session, or left in the run folder) and fits the run."""
        if self.stale_checkpoint:
            return False
        if self.checkpoint_step is not None:
            return True
        return bool(self.run_dir and (self.run_dir / "checkpoint" / "state.json").exists())

    @property
    def _restartable(self) -> bool:
        """Stopped before any checkpoint, or the checkpoint does not fit (other data): the run can only start again."""
        stopped = self.state in ("paused", "cancelled") or (self.state == "failed" and self.stale_checkpoint)
        return bool(self.args) and stopped and not self.resumable

    @property
    def running(self) -> bool:
        return self.runner.running

    def toggle_pause(self) -> None:
        if self.state == "running":
            self.stop("paused")
        elif self.args and self.resumable:
            self.start(self.args, self.run_dir, resume=True)
        elif self._restartable:
            self.start(self.args, self.run_dir)

    def cancel(self) -> None:
        if self.state != "running":
            return
        if ConfirmDialog.ask(self, "Cancel training",
                             "Stop training now? The last checkpoint is kept, so you can resume later."):
            self.stop("cancelled")

    def stop(self, why: str = "paused") -> None:
        """Ask the process to checkpoint and stop; the state follows when it says "stopped"."""
        if self.runner.running:
            self._stopping_for = why
            self.runner.stop()
            self.status.setText("Stopping after the current step (saving a checkpoint)…")
            self.pause_button.setEnabled(False)
            self.cancel_button.setEnabled(False)

    # --- events --------------------------------------------------------------------------------------------
    def on_event(self, ev: dict) -> None:
        self.events.append(ev)
        kind = ev.get("event")
        if kind == self.progress_event:
            self._progress(ev)
        elif kind == "loaded":
            total = int(ev.get("total_steps") or 0)
            self.bar.setRange(0, max(1, total))
            self.status.setText(f"Training on {ev.get('examples', '?')} examples "
                                f"({ev.get('held_out', 0)} held out for the evaluation)…")
        elif kind == "checkpoint":
            self.checkpoint_step = int(ev.get("step", 0))
            if ev.get("path"):
                path = Path(ev["path"])
                self.run_dir = self.run_dir or (path.parent if path.name == "checkpoint" else path)
        elif kind == "eval":
            self.eval_event = ev
            self.status.setText("Evaluating on the held-out records…")
        elif kind == "saved":
            self.saved_event = ev
            self.status.setText(f"Saved to the adapter library as '{ev.get('name')}'.")
            self.saved.emit(ev)
        elif kind == "stopped":
            self._stopped_seen = True
            self.checkpoint_step = int(ev.get("step", self.checkpoint_step or 0))
        elif kind == "error":
            self.error = str(ev.get("message", "unknown error"))
            if ev.get("resumable") is False:  # e.g. the data changed since the checkpoint: only a fresh start
                self.stale_checkpoint, self.checkpoint_step = True, None
        elif kind == "exited":
            self._exited(ev)

    def _progress(self, ev: dict) -> None:
        step, total = int(ev.get("step", 0)), int(ev.get("total", 0) or 0)
        if total:
            self.bar.setRange(0, total)
        self.bar.setValue(step)
        self.step_label.setText(f"Step {step} / {total or '?'}")
        self.eta_label.setText(f"ETA {duration(ev.get('eta_s'))}")
        if ev.get("tokens_per_s") is not None:
            self.speed_label.setText(f"{float(ev['tokens_per_s']):.0f} tokens/s")
        for field, plot in self.plots.items():
            if ev.get(field) is not None:
                plot.append(field, step, float(ev[field]))
        if self.state == "running" and not self._stopping_for:
            self.status.setText("Training…")

    def _exited(self, ev: dict) -> None:
        rc = ev.get("returncode")
        stopped = self._stopped_seen or self._stopping_for
        # A stop asked for while the process was still starting ends it with a signal's code: not a crash.
        asked = stopped and ev.get("stop_requested") and not self.error
        if self.saved_event is not None:
            self.set_state("done", f"Done: saved as '{self.saved_event.get('name')}'.")
        elif (rc == 0 and stopped) or asked:
            why = self._stopping_for or "paused"
            if self.resumable:
                at = f" at step {self.checkpoint_step}" if self.checkpoint_step is not None else ""
                self.set_state(why, f"{why.capitalize()}{at}; the checkpoint is kept. Press Resume to continue.")
            else:
                self.set_state(why, f"{why.capitalize()} before the first checkpoint; press Start again to train.")
        elif rc == 0 and not self.error:
            self.set_state("finished", "The process finished.")
        else:
            tail = str(ev.get("stderr_tail") or "").strip()
            what = self.error or (f"The training process stopped unexpectedly (exit code {rc})." if rc
                                  else "Training failed.")
            self.stderr.setPlainText(tail or what)
            self.stderr.show()
            hint = " Press Resume to continue from the last checkpoint." if self.resumable else ""
            self.set_state("crashed" if not self.error else "failed", what + hint)
        self._stopping_for = ""

    def set_state(self, state: str, text: str) -> None:
        self.state = state
        self.status.setText(text)
        self._sync_buttons()
        self.changed.emit()

    def _sync_buttons(self) -> None:
        running = self.state == "running"
        restart = not running and self._restartable
        self.pause_button.setText("Start again" if restart else "Pause" if running or not self.resumable else "Resume")
        self.pause_button.setEnabled(running or restart or (bool(self.args) and self.resumable and self.state != "done"))
        self.cancel_button.setEnabled(running)
