"""Reading evaluation/training files: GSM8K (question, answer with '#### n'), MATH (problem, answer),
Alpaca (instruction, input). Malformed lines give an error naming the file and line."""
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


def to_item(row: dict, path: Path) -> Item:
    if "question" in row and "answer" in row:
        gold = str(row["answer"]).rpartition("####")[2].strip().replace(",", "")
        return Item(row["question"].strip(), gold, "gsm8k")
    if "problem" in row and "answer" in row:
        return Item(row["problem"].strip(), str(row["answer"]), "math")
    if "instruction" in row:
        extra = str(row.get("input") or "").strip()
        if extra.lower() in ("<noinput>", "no input", "noinput"):
            extra = ""
        return Item(row["instruction"].strip() + ("\n\n" + extra if extra else ""), None, "alpaca")
    raise ValueError(f"{path}: rows need GSM8K (question/answer), MATH (problem/answer) or Alpaca (instruction) fields")


def load_items(path: Path, limit: int | None = None, offset: int = 0, shuffle_seed: int | None = None) -> list[Item]:
    """Rows [offset, offset+limit) of the file, or a seeded random sample of `limit` rows when shuffle_seed is set."""
    import random

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if shuffle_seed is not None:
        rows = read_jsonl(path)
        random.Random(shuffle_seed).shuffle(rows)
        rows = rows[:limit]
    else:
        rows = read_jsonl(path, (limit + offset) if limit else None)[offset:]
    return [to_item(r, path) for r in rows]
