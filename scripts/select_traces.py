"""Pick rejection-sampling fine-tuning rows from `ponder train distill` outputs or `ponder train verifier`'s
`<cache>.candidates.jsonl` (a model's own Reason-mode samples; `core.training.distill.rft_rows`): per train
question, up to K distinct right traces, shortest first, each within a token cap.

    python -m scripts.select_traces --per-question 2 --max-trace-tokens 448 --out rft.jsonl IN.jsonl [IN.jsonl ...]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.training.distill import rft_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", type=Path)
    p.add_argument("--per-question", type=int, default=2)
    p.add_argument("--max-trace-tokens", type=int, default=448)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    try:
        rows = rft_rows(a.inputs, a.per_question, a.max_trace_tokens)
    except ValueError as err:
        raise SystemExit(f"select_traces: {err}") from None
    if not rows:
        raise SystemExit("select_traces: no trace within the token cap in these files")
    a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokens = sorted(r["provenance"]["trace_tokens"] for r in rows)
    print(f"{len(rows)} rows over {len({r['question'] for r in rows})} questions, median "
          f"{tokens[len(tokens) // 2]} trace tokens -> {a.out}")


if __name__ == "__main__":
    main()
