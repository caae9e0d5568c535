"""How many calibration tokens GPTQ needs: W4-FPT's distance to the float model when its Hessians see all of each
calibration text, every k-th text, or each text's first N tokens (the shipped FPTQuant° spec, GPTQ layer by layer).

    python -m bench.gptq_tokens --model qwen2.5-coder-0.5b-instruct --variants 1,2,3,c256,c192,c160,c128

A variant `k` takes every k-th of the 64 texts whole (up to 512 tokens), `cN` all 64 cut at N tokens; a suffix
`:fp32` runs the calibration forward and the Gram products in float32 (the path of CPUs without bf16 or VNNI
units) where the default takes this CPU's (`models.gptq.calibration_dtype`, `models.gram.int8_gram_exact`). The
quantized linears run as float32 with their int4 codes dequantized (the function the int4 kernel computes, up
to bf16 activations), against the float32 model, teacher-forced on `ponder bench quant`'s held text: mean KL,
top-1 agreement and perplexity over the reply tokens. float32 everywhere because it is fast on every CPU here
(bf16 matrix products are 7x slower on a CPU without AVX512-BF16). Results: bench/results/gptq_tokens_<model>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from bench.machine import cpu_name
from bench.quant import RESULTS, held_rows
from bench.quant_fidelity import compare
from core.loading import calibration_batches, load_plain, load_tokenizer, set_threads, shipped_fpt_spec
from core.storage.model_store import ModelStore
from models import gptq, gram
from models.fpt import apply_fpt
from models.gptq import dequantize, gptq_layers
from models.quantization import packs_int4


@torch.no_grad()
def log_probs(model, rows) -> list[torch.Tensor]:
    out = []
    for ids, start in rows:
        logits = model(input_ids=torch.tensor([ids[:-1]]), logits_to_keep=torch.arange(start, len(ids) - 1)).logits
        out.append(torch.log_softmax(logits[0].float(), -1))
    return out


def distance(ref, got, rows) -> dict:
    d = compare(ref, got, rows)
    return {"kl": d["mean_kl_nats"], "top1": d["top1_agreement"], "ppl": d["perplexity"], "held_tokens": d["tokens"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--variants", default="1,c192")
    p.add_argument("--tag", default="", help="results file suffix (one file per CPU measured)")
    args = p.parse_args(argv)
    set_threads(None)
    installed = ModelStore().get(args.model)
    rows = held_rows(load_tokenizer(installed.hf_dir))
    ref = log_probs(load_plain(installed.hf_dir, torch.float32), rows)
    texts = calibration_batches(installed.hf_dir)
    path = RESULTS / f"gptq_tokens_{installed.id}{'_' + args.tag if args.tag else ''}.json"
    report = json.loads(path.read_text()) if path.is_file() else {"rows": {}}
    report.update(model=installed.id, cpu=cpu_name(), date=time.strftime("%Y-%m-%d %H:%M"))
    for variant in args.variants.split(","):
        base, _, how = variant.partition(":")
        cut = int(base[1:]) if base.startswith("c") else 512
        stride = 1 if base.startswith("c") else int(base)
        gram.int8_gram_exact.cache_clear()
        os.environ["PONDER_GPTQ_INT8"] = "0" if how == "fp32" else "1"
        dtype = torch.float32 if how == "fp32" else gptq.calibration_dtype()
        batches = [b[:cut] for b in texts[::stride]]
        model = load_plain(installed.hf_dir, torch.float32)
        apply_fpt(model, shipped_fpt_spec(installed))
        names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and packs_int4(m, 128)]
        start = time.perf_counter()
        codes = gptq_layers(model, batches, names, 128, dtype=dtype)
        seconds = time.perf_counter() - start
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone(), requires_grad=False)
        with torch.no_grad():  # (untied first: the embedding stays float, as the app keeps it bf16)
            for name, (q, scale, zero) in codes.items():
                model.get_submodule(name).weight.copy_(dequantize(q, scale, zero, 128))
        row = {"texts": len(batches), "tokens": sum(b.numel() for b in batches), "gptq_s": round(seconds, 1),
               "forward": str(dtype).removeprefix("torch."), "gram": "int8" if gram.int8_gram_exact() else "float32",
               **distance(ref, log_probs(model, rows), rows)}
        report["rows"][variant] = row
        print(variant, json.dumps(row), flush=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        del model, codes
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
