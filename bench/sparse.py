"""`ponder bench sparse`: what each efficient-decode mode (GRIFFIN, CATS, with or without Caprese) gains and costs.

Rows (`ROWS`): dense, griffin, griffin+caprese, cats, cats+caprese, all at the app's default precision (W4-FPT
weights, int8 KV cache) with the model's shipped CATS thresholds and Caprese branches. Per row:
- `decode_tok_s`, `ttft_s` (GRIFFIN's selection included), `selection_build_s`: `bench.decode`'s measurement of
  the mode in its own process (`--decode`; batch 1, greedy, 128 tokens, median of 3, under the benchmark lock);
- `gsm8k_accuracy`, `mean_thinking_tokens`, `budget_forced_share`: Reason mode on GSM8K test, greedy, thinking
  budget 256 (`ponder eval --decode MODE --batch 8`, math-verify on the whole reply), when asked for
  (`--gsm8k N`; slow: about 20 minutes per 300 questions on 2 cores).
Rows measured in an earlier run are kept unless measured again, so the slow columns can be filled one at a time.
Results: bench/results/sparse_<model>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.machine import cpu_name
from core.config import EngineConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DATA = ROOT.parent / "shared" / "data"
ROWS = {  # engine decode mode -> bench.decode system
    "dense": "ponder_w4fpt_a16kv8",
    "griffin": "griffin",
    "griffin+caprese": "griffin_caprese",
    "cats": "cats",
    "cats+caprese": "cats_caprese",
}
BUDGET = 256


def accuracy(mode: str, n: int, model_id: str) -> dict:
    """`ponder eval --decode mode` in its own process: Reason mode, greedy, budget 256, batch 8."""
    out = RESULTS / "sparse_eval" / f"{mode}_gsm8k.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "core.evaluation.evaluate", "--data", str(DATA / "gsm8k" / "test.jsonl"), "--limit", str(n),
           "--mode", "reason", "--budget", str(BUDGET), "--batch", "8", "--decode", mode, "--model", model_id,
           "--out", str(out), "--json", "--progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"eval of {mode} failed: {proc.stderr.strip().splitlines()[-1:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"gsm8k_accuracy": summary["accuracy"], "gsm8k_n": summary["n"],
            "mean_thinking_tokens": summary["mean_thinking_tokens"],
            "budget_forced_share": summary["budget_forced_share"], "gsm8k_file": str(out.relative_to(ROOT))}


def decode_speed(mode: str, model_id: str) -> dict:
    """bench.decode's batch-1 figures for the mode, in its own process (an error: {"error": ...})."""
    run = [sys.executable, "-m", "bench.decode", "--model", model_id]
    subprocess.run(run + ["--prepare", ROWS[mode]], check=True, cwd=ROOT, capture_output=True)
    proc = subprocess.run(run + ["--one", ROWS[mode], "--tokens", "128", "--runs", "3"], capture_output=True,
                          text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    one = json.loads(proc.stdout.strip().splitlines()[-1])
    return {k: one.get(k) for k in ("decode_tok_s", "ttft_s", "selection_build_s")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ponder bench sparse", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=EngineConfig().model_id)
    p.add_argument("--rows", nargs="*", choices=list(ROWS), default=None, help="modes to measure (default: all)")
    p.add_argument("--gsm8k", type=int, default=0, help="GSM8K test questions per row (0: keep earlier figures)")
    p.add_argument("--decode", action="store_true", help="measure decode tok/s and TTFT (bench.decode, own process)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    path = RESULTS / f"sparse_{args.model}.json"
    for mode in args.rows or list(ROWS):
        row = {}
        if args.decode:
            row.update(decode_speed(mode, args.model))
        if args.gsm8k:
            row.update(accuracy(mode, args.gsm8k, args.model))
        # read again before writing: another run may have filled other columns meanwhile
        report = json.loads(path.read_text()) if path.is_file() else {"rows": {}}
        report.update({"model": args.model, "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
                       "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "precision": "w4-fpt weights, int8 KV cache (the default)", "budget": BUDGET})
        report["rows"][mode] = {**report["rows"].get(mode, {}), **row}
        report["rows"] = {m: report["rows"][m] for m in ROWS if m in report["rows"]}  # the table's order
        print(mode, json.dumps(row), file=sys.stderr, flush=True)
        path.write_text(json.dumps(report, indent=2))  # after every row: a long run keeps what it measured
    if not path.is_file():
        raise SystemExit(f"nothing measured yet: {path} (ask for --decode and/or --gsm8k N)")
    report = json.loads(path.read_text())
    (RESULTS / f"sparse_{args.model}.md").write_text(markdown(report))
    print(json.dumps(report) if args.json else markdown(report))
    return 0


def _fmt(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown(report: dict) -> str:
    dense = report["rows"].get("dense", {})
    lines = ["| decode | tok/s | × dense | TTFT s | selection s | GSM8K (Reason, budget 256) | mean thinking tokens "
             "| cut at budget |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, r in report["rows"].items():
        if "error" in r:
            lines.append(f"| {mode} | error: {r['error']} |  |  |  |  |  |  |")
            continue
        speedup = (r["decode_tok_s"] / dense["decode_tok_s"]
                   if r.get("decode_tok_s") and dense.get("decode_tok_s") else None)
        acc = f"{r['gsm8k_accuracy']:.1%} (n={r['gsm8k_n']})" if "gsm8k_accuracy" in r else ""
        lines.append(f"| {mode} | {_fmt(r.get('decode_tok_s'), '.1f')} | {_fmt(speedup, '.2f')} | "
                     f"{_fmt(r.get('ttft_s'), '.3f')} | {_fmt(r.get('selection_build_s'), '.3f')} | {acc} | "
                     f"{_fmt(r.get('mean_thinking_tokens'), '.0f')} | {_fmt(r.get('budget_forced_share'), '.0%')} |")
    lines.append(f"\n{report['model']}, {report['precision']}; {report['cpu']} ({report['torch_cpu_capability']}), "
                 f"{report['date']}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
