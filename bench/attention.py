"""Decode-attention microbenchmark: one query token per row against a cache of T tokens, with the 0.5B's shapes
(14 query heads, 2 KV heads, head size 64, bf16), through transformers' SDPA path and through Ponder's
`core.decode.attention.decode_attention`; the largest error of each against float64 and the time per layer call.

`python -m bench.attention [--json]`; writes bench/results/attention.json and attention.md.
"""
from __future__ import annotations

import argparse

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from bench.machine import cpu_name, per_call_s, write_results
from core.decode.attention import decode_attention
from core.loading import set_threads

CONTEXTS = (64, 300, 1024, 4096, 8192)


class Layer(torch.nn.Module):
    num_key_value_groups = 7
    is_causal = True


def measure(context: int, rows: int = 1) -> dict:
    torch.manual_seed(0)
    q = (torch.randn(rows, 14, 1, 64) * 3).to(torch.bfloat16)
    k = (torch.randn(rows, 2, context, 64) * 3).to(torch.bfloat16)
    v = torch.randn(rows, 2, context, 64).to(torch.bfloat16)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(7, 1), v.double().repeat_interleave(7, 1)).transpose(1, 2)
    layer, out = Layer(), {"context": context, "rows": rows}
    for name, fn in (("sdpa", sdpa_attention_forward), ("ponder", decode_attention)):
        def call(fn=fn):
            return fn(layer, q, k, v, None, scaling=0.125)[0]
        with torch.inference_mode():
            out[f"{name}_ms"] = 1000 * per_call_s(call)
            out[f"{name}_max_error"] = (call().double() - ref).abs().max().item()
    out["speedup"] = out["sdpa_ms"] / out["ponder_ms"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attention")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    threads = set_threads(None)
    rows = [measure(t) for t in CONTEXTS] + [measure(1024, rows=8)]
    summary = {"cpu": cpu_name(), "threads": threads, "torch": torch.__version__, "rows": rows}
    md = ["| context | rows | SDPA ms | Ponder ms | speed-up | SDPA max error | Ponder max error |",
          "|---:|---:|---:|---:|---:|---:|---:|"]
    md += [f"| {r['context']} | {r['rows']} | {r['sdpa_ms']:.3f} | {r['ponder_ms']:.3f} | {r['speedup']:.1f}× | "
           f"{r['sdpa_max_error']:.4f} | {r['ponder_max_error']:.4f} |" for r in rows]
    md += ["", f"One layer call, 14 query / 2 KV heads of 64, bf16; {summary['cpu']}, {threads} threads, "
           f"torch {torch.__version__}."]
    write_results("attention", summary, md, print_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
