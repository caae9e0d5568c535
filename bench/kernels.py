"""Matmul kernels against rows: what one decode step's projections cost for 1, 2, 4 and 8 rows (parallel answers),
per weight format torch offers on this CPU — packed int4 (what Ponder runs), packed int8, dense bf16 — for the
0.5B's shapes. It tells how parallel answers can scale: when 8 rows cost k times one row in the kernels, a
decode step made of kernels alone gives 8 parallel answers 8/k times one answer's speed; anything above that
comes from per-step overhead that does not grow with the rows — the overhead that makes one answer slow.

`python -m bench.kernels [--json]`; writes bench/results/kernels.json and kernels.md.
"""
from __future__ import annotations

import argparse

import torch

from bench.machine import cpu_name, per_call_s, write_results
from core.loading import set_threads

SHAPES = {  # name: (out_features, in_features, calls per decode step of the 0.5B)
    "q/o (896×896)": (896, 896, 48),
    "k/v (128×896)": (128, 896, 48),
    "gate/up (4864×896)": (4864, 896, 48),
    "down (896×4864)": (896, 4864, 24),
    "LM head (151936×896)": (151936, 896, 1),
}
ROWS = (1, 2, 4, 8)


def per_call_us(fn) -> float:
    return 1e6 * per_call_s(fn)


def kernels(out_f: int, in_f: int) -> dict:
    torch.manual_seed(0)
    packed = torch._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (out_f, in_f), dtype=torch.int32), 1)
    scales = torch.randn(in_f // 128, out_f, 2, dtype=torch.bfloat16)
    q8 = torch.randint(-127, 127, (out_f, in_f), dtype=torch.int8)
    s8 = torch.randn(out_f, dtype=torch.bfloat16)
    dense = torch.randn(out_f, in_f, dtype=torch.bfloat16)
    out = {}
    for m in ROWS:
        x = torch.randn(m, in_f, dtype=torch.bfloat16)
        out[m] = {"int4": per_call_us(lambda x=x: torch._weight_int4pack_mm_for_cpu(x, packed, 128, scales)),
                  "int8": per_call_us(lambda x=x: torch._weight_int8pack_mm(x, q8, s8)),
                  "bf16": per_call_us(lambda x=x: torch.nn.functional.linear(x, dense))}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    threads = set_threads(None)
    with torch.inference_mode():
        table = {name: kernels(o, i) for name, (o, i, _) in SHAPES.items()}
    step = {m: {fmt: sum(table[name][m][fmt] * SHAPES[name][2] for name in SHAPES) / 1000 for fmt in ("int4", "int8",
                                                                                                    "bf16")}
            for m in ROWS}
    scaling = {fmt: step[8][fmt] / step[1][fmt] for fmt in ("int4", "int8", "bf16")}
    best = {m: min(step[m].values()) for m in ROWS}
    kernel_bound = 8 * best[1] / best[8]  # 8 answers' speed over one's, fastest format at each row count
    result = {"cpu": cpu_name(), "threads": threads, "torch": torch.__version__, "us_per_call": table,
              "step_ms": step, "rows8_vs_1": scaling, "parallel8_kernel_bound": kernel_bound}
    md = ["| projection | rows | int4 µs | int8 µs | bf16 µs |", "|---|---:|---:|---:|---:|"]
    md += [f"| {name} | {m} | {v['int4']:.0f} | {v['int8']:.0f} | {v['bf16']:.0f} |"
           for name, rows in table.items() for m, v in rows.items()]
    md += ["", "| rows | one step's projections, int4 ms | int8 ms | bf16 ms |", "|---:|---:|---:|---:|"]
    md += [f"| {m} | {s['int4']:.1f} | {s['int8']:.1f} | {s['bf16']:.1f} |" for m, s in step.items()]
    md += ["", "8 rows cost " + ", ".join(f"{fmt} {k:.2f}×" for fmt, k in scaling.items()) + " one row in the kernels: "
           f"a step of kernels alone, each row count in its fastest format, gives 8 parallel answers "
           f"{kernel_bound:.1f}× one answer's speed; {result['cpu']}, {threads} threads, torch {torch.__version__}."]
    write_results("kernels", result, md, print_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
