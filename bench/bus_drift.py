"""Where a slow round loses its time: the bus's read rate beside the step, its products and the app's token, over time.

`bench.decode`'s interleaved rounds of the 0.5B swing by up to 40% on this host (76-109 tok/s in one run), more than
llama.cpp's. This samples, in one process, back to back (~1.5 s a sample on the 0.5B) for `--samples` samples: the
read rate torch's threads (the cores) get from memory (its sum over a 512 MB float32 buffer, median of 3, before
and after; `bench.machine_bounds` measures the same in C), the step's int4 products back to back
(`bench.step_gap`), the whole fused step, and `engine.generate`'s time a token. If the products' time follows 1/bus
from sample to sample, a slow round is a slow bus: the host's, not the step's. Writes
bench/results/bus_drift_<tag>.{json,md}.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.machine import cpu_name, write_results
from bench.step_gap import Timers

BUFFER_MB = 512


def bus_gb_s(buf: torch.Tensor) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - start)
    return buf.numel() * buf.element_size() / statistics.median(times) / 1e9


def pearson(a: list[float], b: list[float]) -> float:
    return round(statistics.correlation(a, b), 3) if len(a) > 2 else float("nan")


def part_bytes(parts) -> int:
    return sum(p.data.numel() * p.data.element_size() + p.scales.numel() * p.scales.element_size() for p in parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    t = Timers(args.model, n=16)
    buf = torch.ones(BUFFER_MB * 2**20 // 4)
    mb = part_bytes(t.parts) / 1e6
    rows = []
    for i in range(args.samples):
        row = {"at_s": round(time.perf_counter(), 1), "bus_gb_s": bus_gb_s(buf), "products_ms": t.products(0),
               "step_ms": t.step(), "generate_ms": t.generate(tokens=32, runs=1)}
        row["products_gb_s"] = mb / row["products_ms"]
        row["bus_after_gb_s"] = bus_gb_s(buf)
        rows.append({k: round(v, 3) for k, v in row.items()})
        print(f"[{i}] " + " ".join(f"{k} {v:.2f}" for k, v in rows[-1].items() if k != "at_s"), flush=True)
    start = rows[0]["at_s"]
    for r in rows:
        r["at_s"] = round(r["at_s"] - start, 1)
    col = {k: [r[k] for r in rows] for k in rows[0]}
    bus = [(a + b) / 2 for a, b in zip(col["bus_gb_s"], col["bus_after_gb_s"], strict=True)]
    share = [g / b for g, b in zip(col["products_gb_s"], bus, strict=True)]
    summary = {
        "products_mb": round(mb, 1),
        "r_products_ms_vs_1_over_bus": pearson(col["products_ms"], [1 / b for b in bus]),
        "r_step_vs_products": pearson(col["step_ms"], col["products_ms"]),
        "r_generate_vs_step": pearson(col["generate_ms"], col["step_ms"]),
        "products_share_of_bus_median": round(statistics.median(share), 3),
        "products_share_of_bus_range": [round(min(share), 3), round(max(share), 3)],
        **{f"{k}_median": round(statistics.median(v), 2) for k, v in col.items() if k != "at_s"},
        **{f"{k}_range": [min(v), max(v)] for k, v in col.items() if k != "at_s"},
    }
    report = {"model": args.model, "machine": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "threads": torch.get_num_threads(), "samples": rows, "summary": summary}
    lines = [f"# bench.bus_drift: {args.model} on {report['machine']}, {report['date']}, {report['threads']} threads",
             "", "| s | bus GB/s (before, after) | products ms | their GB/s | step ms | generate ms/token |",
             "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['at_s']} | {r['bus_gb_s']:.1f}, {r['bus_after_gb_s']:.1f} | {r['products_ms']:.2f} | "
              f"{r['products_gb_s']:.1f} | {r['step_ms']:.2f} | {r['generate_ms']:.2f} |" for r in rows]
    lines += ["", f"The products read {mb:.1f} MB a step."] + [f"- `{k}`: {v}" for k, v in summary.items()]
    write_results(f"bus_drift{'_' + args.tag if args.tag else ''}", report, lines, print_json=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
