"""Pick rejection-sampling fine-tuning rows from `ponder train distill` outputs: per train question, up to K
distinct right traces, shortest first, each within a token cap (rows carry `provenance.trace_tokens`).

    python scripts/select_traces.py --per-question 2 --max-trace-tokens 448 --out rft.jsonl IN.jsonl [IN.jsonl ...]

A question sampled by several files keeps the rows of all of them (deduplicated by thinking text)."""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def select(paths: list[Path], per_question: int, max_trace_tokens: int) -> list[dict]:
    by_question: dict[str, dict[str, dict]] = defaultdict(dict)
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row["provenance"].get("trace_tokens", 0) <= max_trace_tokens:
                    by_question[row["question"]].setdefault(row["thinking"].strip(), row)
    out = []
    for rows in by_question.values():
        out += sorted(rows.values(), key=lambda r: r["provenance"]["trace_tokens"])[:per_question]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", type=Path)
    p.add_argument("--per-question", type=int, default=2)
    p.add_argument("--max-trace-tokens", type=int, default=448)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rows = select(a.inputs, a.per_question, a.max_trace_tokens)
    a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokens = sorted(r["provenance"]["trace_tokens"] for r in rows)
    print(f"{len(rows)} rows over {len({r['question'] for r in rows})} questions, median "
          f"{tokens[len(tokens) // 2]} trace tokens -> {a.out}")


if __name__ == "__main__":
    main()
