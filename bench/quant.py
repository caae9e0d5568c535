"""`ponder bench quant`: how far each weight / KV-cache configuration is from bf16, and what it costs.

Rows (`ROWS`): bf16 (for the embedded model, the dequantized GGUF: the reference), W4 (round-to-nearest int4,
group 128, the app's grid until now), W4-FPT (the same after the FPTQuant° transforms, models/fpt.py), W4 at
group 32, each with a bf16 and an int8 KV cache. Per row:
- `ppl`, `top1_agreement`, `mean_kl_nats`: teacher-forced on held text that calibration never saw (GSM8K train
  solutions 1000-1039, MATH train solutions 1000-1019, Alpaca outputs 0-39; calibration uses rows 3000-3031 of
  GSM8K/MATH train), one row at a time; agreement and KL against the bf16 row;
- `gsm8k_accuracy`, `math500_accuracy`: base-model greedy answers on the test sets (`ponder eval --batch 8`,
  math-verify on the whole reply), when asked for (`--gsm8k N --math500 N`; slow: minutes per 100 questions);
- `decode_tok_s`: `bench.decode`'s measurement of the same configuration in its own process (`--decode`);
- `bytes`: the weight file the configuration loads.
Rows measured in an earlier run are kept unless measured again, so the slow columns can be filled one at a time.
Results: bench/results/quant.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.machine import cpu_name
from bench.quant_fidelity import compare, log_probs, rows_of
from core.config import EngineConfig
from core.data.sft import read_jsonl
from core.loading import load_model, load_tokenizer, quantized_dir
from core.storage.model_store import ModelStore

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DATA = ROOT.parent / "shared" / "data"
ROWS = {  # key -> (precision, kv, int4 group size, bench.decode system)
    "bf16": ("bf16", "bf16", 128, "ponder_bf16_kvbf16"),
    "bf16+kv8": ("bf16", "int8", 128, "ponder_bf16_kv8"),
    "w4": ("w4", "bf16", 128, "ponder_w4_kvbf16"),
    "w4+kv8": ("w4", "int8", 128, "ponder_w4a16kv8"),
    "w4-fpt": ("w4-fpt", "bf16", 128, "ponder_w4fpt_kvbf16"),
    "w4-fpt+kv8": ("w4-fpt", "int8", 128, "ponder_w4fpt_a16kv8"),
    "w4-g32": ("w4", "bf16", 32, None),
    "w4-g32+kv8": ("w4", "int8", 32, "ponder_w4a16kv8_g32"),
}
BOXED = "Solve the problem step by step, then put the final answer in \\boxed{}."


def held_rows(tokenizer) -> list[tuple[list[int], int]]:
    """(prompt + reply ids, index predicting the reply's first token): GSM8K, MATH and Alpaca replies."""
    from core.prompting.chat_format import DEFAULT_SYSTEM

    rows = rows_of(tokenizer, 40, 1000)
    pairs = [(r["problem"], r["solution"]) for r in read_jsonl(DATA / "math" / "train.jsonl", 1020)[1000:]]
    pairs += [((r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")), r["output"])
              for r in read_jsonl(DATA / "chat" / "alpaca_5k.jsonl", 40)]
    for prompt, reply in pairs:
        text = tokenizer.apply_chat_template([{"role": "system", "content": DEFAULT_SYSTEM},
                                              {"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        p_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        r_ids = tokenizer(reply, add_special_tokens=False)["input_ids"][:400]
        rows.append((p_ids + r_ids, len(p_ids) - 1))
    return rows


def weight_bytes(installed, precision: str, group: int) -> int:
    if precision in ("bf16", "fp32"):
        return sum(f.stat().st_size for f in installed.hf_dir.glob("*.safetensors"))
    return (quantized_dir(installed, precision, 4, group) / "model.safetensors").stat().st_size


def accuracy(row: str, data: str, n: int, model_id: str) -> dict:
    """`ponder eval` of the row's configuration in its own process: base mode, greedy, batch 8."""
    precision, kv, group, _ = ROWS[row]
    path = DATA / ("gsm8k/test.jsonl" if data == "gsm8k" else "math500/test.jsonl")
    out = RESULTS / "quant_eval" / model_id / f"{row}_{data}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "core.evaluation.evaluate", "--data", str(path), "--limit", str(n), "--mode", "base",
           "--batch", "8", "--system", BOXED, "--max-tokens", "320", "--precision", precision, "--kv", kv,
           "--group-size", str(group), "--model", model_id, "--out", str(out), "--json", "--progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"eval of {row} on {data} failed: {proc.stderr.strip().splitlines()[-1:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"accuracy": summary["accuracy"], "n": summary["n"], "file": str(out.relative_to(ROOT))}


def decode_speed(row: str, model_id: str) -> float | None:
    system = ROWS[row][3]
    if system is None:
        return None
    run = [sys.executable, "-m", "bench.decode", "--model", model_id]
    subprocess.run(run + ["--prepare", system], check=True, cwd=ROOT, capture_output=True)
    proc = subprocess.run(run + ["--one", system, "--tokens", "128", "--runs", "3"], capture_output=True, text=True,
                          cwd=ROOT)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["decode_tok_s"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ponder bench quant", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=EngineConfig().model_id)
    p.add_argument("--rows", nargs="*", choices=list(ROWS), default=None, help="rows to measure (default: all)")
    p.add_argument("--gsm8k", type=int, default=0, help="GSM8K test questions per row (0: keep earlier figures)")
    p.add_argument("--math500", type=int, default=0, help="MATH-500 questions per row (0: keep earlier figures)")
    p.add_argument("--decode", action="store_true", help="also measure decode tok/s (bench.decode, own process)")
    p.add_argument("--no-fidelity", action="store_true", help="keep the stored perplexity/agreement figures")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    store = ModelStore()
    installed = store.get(args.model)
    tokenizer = load_tokenizer(installed.hf_dir)
    rows = held_rows(tokenizer)
    path = RESULTS / f"quant_{installed.id}.json"
    report = json.loads(path.read_text()) if path.is_file() else {"rows": {}}
    report.update({"model": installed.id, "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
                   "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                   "held_text": "GSM8K train 1000-1039, MATH train 1000-1019 solutions, Alpaca 0-39 outputs"})
    ref = None if args.no_fidelity else log_probs(
        load_model(installed, EngineConfig(model_id=installed.id, precision="bf16")), "bf16", rows)
    for key in args.rows or list(ROWS):
        precision, kv, group, _ = ROWS[key]
        row = report["rows"].get(key, {})
        if ref is not None:
            t = time.perf_counter()
            model = load_model(installed, EngineConfig(model_id=installed.id, precision=precision, group_size=group))
            fidelity = compare(ref, log_probs(model, kv, rows), rows)
            del model
            row.update({"ppl": fidelity["perplexity"], "top1_agreement": fidelity["top1_agreement"],
                        "mean_kl_nats": fidelity["mean_kl_nats"], "tokens": fidelity["tokens"],
                        "bytes": weight_bytes(installed, precision, group), "precision": precision, "kv": kv,
                        "group_size": group, "fidelity_s": round(time.perf_counter() - t, 1)})
        for data, n in (("gsm8k", args.gsm8k), ("math500", args.math500)):
            if n:
                result = accuracy(key, data, n, installed.id)
                row.update({f"{data}_accuracy": result["accuracy"], f"{data}_n": result["n"],
                            f"{data}_file": result["file"]})
        if args.decode:
            row["decode_tok_s"] = decode_speed(key, installed.id)
        report["rows"][key] = row
        print(key, json.dumps(row), file=sys.stderr, flush=True)
        path.write_text(json.dumps(report, indent=2))  # after every row: a long run keeps what it measured
    (RESULTS / f"quant_{installed.id}.md").write_text(markdown(report))
    print(json.dumps(report) if args.json else markdown(report))
    return 0


def _fmt(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown(report: dict) -> str:
    lines = ["| row | ppl | top-1 agreement | mean KL | GSM8K | MATH-500 | decode tok/s | weight MB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in report["rows"].items():
        acc = {d: (f"{r[f'{d}_accuracy']:.3f} (n={r[f'{d}_n']})" if f"{d}_accuracy" in r else "")
               for d in ("gsm8k", "math500")}
        lines.append(f"| {key} | {_fmt(r.get('ppl'), '.3f')} | {_fmt(r.get('top1_agreement'), '.3f')} | "
                     f"{_fmt(r.get('mean_kl_nats'), '.4f')} | {acc['gsm8k']} | {acc['math500']} | "
                     f"{_fmt(r.get('decode_tok_s'), '.1f')} | {r['bytes'] / 2**20:.0f} |")
    for metric, label in (("ppl", "perplexity"), ("mean_kl_nats", "mean KL")):
        gap = _closed_gap(report["rows"], metric)
        if gap is not None:
            lines.append(f"\nW4-FPT closes {gap:.0%} of the W4 → bf16 gap in {label}.")
    lines.append(f"\n{report['model']}; {report['held_text']}; {report['cpu']} ({report['torch_cpu_capability']}), "
                 f"{report['date']}.")
    return "\n".join(lines) + "\n"


def _closed_gap(rows: dict, metric: str) -> float | None:
    """Share of the W4 → bf16 gap in `metric` that W4-FPT closes (both with a bf16 KV cache)."""
    ref, w4, fpt = (rows.get(k, {}).get(metric) for k in ("bf16", "w4", "w4-fpt"))
    if ref is None or w4 is None or fpt is None or math.isclose(w4, ref):
        return None
    return (w4 - fpt) / (w4 - ref)


if __name__ == "__main__":
    raise SystemExit(main())
