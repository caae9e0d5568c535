"""Training run folders: resumable checkpoints, the event log and the STOP file. Shared by SFT and RL.

A run folder holds `args.json` (the run's arguments), `log.jsonl` (every event, one JSON object a line) and
`checkpoint/`: `adapter.safetensors` (the trainable tensors, exact dtype), `optimizer.safetensors` (the
optimizer's tensors flattened to `state.<param index>.<key>`) and `state.json` (step, RNG states as ints and
lists, param groups, the data's hash, the model and the recipe, anything else the trainer adds). No pickle anywhere:
tensors are safetensors, the rest JSON. A resume refuses data files that are gone or hash differently from the
checkpoint's (`check_resume_data`): the run would go on with other records and redraw its held-out split; a
checkpoint saved before hashes were kept resumes unchecked.
A file named `STOP` in the folder, SIGTERM or SIGINT asks the trainer to stop after the current step (the trainer
removes the file when it takes the request on; it never clears one while it starts).
"""
from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from models.convert import AtomicDir

CHECKPOINT = "checkpoint"
STOP_FILE = "STOP"


class CannotResume(ValueError):
    """This run's checkpoint does not belong to what would be trained now (other data, other settings): the run
    must start again. Its error event says `"resumable": false`."""


def files_hash(paths) -> str:
    """sha256 of the files' bytes, in order (for data read without the record check)."""
    digest = hashlib.sha256()
    for p in paths:
        digest.update(Path(p).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _named(paths) -> str:
    paths = [str(p) for p in paths]
    return f"the data file {paths[0]}" if len(paths) == 1 else "the data files " + ", ".join(paths)


def check_data_present(paths) -> None:
    """Refuse to resume when a data file of the run is gone."""
    gone = [str(p) for p in paths if not Path(p).is_file()]
    if gone:
        verb = "is" if len(gone) == 1 else "are"
        raise CannotResume(f"{_named(gone)} {verb} gone since the checkpoint of this run: put it back, or start the "
                           "run again")


def check_resume_data(saved_hash: str | None, current_hash: str, paths) -> None:
    """Refuse to resume when the data no longer hashes as when the checkpoint was saved; no saved hash (a
    checkpoint from before hashes were kept): no check."""
    if saved_hash and saved_hash != current_hash:
        raise CannotResume(f"{_named(paths)} changed since the checkpoint of this run: start the run again, or put "
                           "the file back as it was")


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone().contiguous() for name, p in model.named_parameters() if p.requires_grad}


def optimizer_tensors(optim: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """(flat named tensors, JSON-safe rest) of an optimizer's state_dict."""
    sd = optim.state_dict()
    tensors, scalars = {}, {}
    for index, entry in sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().clone().contiguous()
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def restore_optimizer(optim: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], rest: dict) -> None:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    for name, value in rest.get("scalars", {}).items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optim.load_state_dict({"state": state, "param_groups": rest["param_groups"]})


def rng_state(order: random.Random | None = None) -> dict:
    """Python (the data order's own Random, when given) and torch RNG states as JSON-safe lists."""
    out = {"torch": torch.get_rng_state().tolist()}
    if order is not None:
        version, internal, gauss = order.getstate()
        out["order"] = [version, list(internal), gauss]
    return out


def restore_rng(saved: dict, order: random.Random | None = None) -> None:
    torch.set_rng_state(torch.tensor(saved["torch"], dtype=torch.uint8))
    if order is not None and "order" in saved:
        version, internal, gauss = saved["order"]
        order.setstate((version, tuple(internal), gauss))


def save_checkpoint(folder: Path, model: nn.Module, optim: torch.optim.Optimizer | None, state: dict) -> Path:
    """Atomically replace `folder` with the trainable weights, optimizer state and `state` (JSON-safe)."""
    with AtomicDir(Path(folder)) as tmp:
        save_file(trainable_state(model), str(tmp / "adapter.safetensors"), metadata={"format": "pt"})
        rest = {}
        if optim is not None:
            tensors, rest = optimizer_tensors(optim)
            save_file(tensors, str(tmp / "optimizer.safetensors"), metadata={"format": "pt"})
        (tmp / "state.json").write_text(json.dumps({**state, "optimizer": rest}))
    return Path(folder)


