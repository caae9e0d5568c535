"""A terminal progress bar for the model store's `progress(stage, done, total)` callbacks."""
from __future__ import annotations

import sys
import time

from tqdm import tqdm

STAGE_LABELS = {
    "assemble": "Assembling model file", "verify": "Verifying checksum", "copy": "Copying model",
    "convert": "Converting to safetensors", "quantize": "Quantizing weights", "download": "Downloading",
    "pip": "Installing model packages",
}


class TerminalProgress:
    """Callable progress sink drawing one tqdm bar per stage on stderr."""

    def __init__(self):
        self.stage = None
        self.bar = None
        self.seconds: dict[str, float] = {}
        """Wall-clock seconds spent in each stage so far, in the order they ran."""
        self._since = 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if self.stage is not None:
            self.seconds[self.stage] = self.seconds.get(self.stage, 0.0) + now - self._since
        self._since = now
        if stage != self.stage:
            self.close()
            self.stage = stage
            is_bytes = stage in ("assemble", "verify", "copy", "download")
            self.bar = tqdm(total=total, desc=STAGE_LABELS.get(stage, stage), file=sys.stderr, unit="B" if is_bytes else "step",
                            unit_scale=is_bytes, leave=True, dynamic_ncols=True)
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.stage is not None:  # the time since the stage's last report is its own too
            now = time.perf_counter()
            self.seconds[self.stage] = self.seconds.get(self.stage, 0.0) + now - self._since
            self._since = now
        if self.bar is not None:
            self.bar.close()
            self.bar = None
