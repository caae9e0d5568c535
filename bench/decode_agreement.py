"""Top-1 agreement of Ponder's decode step with transformers' own path on the same weights.

Teacher-forced over GSM8K train solutions (one token a step after a 24-token prefill, int8 KV cache), the next
token each path ranks first: Ponder's (`core.decode.attention` one-token attention, `core.decode.lean_layers`, the LoRA
fast path of `core.adapters.lora_fast`) against transformers' SDPA attention, its decoder layers and peft's LoRA
forward, with the adapters off (base) and with the reasoning adapter on. Disagreements are near-ties that
float rounding order decides (both attentions are within 0.008 of a float64 reference; `bench.attention`).

`python -m bench.decode_agreement [--rows N] [--json]`; writes bench/results/decode_agreement.json and .md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.machine import cpu_name, write_results

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"
PREFIX = 24


def main(argv=None) -> int:
    from core.decode.cache import new_cache
    from core.loading import load_engine

    p = argparse.ArgumentParser(prog="python -m bench.decode_agreement")
    p.add_argument("--rows", type=int, default=6, help="GSM8K train rows (question + solution) to force")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    engine = load_engine()
    model, slots = engine.model, engine.slots
    swapped = [(m, "_hf_forward") for m in model.modules() if "_hf_forward" in m.__dict__]
    swapped += [(m, "_peft_forward") for m in model.modules() if "_peft_forward" in m.__dict__]
    ours = {id(m): m.forward for m, _ in swapped}

    def use(ponder: bool) -> None:
        model.config._attn_implementation = "ponder" if ponder else "sdpa"
        for module, original in swapped:
            module.forward = ours[id(module)] if ponder else getattr(module, original)

    def firsts(ids: torch.Tensor, adapter) -> list[int]:
        cache, picks = new_cache(model.config, "int8"), []
        with torch.inference_mode():
            with slots.using(None):
                model(input_ids=ids[:, :PREFIX], cache=cache, use_cache=True, logits_to_keep=1)
            for i in range(PREFIX, ids.shape[1]):
                with slots.using(adapter):
                    out = model(input_ids=ids[:, i:i + 1], cache=cache, use_cache=True, logits_to_keep=1)
                picks.append(int(out.logits[0, -1].argmax()))
        return picks

    rows = [json.loads(line) for line in DATA.read_text().splitlines()[: args.rows]]
    result = {"cpu": cpu_name(), "rows": len(rows), "cases": {}}
    for name, adapter in (("base", None), ("reasoning adapter", slots.reasoning)):
        if name != "base" and adapter is None:
            continue
        same = total = 0
        for row in rows:
            ids = torch.tensor([engine.tokenizer(row["question"] + "\n" + row["answer"])["input_ids"]])
            use(False)
            theirs = firsts(ids, adapter)
            use(True)
            mine = firsts(ids, adapter)
            same += sum(a == b for a, b in zip(theirs, mine, strict=True))
            total += len(mine)
        result["cases"][name] = {"top1_agreement": same / total, "tokens": total}
    md = ["| adapters | top-1 agreement | tokens |", "|---|---:|---:|"]
    md += [f"| {k} | {v['top1_agreement']:.4f} | {v['tokens']} |" for k, v in result["cases"].items()]
    md += ["", f"Teacher-forced GSM8K train solutions, int8 KV cache; {result['cpu']}."]
    write_results("decode_agreement", result, md, print_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
