"""The question file budget RL trains on (#39): GSM8K train rows the 0.5B can answer often enough to give GRPO a
signal.

    python -m scripts.make_rl_questions --out gsm8k_train_2000-6999_le3steps.jsonl

keeps, in file order, the GSM8K *train* rows in [--offset, --offset + --limit) whose reference solution has at
most `--max-steps` calculator annotations (`<<...>>`, one a computation step). The defaults make the file the
`rl3` run and its successors trained on (rows 2000-6999, at most three steps: 3,212 questions); no adapter, head,
trace set or dev split was made from these rows (the dev split is rows 7100-7195). Rows are copied unchanged.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.data.sft import read_jsonl

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"


def calc_steps(answer: str) -> int:
    """How many calculator annotations a GSM8K reference solution holds."""
    return answer.count("<<")


def select(rows: list[dict], offset: int, limit: int, max_steps: int) -> list[dict]:
    """Rows offset..offset+limit-1 whose solutions take at most `max_steps` calculator steps, in order."""
    return [r for r in rows[offset:offset + limit] if calc_steps(r["answer"]) <= max_steps]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.make_rl_questions", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DATA, help="GSM8K train JSONL")
    p.add_argument("--offset", type=int, default=2000)
    p.add_argument("--limit", type=int, default=5000)
    p.add_argument("--max-steps", type=int, default=3, help="most calculator steps a kept solution has")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not args.data.is_file():
        raise SystemExit(f"no such file: {args.data}")
    try:
        rows = read_jsonl(args.data)
    except ValueError as err:
        raise SystemExit(str(err)) from err
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not {"question", "answer"} <= row.keys():
            raise SystemExit(f"{args.data}: row {n} is not a GSM8K row (needs 'question' and 'answer')")
    kept = select(rows, args.offset, args.limit, args.max_steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
    print(f"{len(kept)} of {len(rows[args.offset:args.offset + args.limit])} rows kept -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
