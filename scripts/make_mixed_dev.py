"""Question files for routing by benefit (#39): easy arithmetic, and the mixed dev set Auto is judged on.

    python -m scripts.make_mixed_dev --out DIR

writes, deterministically (same files on every machine):
- `arithmetic_train.jsonl`, `arithmetic_dev.jsonl`: one-step sums, differences (some negative), products and exact
  quotients (a two- or three-digit number times a two-digit one, divided back), GSM8K-shaped ("question", "answer"
  ending "#### n"), 200 and 64 rows from two seeds, no dev question among the train ones. Both modes should get
  these right, so thinking only costs time on them.
- `mixed_dev.jsonl`: GSM8K train rows 7100-7195 (the dev split every #39 choice is made on), MATH train rows
  7436-7499 (the file's last 64), the 64 arithmetic dev rows and Alpaca rows 4900-4963 (code and writing
  instructions), in that order — word problems, competition math and easy arithmetic, each scored by
  math-verify, then chat, which has no gold answer: timed (thinking there only costs time), not scored;
  `mixed_dev.subsets.json` names each part's rows. The chat part comes last, so the first 224 rows are the same
  as before it was added.
Nothing here is a test row; no adapter, head or trace set was made from these rows (the shipped switchers saw
Alpaca rows 0-199).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
GSM8K_DEV = (7100, 96)
MATH_DEV = (7436, 64)
CHAT_DEV = (4900, 64)


def arithmetic(n: int, seed: int) -> list[dict]:
    """`n` one-step arithmetic questions with their answers, GSM8K-shaped."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        kind = rng.choice("+-*/")
        a, b = rng.randint(12, 999), rng.randint(12, 99)
        if kind == "+":
            q, ans = rng.choice([f"What is {a} + {b}?", f"Add {a} and {b}."]), a + b
        elif kind == "-":
            q, ans = rng.choice([f"What is {a} - {b}?", f"Subtract {b} from {a}."]), a - b
        elif kind == "*":
            q, ans = rng.choice([f"What is {a} times {b}?", f"Compute {a} × {b}."]), a * b
        else:
            q, ans = rng.choice([f"What is {a * b} divided by {b}?", f"Compute {a * b} ÷ {b}."]), a
        rows.append({"question": q, "answer": f"#### {ans}"})
    return rows


def rows_of(path: Path, start: int, count: int) -> list[dict]:
    lines = path.read_text().splitlines()[start:start + count]
    if len(lines) != count:
        raise SystemExit(f"{path} has no rows {start}-{start + count - 1}")
    return [json.loads(line) for line in lines]


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{path}: {len(rows)} rows")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.make_mixed_dev", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--data", type=Path, default=DATA, help="the shared data folder (gsm8k/, math/, chat/)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    train = arithmetic(200, seed=39)
    write(args.out / "arithmetic_train.jsonl", train)
    dev_arithmetic = [r for r in arithmetic(80, seed=7100) if r not in train][:64]
    write(args.out / "arithmetic_dev.jsonl", dev_arithmetic)
    mixed = (rows_of(args.data / "gsm8k" / "train.jsonl", *GSM8K_DEV)
             + rows_of(args.data / "math" / "train.jsonl", *MATH_DEV) + dev_arithmetic
             + rows_of(args.data / "chat" / "alpaca_5k.jsonl", *CHAT_DEV))
    write(args.out / "mixed_dev.jsonl", mixed)
    g, m = GSM8K_DEV[1], MATH_DEV[1]
    a = g + m + len(dev_arithmetic)
    subsets = {"gsm8k": [0, g], "math": [g, g + m], "arithmetic": [g + m, a], "chat": [a, len(mixed)]}
    (args.out / "mixed_dev.subsets.json").write_text(json.dumps(subsets) + "\n")  # read by bench.routing
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
