"""The hardware bounds a decode step runs into on this CPU: read bandwidth and dot-product instruction rates.

Builds `bench/machine_bounds.c` with the C compiler Python was built with (AVX-512 CPUs only) and runs it: the
bytes per second two threads can stream from memory (what a batch-1 step, reading every weight once, can at best
reach) and how many dot-product instructions per second the cores retire, for those the CPU has: `vdpbf16ps` (the
int4 kernel's bf16 path), `vpdpbusd` (int8 VNNI; `vpdpwssd` of the VNNI path runs at its rate), `vfmadd231ps` zmm
and ymm (the fp32 and AVX2 paths) and `vpermt2b` (the AVX-512 paths' nibble lookup). From these and the weights each
token reads it derives the fastest steps possible: batch 1 = weight bytes / bandwidth, or the VNNI path's
instructions if longer; 8 rows = 8 x MACs / (MACs per instruction) / rate, or the weight read if longer; all with
nothing else costing time. Writes
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


DOTS = {  # figure: (multiply-adds one instruction does, its name in the table)
    "vdpbf16ps_g_s": (32, "vdpbf16ps zmm"), "vpdpbusd_g_s": (64, "vpdpbusd zmm"),
    "vfmadd_zmm_g_s": (16, "vfmadd231ps zmm"), "vfmadd_ymm_g_s": (8, "vfmadd231ps ymm"),
}
"""The 8-row bound of each instruction the CPU has: 8 x MACs / (MACs per instruction) / rate."""


def bounds(figures: dict[str, dict[int, float]], threads: int = 2) -> dict[str, dict]:
    gb_s = figures["read_gb_s"][threads]
    result = {}
    for model, (ponder_mb, llama_mb, macs) in MODELS.items():
        one_row_ms = ponder_mb * 2**20 / (gb_s * 1e9) * 1e3
        b = {"batch1_weight_read_ms": round(one_row_ms, 2), "batch1_max_tok_s": round(1e3 / one_row_ms, 1),
             "llama_cpp_batch1_max_tok_s": round(1e3 / (llama_mb * 2**20 / (gb_s * 1e9) * 1e3), 1),
             "bytes_ratio_llama_cpp_vs_ponder": round(llama_mb / ponder_mb, 3)}
        if "vpermt2b_zmm_g_s" in figures and "vpdpbusd_g_s" in figures:
            # The VNNI path without BF16: per 32 weights and row, one vpermt2b (shared by the rows of a pass)
            # and one vpdpwssd, which retires at vpdpbusd's rate.
            per32 = 1 / figures["vpermt2b_zmm_g_s"][threads] + 1 / figures["vpdpbusd_g_s"][threads]
            compute_ms = macs / 32 * per32 / 1e9 * 1e3
            b["batch1_vnni_path_compute_ms"] = round(compute_ms, 2)
            b["batch1_vnni_path_max_tok_s"] = round(1e3 / max(one_row_ms, compute_ms), 1)
        for key, (per_instruction, _) in DOTS.items():
            if key in figures:
                dots_ms = 8 * macs / per_instruction / (figures[key][threads] * 1e9) * 1e3
                b[f"rows8_{key[:-4]}_ms"] = round(dots_ms, 2)
                b[f"rows8_max_tok_s_{key[:-4]}"] = round(8e3 / max(one_row_ms, dots_ms), 1)
        result[model] = b
    return result


def to_markdown(result: dict) -> list[str]:
    f = result["figures"]
    names = {"read_gb_s": "read bandwidth GB/s", "vpermt2b_zmm_g_s": "vpermt2b zmm, G/s",
             **{k: f"{label}, G/s" for k, (_, label) in DOTS.items()}}
    lines = [f"Machine bounds on {result['cpu']} (bench/machine_bounds.c)", "",
             "| figure | 1 thread | 2 threads |", "|---|---:|---:|"]
    lines += [f"| {label} | {f[k][1]} | {f[k][2]} |" for k, label in names.items() if k in f]
    dots = [k[:-4] for k in DOTS if k in f]
    lines += ["", "| model | weights read / token, ms | batch-1 max tok/s | llama.cpp's max | VNNI path compute ms "
              "(max tok/s) | " + " | ".join(f"8 rows {d} ms (max aggregate tok/s)" for d in dots) + " |",
              "|---|---:|---:|---:|---:|" + "---:|" * len(dots)]
    for model, b in result["bounds"].items():
        vnni = (f"{b['batch1_vnni_path_compute_ms']} ({b['batch1_vnni_path_max_tok_s']})"
                if "batch1_vnni_path_compute_ms" in b else "-")
        lines.append(f"| {model} | {b['batch1_weight_read_ms']} | {b['batch1_max_tok_s']} | "
                     f"{b['llama_cpp_batch1_max_tok_s']} | {vnni} | "
                     + " | ".join(f"{b[f'rows8_{d}_ms']} ({b[f'rows8_max_tok_s_{d}']})" for d in dots) + " |")
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
