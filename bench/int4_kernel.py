"""Ponder's int4 decode kernel (models/_int4.c) against torch's packed kernel, on the 0.5B's and 1.5B's shapes.

Both read the same packed weights (torch's layout). Times one matmul of 1, 2, 4 and 8 rows with the weights and
their scales streamed from memory (copies cycled, 300 MB, as a decode step reads them), checks both against a float64
reference, and reports GB/s of packed weights read. Writes bench/results/int4_kernel[_<tag>].{json,md}.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.machine import cpu_name, write_results
from models import int4_kernel

SHAPES = {  # name: (out_features N, in_features K), as the fused decode step runs them
    "0.5B q/k/v": (1152, 896), "0.5B o": (896, 896), "0.5B gate/up": (9728, 896), "0.5B down": (896, 4864),
    "0.5B LM head": (151936, 896),
    "1.5B q/k/v": (2048, 1536), "1.5B gate/up": (17920, 1536), "1.5B down": (1536, 8960),
}
GROUP = 128


def time_us(fn, copies: int, reps: int) -> float:
    fn(0)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        for i in range(reps):
            fn(i % copies)
        runs.append((time.perf_counter() - start) / reps * 1e6)
    return statistics.median(runs)


def measure(n: int, k: int, rows: int, stream_mb: int = 300) -> dict:
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
    scales = torch.stack([torch.rand(k // GROUP, n, generator=gen) * 0.02,
                          (torch.rand(k // GROUP, n, generator=gen) - 0.5) * 0.02], -1).to(torch.bfloat16).contiguous()
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    w = (q.double() - 8) * scales[..., 0].double().repeat_interleave(GROUP, 0).t() \
        + scales[..., 1].double().repeat_interleave(GROUP, 0).t()
    exact = x.double() @ w.t()
    del w, q
    mine = int4_kernel.int4_mm(x, packed, GROUP, scales)
    theirs = torch._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales)
    copies = max(1, stream_mb * 2**20 // packed.numel())
    stream = [(packed.clone(), scales.clone()) for _ in range(copies)]  # each matrix its own scales, as in a model
    reps = max(20, min(400, 30 * copies))
    us_mine = time_us(lambda i: int4_kernel.int4_mm(x, stream[i][0], GROUP, stream[i][1]), copies, reps)
    us_torch = time_us(lambda i: torch._weight_int4pack_mm_for_cpu(x, stream[i][0], GROUP, stream[i][1]), copies, reps)
    return {"n": n, "k": k, "rows": rows, "bytes": packed.numel(), "us_ponder": round(us_mine, 1),
            "us_torch": round(us_torch, 1), "speedup": round(us_torch / us_mine, 2),
            "gb_s_ponder": round(packed.numel() / us_mine / 1e3, 1), "gb_s_torch": round(packed.numel() / us_torch / 1e3, 1),
            "max_error_ponder": float((mine.double() - exact).abs().max()),
            "max_error_torch": float((theirs.double() - exact).abs().max())}


def agreement(rows: int) -> dict:
    """Top-1 agreement of the real default model's decode steps on Ponder's kernel and on torch's, teacher-forced
    over GSM8K train solutions (24-token prefill, then one token a step, int8 cache), base and reasoning adapter."""
    import json
    from pathlib import Path

    from core.decode.cache import new_cache
    from core.loading import load_engine

    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"
    engine = load_engine(reasoning=True)
    model, slots = engine.model, engine.slots

    def steps(ids: torch.Tensor, adapter, ponder: bool) -> torch.Tensor:
        int4_kernel.ENABLED = ponder
        cache, logits = new_cache(model.config, "int8"), []
        with torch.inference_mode():
            with slots.using(None):
                model(input_ids=ids[:, :24], cache=cache, use_cache=True, logits_to_keep=1)
            with slots.using(adapter):
                for i in range(24, ids.shape[1]):
                    logits.append(model(input_ids=ids[:, i:i + 1], cache=cache, use_cache=True,
                                        logits_to_keep=1).logits[0, -1].float())
        int4_kernel.ENABLED = True
        return torch.stack(logits)

    cases = {}
    for name, adapter in (("base", None), ("reasoning adapter", slots.reasoning)):
        same = total = 0
        worst = 0.0
        for line in data.read_text().splitlines()[:rows]:
            row = json.loads(line)
            ids = torch.tensor([engine.tokenizer(row["question"] + "\n" + row["answer"])["input_ids"]])
            mine, theirs = steps(ids, adapter, True), steps(ids, adapter, False)
            same += int((mine.argmax(-1) == theirs.argmax(-1)).sum())
            total += mine.shape[0]
            worst = max(worst, float((mine - theirs).abs().max()))
        cases[name] = {"top1_agreement": round(same / total, 4), "tokens": total, "max_logit_diff": round(worst, 3)}
    return {"rows": rows, "cases": cases}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.int4_kernel", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--tag", default="", help="suffix of the result files (e.g. the CPU's vendor)")
    p.add_argument("--agreement", type=int, default=6, metavar="ROWS",
                   help="GSM8K train solutions to teacher-force through the real model on both kernels (0: skip)")
    args = p.parse_args(argv)
    if not int4_kernel.ENABLED:
        raise SystemExit(f"Ponder's int4 kernel does not run here ({int4_kernel.kernel_name()})")
    torch.set_num_threads(2)
    table = [measure(n, k, rows) | {"shape": name} for rows in args.rows for name, (n, k) in SHAPES.items()]
    result = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__, "group": GROUP,
              "streamed": "weights and scales (before 2026-12-06: weights only)", "results": table}
    if args.agreement:
        result["agreement"] = agreement(args.agreement)
    md = [f"int4 matmul, Ponder's kernel vs torch's packed kernel; {result['cpu']}, {result['threads']} threads, "
          "weights and scales streamed from memory", "",
          "| shape | N×K | rows | Ponder µs | torch µs | speedup | Ponder GB/s | max error (Ponder / torch) |",
          "|---|---|---:|---:|---:|---:|---:|---|"]
    md += [f"| {r['shape']} | {r['n']}×{r['k']} | {r['rows']} | {r['us_ponder']} | {r['us_torch']} | {r['speedup']}× | "
           f"{r['gb_s_ponder']} | {r['max_error_ponder']:.1e} / {r['max_error_torch']:.1e} |" for r in table]
    for name, case in result.get("agreement", {}).get("cases", {}).items():
        md.append(f"\nReal model, {name}: top-1 agreement with torch's kernel {case['top1_agreement']:.4f} over "
                  f"{case['tokens']} teacher-forced tokens; largest logit difference {case['max_logit_diff']}.")
    write_results("int4_kernel" + (f"_{args.tag}" if args.tag else ""), result, md, print_json=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
