"""The hardware bounds a decode step runs into on this CPU: read bandwidth and dot-product instruction rates.

Builds `bench/machine_bounds.c` with the C compiler Python was built with (AVX-512 CPUs only) and runs it: the
bytes per second two threads can stream from memory (what a batch-1 step, reading every weight once, can at best
reach) and how many `vdpbf16ps` (the int4 kernel's bf16 dot product) and `vpdpbusd` (int8 VNNI) instructions per
second the cores retire (what bounds a step of many rows). From these and the weights each token reads it derives
the fastest steps possible: batch 1 = weight bytes / bandwidth; 8 rows = 8 x MACs / (32 per vdpbf16ps, 64 per
vpdpbusd) / rate, or the weight read if longer; both with nothing else costing time. Writes
bench/results/machine_bounds[_<tag>].{json,md}.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from bench.machine import cpu_name, write_results

SOURCE = Path(__file__).with_suffix(".c")
MODELS = {  # model: (int4 MB a Ponder token reads, llama.cpp Q4_K_M MB a token reads, multiply-adds a row)
    "qwen2.5-coder-0.5b-instruct": (250.0, 374.0, 494e6),
    "qwen2.5-coder-1.5b-instruct": (782.0, 935.0, 1544e6),
}
"""Ponder's bytes: the packed weights and scales `bench.step_profile` reports (int4_weight_mb). llama.cpp's:
its GGUF's tensors less the token embedding (one row a token) plus the tied output head, read with gguf."""


def measure() -> dict[str, dict[int, float]]:
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "machine_bounds"
        subprocess.run([compiler, "-O2", "-fopenmp", str(SOURCE), "-o", str(exe)], check=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    figures: dict[str, dict[int, float]] = {}
    for line in out.splitlines():
        name, threads, value = line.split()
        figures.setdefault(name, {})[int(threads)] = float(value)
    return figures


def bounds(figures: dict[str, dict[int, float]], threads: int = 2) -> dict[str, dict]:
    gb_s, bf16, int8 = (figures[k][threads] for k in ("read_gb_s", "vdpbf16ps_g_s", "vpdpbusd_g_s"))
    result = {}
    for model, (ponder_mb, llama_mb, macs) in MODELS.items():
        one_row_ms = ponder_mb * 2**20 / (gb_s * 1e9) * 1e3
        eight_bf16_ms = 8 * macs / 32 / (bf16 * 1e9) * 1e3
        eight_int8_ms = 8 * macs / 64 / (int8 * 1e9) * 1e3
        result[model] = {
            "batch1_weight_read_ms": round(one_row_ms, 2), "batch1_max_tok_s": round(1e3 / one_row_ms, 1),
            "llama_cpp_batch1_max_tok_s": round(1e3 / (llama_mb * 2**20 / (gb_s * 1e9) * 1e3), 1),
            "bytes_ratio_llama_cpp_vs_ponder": round(llama_mb / ponder_mb, 3),
            "rows8_bf16_dot_ms": round(eight_bf16_ms, 2), "rows8_int8_dot_ms": round(eight_int8_ms, 2),
            "rows8_max_tok_s_bf16": round(8e3 / max(one_row_ms, eight_bf16_ms), 1),
            "rows8_max_tok_s_int8": round(8e3 / max(one_row_ms, eight_int8_ms), 1),
        }
    return result


def to_markdown(result: dict) -> list[str]:
    f = result["figures"]
    lines = [f"Machine bounds on {result['cpu']} (bench/machine_bounds.c)", "",
             "| figure | 1 thread | 2 threads |", "|---|---:|---:|",
             f"| read bandwidth GB/s | {f['read_gb_s'][1]} | {f['read_gb_s'][2]} |",
             f"| vdpbf16ps zmm, G/s | {f['vdpbf16ps_g_s'][1]} | {f['vdpbf16ps_g_s'][2]} |",
             f"| vpdpbusd zmm, G/s | {f['vpdpbusd_g_s'][1]} | {f['vpdpbusd_g_s'][2]} |", "",
             "| model | weights read / token, ms | batch-1 max tok/s | llama.cpp's max | 8 rows bf16 dots ms "
             "| 8 rows int8 dots ms | 8 rows max aggregate tok/s (bf16 / int8) |", "|---|---:|---:|---:|---:|---:|---|"]
    for model, b in result["bounds"].items():
        lines.append(f"| {model} | {b['batch1_weight_read_ms']} | {b['batch1_max_tok_s']} | "
                     f"{b['llama_cpp_batch1_max_tok_s']} | {b['rows8_bf16_dot_ms']} | {b['rows8_int8_dot_ms']} | "
                     f"{b['rows8_max_tok_s_bf16']} / {b['rows8_max_tok_s_int8']} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.machine_bounds", description=__doc__.splitlines()[0])
    p.add_argument("--tag", default="", help="suffix of the result files (e.g. the CPU's vendor)")
    args = p.parse_args(argv)
    figures = measure()
    result = {"cpu": cpu_name(), "figures": figures, "bounds": bounds(figures),
              "note": "batch-1 bounds assume every weight byte is read once a token at the streaming bandwidth and "
                      "nothing else costs time; 8-row bounds assume the dot-product instructions run at their peak "
                      "rate and nothing else costs time."}
    write_results(f"machine_bounds{'_' + args.tag if args.tag else ''}", result, to_markdown(result))
    print("\n".join(to_markdown(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
