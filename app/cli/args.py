"""argparse pieces every `ponder` command uses: the parser class and value types with one-line errors."""
from __future__ import annotations

import argparse
import math


class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit code 2 (`--help` has the details)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def whole(low: int, high: int | None = None):
    """argparse type: a whole number in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse


def real(low: float, high: float | None = None, *, low_open: bool = False):
    """argparse type: a finite number >= low (> low when low_open) and <= high."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        below = value <= low if low_open else value < low
        if not math.isfinite(value) or below or (high is not None and value > high):
            lo = f"{'>' if low_open else '>='} {low:g}"
            raise argparse.ArgumentTypeError(f"must be {lo}{f' and <= {high:g}' if high is not None else ''}, "
                                             f"got {text}")
        return value

    return parse


def question(text: str) -> str:
    """argparse type: a question with some text in it (`-` reads it from stdin)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the question is empty")
    return text
