"""Turn the correct answers of a `ponder eval --out` run into trace rows for `ponder train sft --data`.

    python -m scripts.distill_traces --eval run.json --data ../shared/data/gsm8k/train.jsonl --out traces.jsonl

Run the eval on *training* questions (never the test set you report on). Rows are re-scored from their text with
the current scorer (`core.reasoning.voting.is_correct`), not taken from the file's `correct` flags.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.data.datasets import load_items
from core.data.sft import traces_from_eval
from core.reasoning.voting import is_correct


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.distill_traces")
    p.add_argument("--eval", required=True, type=Path, help="a ponder eval --out JSON file (with per-question rows)")
    p.add_argument("--data", required=True, type=Path, help="the data file that eval read")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    result = json.loads(args.eval.read_text())
    items = load_items(args.data)
    questions = {i: (item.prompt, item.gold) for i, item in enumerate(items)}
    rows = [{**r, "correct": is_correct(r["text"], questions[r["index"]][1])}
            for r in result.get("questions", []) if "text" in r and r.get("index") in questions]
    traces = traces_from_eval(rows, questions)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text("".join(json.dumps(t) + "\n" for t in traces))
    tmp.replace(args.out)
    print(f"{len(traces)} traces from {len(result.get('questions', []))} questions -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
