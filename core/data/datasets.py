"""Reading evaluation/training files: GSM8K (question, answer with '#### n'), MATH (problem, answer),
Alpaca (instruction, input). Malformed lines give an error naming the file and line (unreadable JSON) or the
file and row (a row of the wrong shape)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.data.sft import read_jsonl


@dataclass(frozen=True)
class Item:
    prompt: str
    gold: str | None
    """Reference final answer (None for chat instructions)."""
    source: str


def to_item(row: dict, path: Path, where: str = "") -> Item:
    """`where` (e.g. ' row 12') places the row in the error a malformed one raises."""
    def text(key: str) -> str:
        if not isinstance(row[key], str):
            raise ValueError(f"{path}{where}: '{key}' should be text, not {type(row[key]).__name__}")
        return row[key].strip()

    if not isinstance(row, dict):
        raise ValueError(f"{path}{where}: each line should be a JSON object, not {type(row).__name__}")
    if "question" in row and "answer" in row:
        gold = str(row["answer"]).rpartition("####")[2].strip().replace(",", "")
        return Item(text("question"), gold, "gsm8k")
    if "problem" in row and "answer" in row:
        return Item(text("problem"), str(row["answer"]), "math")
    if "instruction" in row:
        extra = str(row.get("input") or "").strip()
        if extra.lower() in ("<noinput>", "no input", "noinput"):
            extra = ""
        return Item(text("instruction") + ("\n\n" + extra if extra else ""), None, "alpaca")
    raise ValueError(f"{path}{where}: rows need GSM8K (question/answer), MATH (problem/answer) or Alpaca "
                     "(instruction) fields")


def load_items(path: Path, limit: int | None = None, offset: int = 0, shuffle_seed: int | None = None) -> list[Item]:
    """Rows [offset, offset+limit) of the file, or a seeded random sample of `limit` rows when shuffle_seed is set."""
    import random

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if shuffle_seed is not None:
        rows = list(enumerate(read_jsonl(path), 1))
        random.Random(shuffle_seed).shuffle(rows)
        rows = rows[:limit]
    else:
        rows = list(enumerate(read_jsonl(path, (limit + offset) if limit else None), 1))[offset:]
    return [to_item(r, path, f" row {n}") for n, r in rows]
