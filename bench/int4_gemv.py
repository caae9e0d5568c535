"""A candidate int4 kernel for batch-1 decode against torch's packed one, on the 0.5B's and 1.5B's shapes.

torch's `_weight_int4pack_mm_for_cpu` streams a decode step's int4 weights at about half of what the machine
reads (bench.step_profile), and it is most of the step. `bench/int4_gemv.c` is a GEMV written for one row
(AVX512-BF16, see its header); this compiles it with gcc and OpenMP, checks it against a float64 reference and
torch's kernel on random weights, and times both with the weights streamed from memory (many copies, cycled).
Needs gcc and a CPU with AVX512-BF16. Not used by the app: it measures whether such a kernel would win.
Writes bench/results/int4_gemv.json and .md.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.machine import cpu_name

HERE = Path(__file__).resolve().parent
SHAPES = {  # name: (out_features N, in_features K), as the fused decode step runs them
    "0.5B q/k/v": (1152, 896), "0.5B o": (896, 896), "0.5B gate/up": (9728, 896), "0.5B down": (896, 4864),
    "1.5B q/k/v": (1792, 1536), "1.5B gate/up": (17920, 1536), "1.5B down": (1536, 8960),
}


def build(prefetch: int) -> ctypes.CDLL:
    out = Path(tempfile.mkdtemp(prefix="ponder-int4gemv-")) / "libint4gemv.so"
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", f"-DPF={prefetch}",
                    str(HERE / "int4_gemv.c"), "-o", str(out)], check=True)
    return ctypes.CDLL(str(out))


def pack(q: torch.Tensor) -> torch.Tensor:
    """q (N, K) ints 0..15 → the kernel's layout (see int4_gemv.c)."""
    n, k = q.shape
    q = q.view(n // 16, 16, k // 4, 2, 2)
    byte = (q[:, :, :, 0, :] | (q[:, :, :, 1, :] << 4)).permute(0, 2, 1, 3).reshape(n // 16, k // 4, 32)
    return byte.to(torch.uint8).contiguous()


def measure(lib, n: int, k: int, stream_mb: int = 300, reps: int = 200) -> dict:
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
    scales = torch.stack([torch.rand(k // 128, n, generator=gen) * 0.02,
                          (torch.rand(k // 128, n, generator=gen) - 0.5) * 0.02], -1).to(torch.bfloat16)
    packed_torch = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    mine = pack(q)
    scale, zero = scales[..., 0].float().contiguous(), scales[..., 1].float().contiguous()
    xsum = x.float().view(k // 128, 128).sum(-1).contiguous()
    xbits = x.contiguous().view(torch.int16)
    y = torch.empty(n, dtype=torch.float32)
    args = [ctypes.c_void_p(t.data_ptr()) for t in (mine, scale, zero, xbits, xsum, y)] + [ctypes.c_int(n), ctypes.c_int(k)]
    lib.gemv(*args)
    w = (q.double() - 8) * scale.double().repeat_interleave(128, 0).t() + zero.double().repeat_interleave(128, 0).t()
    exact = (w @ x.double().t()).squeeze(1)
    theirs = torch._weight_int4pack_mm_for_cpu(x, packed_torch, 128, scales)[0]
    copies = max(1, stream_mb * 2**20 // mine.numel())
    mine_copies = [mine.clone() for _ in range(copies)]
    torch_copies = [packed_torch.clone() for _ in range(copies)]

    def time_mine() -> float:
        start = time.perf_counter()
        for i in range(reps):
            args[0] = ctypes.c_void_p(mine_copies[i % copies].data_ptr())
            lib.gemv(*args)
        return (time.perf_counter() - start) / reps * 1e6

    def time_torch() -> float:
        start = time.perf_counter()
        for i in range(reps):
            torch._weight_int4pack_mm_for_cpu(x, torch_copies[i % copies], 128, scales)
        return (time.perf_counter() - start) / reps * 1e6

    time_mine(), time_torch()  # warm-up
    us_mine = statistics.median(time_mine() for _ in range(3))
    us_torch = statistics.median(time_torch() for _ in range(3))
    return {"n": n, "k": k, "bytes": mine.numel(), "us_candidate": round(us_mine, 1), "us_torch": round(us_torch, 1),
            "speedup": round(us_torch / us_mine, 2), "gb_s_candidate": round(mine.numel() / us_mine / 1e3, 1),
            "max_error_candidate": float((y.double() - exact).abs().max()),
            "max_error_torch": float((theirs.double() - exact).abs().max()), "max_abs_output": float(exact.abs().max())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.int4_gemv", description=__doc__.splitlines()[0])
    p.add_argument("--prefetch", type=int, default=2048, help="bytes the kernel prefetches ahead")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    lib = build(args.prefetch)
    rows = {name: measure(lib, n, k) for name, (n, k) in SHAPES.items()}
    result = {"cpu": cpu_name(), "threads": 2, "prefetch": args.prefetch, "torch": torch.__version__, "shapes": rows}
    (HERE / "results" / "int4_gemv.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"int4 GEMV, one row: candidate (bench/int4_gemv.c) vs torch's packed kernel; {result['cpu']}, 2 threads",
             "", "| shape | N×K | candidate µs | torch µs | speedup | candidate GB/s | max error (candidate / torch) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['n']}×{r['k']} | {r['us_candidate']} | {r['us_torch']} | {r['speedup']}× | "
                     f"{r['gb_s_candidate']} | {r['max_error_candidate']:.1e} / {r['max_error_torch']:.1e} |")
    (HERE / "results" / "int4_gemv.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
