"""A terminal progress bar for the model store's `progress(stage, done, total)` callbacks."""
from __future__ import annotations

import sys

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

    def __call__(self, stage: str, done: int, total: int) -> None:
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
        if self.bar is not None:
            self.bar.close()
            self.bar = None
