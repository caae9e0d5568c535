"""A training run in a child process (`ponder train …`), driven by its JSON event lines. Qt-free.

The child owns the model, so a crash there cannot take the window down. A reader thread turns each stdout
line that is a JSON object into an `on_event` call; another keeps the last lines of stderr for the final
{"event": "exited", "returncode", "stderr_tail", "stop_requested"} event. `stop()` is graceful and portable: it
writes the run folder's STOP file (the trainer checks it after every step) and, where there is one, sends SIGTERM;
on Windows that would be TerminateProcess, so there the STOP file alone asks for the stop. `kill()` ends it at once.
A stop asked for before the child has set up its handlers (still importing) ends it with a non-zero code:
`stop_requested` says the user asked for that end, so it is a pause or a cancel, not a crash. This side owns the
STOP file: it is removed before a start and after the exit, never by the child while it starts.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

STOP_FILE = "STOP"  # same name as core.training.checkpoint.STOP_FILE; app need not import torch to write it


def ponder_command() -> list[str]:
    """How to run `ponder`: the frozen executable itself, or this interpreter on the source tree's `app`."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "app"]


class TrainingJob:
    """One `ponder` training command; `on_event` is called from a reader thread."""

    def __init__(self, args: list[str], on_event: Callable[[dict], None], run_dir: Path | None = None,
                 env: dict | None = None, cwd: Path | None = None):
        self.args = list(args)
        self.on_event = on_event
        self.run_dir = Path(run_dir) if run_dir else None
        if self.run_dir is not None and "--run-dir" not in self.args:
            self.args += ["--run-dir", str(self.run_dir)]
        self.env = env
        self.cwd = cwd or (Path(__file__).resolve().parent.parent if not getattr(sys, "frozen", False) else None)
        self._proc: subprocess.Popen | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._threads: list[threading.Thread] = []
        self._done = threading.Event()
        self.stop_requested = False

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError("this training job was already started")
        if self.run_dir is not None:  # an earlier run's request; the child leaves the file alone while it starts
            (self.run_dir / STOP_FILE).unlink(missing_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        flags = subprocess.CREATE_NEW_PROCESS_GROUP if sys.platform == "win32" else 0
        self._proc = subprocess.Popen(ponder_command() + self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, env=env, cwd=self.cwd, text=True, encoding="utf-8",
                                      errors="replace", creationflags=flags)
        out = threading.Thread(target=self._read_stdout, name="training-stdout", daemon=True)
        err = threading.Thread(target=self._read_stderr, name="training-stderr", daemon=True)
        self._threads = [out, err]
        err.start()
        out.start()

    def _read_stdout(self) -> None:
        proc = self._proc
        for line in proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event:
                self._emit(event)
        rc = proc.wait()
        self._threads[1].join(timeout=5)
        self._clear_stop_file()  # the request ended with the process: a later run must not stop at once
        self._emit({"event": "exited", "returncode": rc, "stderr_tail": "".join(self._stderr).strip(),
                    "stop_requested": self.stop_requested})
        self._done.set()

    def _clear_stop_file(self) -> None:
        """Remove a STOP file the process did not live to honour (e.g. SIGTERM while it was still importing)."""
        if self.run_dir is not None:
            try:
                (self.run_dir / STOP_FILE).unlink(missing_ok=True)
            except OSError as err:
                self._stderr.append(f"could not remove {self.run_dir / STOP_FILE}: {err}\n")

    def _read_stderr(self) -> None:
        for line in self._proc.stderr:
            self._stderr.append(line)

    def _emit(self, event: dict) -> None:
        try:
            self.on_event(event)
        except Exception as err:  # a listener's bug must not stop the reading (the pipe would fill up)
            self._stderr.append(f"event handler failed: {err!r}\n")

    def stop(self) -> None:
        """Stop after the current step with a resumable checkpoint (pause or cancel)."""
        self.stop_requested = True
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / STOP_FILE).touch()
        if self.running and sys.platform != "win32":
            self._proc.terminate()  # SIGTERM: the trainer treats it like the STOP file

    def kill(self) -> None:
        if self.running:
            self._proc.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        """The return code once the process has ended and its events are delivered; None on timeout."""
        if self._proc is None:
            return None
        if not self._done.wait(timeout):
            return None
        return self._proc.returncode

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()


def check_data(path, model_id: str, *, kind: str = "skill", max_tokens: int = 1024,
               csv_columns: tuple[str, str] | None = None, bins: int = 10):
    """(DataReport, token histogram) of a training file, read with the installed model's tokenizer. Blocking: the
    wizard calls it from a worker thread."""
    from core.data.train import token_histogram, validate_file
    from core.loading import load_tokenizer
    from core.storage.model_store import ModelStore

    report = validate_file(Path(path), load_tokenizer(ModelStore().get(model_id).hf_dir), kind=kind,
                           max_tokens=max_tokens, csv_columns=csv_columns)
    return report, token_histogram(report.token_lengths, bins)


def validate_adapter_name(name: str) -> str:
    """The adapter library's name rule, for the wizard (ui/ does not import core.adapters)."""
    from core.adapters.cards import validate_adapter_name as check

    return check(name)


def saved_run_differences(run_dir, args: list[str]) -> list[str]:
    """What the run saved in `run_dir` was started with that the `train sft ...` command `args` would not start
    (words such as "model", "data file", "recipe"); [] when Resume would train what `args` asks for. Reads
    args.json only; the data itself is checked by the child when it resumes."""
    from core.training.sft import saved_run_differences as differences

    return differences(Path(run_dir), list(args))
