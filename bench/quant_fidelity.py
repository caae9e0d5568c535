"""How far each quantized configuration is from bf16 on real text: `python -m bench.quant_fidelity`.

Teacher-forced on GSM8K *train* solutions (question as the chat prompt, the reference solution as the reply): at
every reply position, top-1 agreement with the bf16 model, mean KL(bf16 ‖ quantized) in nats, and the reply's
perplexity. Configurations: int4 weights at several group sizes (LM head at 4 or 8 bits), int8 weights, and the
int8 KV cache on bf16 weights (in one prefill pass the cache hands attention its quantized keys and values, so the
KV gap shows too). Rates over many tokens, not one greedy text, so the figures hold across CPUs; the CPU is named
in the result all the same. Results: bench/results/quant_fidelity.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from bench.machine import cpu_name
from core.config import EngineConfig
from core.data.datasets import load_items
from core.decode.cache import new_cache
from core.loading import load_plain, load_tokenizer
from core.prompting.chat_format import DEFAULT_SYSTEM
from core.storage.model_store import ModelStore
from models.quantization import quantize_model

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"
CONFIGS = {  # name -> (weight bits or None for bf16, LM head bits, group size, KV format)
    "w4_g128_h4 (shipped default)": (4, 4, 128, "bf16"),
    "w4_g64_h4": (4, 4, 64, "bf16"),
    "w4_g32_h4": (4, 4, 32, "bf16"),
    "w4_g32_h8": (4, 8, 32, "bf16"),
    "w8": (8, 8, 128, "bf16"),
    "bf16 weights + int8 KV": (None, None, 128, "int8"),
}


def rows_of(tokenizer, n: int, offset: int) -> list[tuple[list[int], int]]:
    """(prompt + solution ids, index of the position predicting the solution's first token)."""
    rows = []
    for item, raw in zip(load_items(DATA, n, offset), _solutions(n, offset), strict=True):
        prompt = tokenizer.apply_chat_template([{"role": "system", "content": DEFAULT_SYSTEM},
                                                {"role": "user", "content": item.prompt}],
                                               tokenize=False, add_generation_prompt=True)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        r_ids = tokenizer(raw, add_special_tokens=False)["input_ids"]
        rows.append((p_ids + r_ids, len(p_ids) - 1))
    return rows


def _solutions(n: int, offset: int) -> list[str]:
    lines = DATA.read_text().splitlines()[offset:offset + n]
    return [json.loads(line)["answer"].replace("<<", "").replace(">>", "") for line in lines]


@torch.inference_mode()
def log_probs(model, kv: str, rows) -> list[torch.Tensor]:
    """Per row: log-softmax (T_reply, V) over the reply positions, one row at a time (no padding effects)."""
    out = []
    for ids, start in rows:
        x = torch.tensor([ids[:-1]])
        logits = model(input_ids=x, cache=new_cache(model.config, kv), use_cache=True,
                       logits_to_keep=torch.arange(start, len(ids) - 1)).logits[0].float()
        out.append(torch.log_softmax(logits, -1))
    return out


def compare(ref: list[torch.Tensor], got: list[torch.Tensor], rows) -> dict:
    agree = total = 0
    kl = nll = 0.0
    for r, g, (ids, start) in zip(ref, got, rows, strict=True):
        targets = torch.tensor(ids[start + 1:])
        agree += int((r.argmax(-1) == g.argmax(-1)).sum())
        total += len(targets)
        kl += float((r.exp() * (r - g)).sum())
        nll -= float(g.gather(1, targets.view(-1, 1)).sum())
    return {"top1_agreement": agree / total, "mean_kl_nats": kl / total, "perplexity": math.exp(nll / total),
            "tokens": total}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quant_fidelity")
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--offset", type=int, default=1000, help="GSM8K train rows used (train, never test)")
    p.add_argument("--only", nargs="*", default=None, help="configuration names to run (default: all)")
    args = p.parse_args(argv)
    installed = ModelStore().get(EngineConfig().model_id)
    tokenizer = load_tokenizer(installed.hf_dir)
    rows = rows_of(tokenizer, args.rows, args.offset)
    bf16 = load_plain(installed.hf_dir, torch.bfloat16)
    ref = log_probs(bf16, "bf16", rows)
    ref_nll = compare(ref, ref, rows)["perplexity"]
    results = {}
    for name, (bits, head, group, kv) in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        t = time.perf_counter()
        model = bf16 if bits is None else quantize_model(load_plain(installed.hf_dir, torch.bfloat16), bits, head,
                                                         group_size=group)
        results[name] = {**compare(ref, log_probs(model, kv, rows), rows), "seconds": round(time.perf_counter() - t, 1)}
        print(name, results[name], flush=True)
        del model
    report = {"model": installed.id, "cpu": cpu_name(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "date": time.strftime("%Y-%m-%d %H:%M"), "data": f"gsm8k train rows {args.offset}-{args.offset + args.rows - 1}",
              "bf16_perplexity": ref_nll, "configs": results}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "quant_fidelity.json").write_text(json.dumps(report, indent=2))
    md = ["| configuration | top-1 agreement with bf16 | mean KL (nats) | perplexity |", "|---|---:|---:|---:|",
          f"| bf16 (reference) | 1.000 | 0 | {ref_nll:.3f} |"]
    md += [f"| {k} | {v['top1_agreement']:.3f} | {v['mean_kl_nats']:.4f} | {v['perplexity']:.3f} |" for k, v in results.items()]
    md.append(f"\n{report['data']}, {results and next(iter(results.values()))['tokens']} reply tokens; {report['cpu']} "
              f"({report['torch_cpu_capability']}), {report['date']}.")
    (RESULTS / "quant_fidelity.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
