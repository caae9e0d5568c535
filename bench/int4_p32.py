"""Ponder's AVX2 layout (p32) against torch's AVX2 packing, the int4 products alone, on the 0.5B's per-token shapes.

Each shape's weights and scales are copied until they fill ~300 MB and the copies are read in turn ("streamed"), or
the first one again and again ("hot"); one row and 16 rows; the same `int4_mm` the app calls, so the two columns
differ only by the layout. Run under the emulation of an AVX2 laptop:
`ATEN_CPU_CAPABILITY=avx2 python -m bench.int4_p32 > bench/results/int4_p32_<cpu>.txt`.
"""
from __future__ import annotations

import time

import torch

from models import int4_kernel as ik

SHAPES = [(1152, 896, 24), (896, 896, 24), (9728, 896, 24), (896, 4864, 24), (151936, 896, 1)]  # (n, k, per token)


def best_us(f, reps: int) -> float:
    for _ in range(5):
        f()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            f()
        best = min(best, (time.perf_counter() - start) / reps * 1e6)
    return best


def time_layout(mats: list, scales: list, x1: torch.Tensor, x16: torch.Tensor) -> tuple[float, float, float]:
    """(one row hot, one row streamed, 16 rows hot) in microseconds for one layout's copies of a matrix."""
    hot = best_us(lambda: ik.int4_mm(x1, mats[0], 128, scales[0]), 200 if mats[0].shape[0] < 100_000 else 20)
    turn = [0]

    def streamed():
        turn[0] = (turn[0] + 1) % len(mats)
        ik.int4_mm(x1, mats[turn[0]], 128, scales[turn[0]])

    strm = best_us(streamed, max(3 * len(mats), 20))
    return hot, strm, best_us(lambda: ik.int4_mm(x16, mats[0], 128, scales[0]), 20)


def main() -> int:
    if not ik.P32:
        raise SystemExit("p32 runs on the int16 AVX2 paths: set ATEN_CPU_CAPABILITY=avx2 (and the kernel built)")
    torch.manual_seed(0)
    total = {"torch": [0.0, 0.0], "p32": [0.0, 0.0]}
    print(f"# {ik.kernel_name()}, {torch.get_num_threads()} threads; microseconds per call")
    for n, k, count in SHAPES:
        q = torch.randint(0, 16, (n, k), dtype=torch.int32)
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        scales = (torch.rand(k // 128, n, 2) * 0.02).to(torch.bfloat16)
        copies = max(1, int(300e6 // (n * k // 2)))
        layouts = {"torch": [packed.clone() for _ in range(copies)]}
        layouts["p32"] = [ik.to_p32(w.clone(), n, k) for w in layouts["torch"]]
        scale_copies = [scales.clone() for _ in range(copies)]
        x1, x16 = torch.randn(1, k).to(torch.bfloat16), torch.randn(16, k).to(torch.bfloat16)
        for name, mats in layouts.items():
            hot, strm, rows16 = time_layout(mats, scale_copies, x1, x16)
            total[name][0] += hot * count
            total[name][1] += strm * count
            print(f"{n:6d} x {k:5d} {name:5s}: 1 row hot {hot:8.1f}, streamed {strm:8.1f}; 16 rows {rows16:8.1f}")
    for name, (hot, strm) in total.items():
        print(f"0.5B per token, {name}: hot {hot / 1e3:.2f} ms, streamed {strm / 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