def read_state(folder: Path) -> dict:
    """A checkpoint's `state.json` (no tensors loaded)."""
    return json.loads((Path(folder) / "state.json").read_text())


def load_checkpoint(folder: Path, model: nn.Module, optim: torch.optim.Optimizer | None) -> dict:
    """Put the saved trainable weights (and optimizer state) back; return the saved `state` dict."""
    folder = Path(folder)
    state = json.loads((folder / "state.json").read_text())
    weights = load_file(str(folder / "adapter.safetensors"))
    params = dict(model.named_parameters())
    missing = [name for name in weights if name not in params]
    if missing:
        raise ValueError(f"the checkpoint does not fit this model (no parameter {missing[0]})")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    if optim is not None and (folder / "optimizer.safetensors").is_file():
        restore_optimizer(optim, load_file(str(folder / "optimizer.safetensors")), state.get("optimizer", {}))
    return state


class RunDir:
    """One training run's folder: args, event log, checkpoint and stop requests."""

    def __init__(self, path: Path, json_progress: bool = False, out=None):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.json_progress = json_progress
        self.out = out or sys.stdout
        self._stop = threading.Event()
        self._log_failed = False

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    def has_checkpoint(self) -> bool:
        return (self.checkpoint / "state.json").is_file()

    def start_fresh(self, args: dict) -> None:
        """A new run in this folder: an earlier run's checkpoint and log go, these args are written."""
        shutil.rmtree(self.checkpoint, ignore_errors=True)
        (self.path / "log.jsonl").unlink(missing_ok=True)
        self.write_args(args)

    def fail(self, err: Exception) -> int:
        """Report a run's error as an 'error' event and return the exit code (2: a bad value, 1: anything else);
        without --json-progress the error is raised on, with its traceback."""
        message = str(err) or type(err).__name__
        event = {"event": "error", "message": message}
        if isinstance(err, CannotResume):
            event["resumable"] = False
        try:
            self.emit(event)
        except Exception as emit_err:  # e.g. stdout closed: the run's own error is the one to report
            print(f"ponder: could not report the error as an event ({emit_err})", file=sys.stderr, flush=True)
        if not self.json_progress:
            raise err
        print(f"ponder: {message}", file=sys.stderr, flush=True)
        return 2 if isinstance(err, ValueError) else 1

    def write_args(self, args: dict) -> None:
        (self.path / "args.json").write_text(json.dumps(args, indent=2))

    def read_args(self) -> dict:
        path = self.path / "args.json"
        if not path.is_file():
            raise FileNotFoundError(f"{self.path} holds no earlier run to resume (no args.json)")
        return json.loads(path.read_text())

    def emit(self, event: dict, text: str | None = None) -> None:
        """Print the event as one JSON line with --json-progress, else as `text` (when given), then log it. A log
        that cannot be written (a full disk) is said once on stderr; the run goes on."""
        if self.json_progress:
            print(json.dumps(event), file=self.out, flush=True)
        elif text:
            print(text, file=self.out, flush=True)
        try:
            with open(self.path / "log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({**event, "time": round(time.time(), 3)}) + "\n")
        except OSError as err:
            if not self._log_failed:
                self._log_failed = True
                print(f"ponder: cannot write the training log {self.path / 'log.jsonl'} ({err}); training goes on "
                      "without it", file=sys.stderr, flush=True)

    def clear_stop(self) -> None:
        """Forget a stop request. Not for a starting process: a STOP written while it imports is a real request."""
        (self.path / STOP_FILE).unlink(missing_ok=True)
        self._stop.clear()

    def request_stop(self) -> None:
        self._stop.set()

    def should_stop(self) -> bool:
        """A stop was asked for: by a signal, or by a STOP file (taken on once seen, so the next run goes on)."""
        if not self._stop.is_set() and (self.path / STOP_FILE).exists():
            self._stop.set()
            try:
                (self.path / STOP_FILE).unlink(missing_ok=True)
            except OSError:  # it stays; the parent that wrote it removes it when this process has ended
                pass
        return self._stop.is_set()

    def stop_on_signals(self) -> None:
        """SIGTERM / SIGINT (Ctrl+C) ask for a stop after the current step (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: self.request_stop())
