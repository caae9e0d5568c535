"""What each part of W4-FPT does: `python -m bench.fpt_ablation [--model ID] [--trained DIR]`.

Rows, int4 at group 128 (LM head too, except in the two part rows) with a bf16 KV cache, built in this process
from the bf16 weights:
- `w4`: round to nearest on the min-max grid (the plain W4 row of `ponder bench quant`);
- `w4 + grid T`: the shipped grid-searched transforms (resources/fpt/<model>), then round to nearest;
- `w4 + trained T`: the trained transforms in --trained (scripts.fit_fpt_spec --train), then round to nearest;
- `w4 + gptq`: GPTQ rounding without transforms;
- `w4 + grid T + gptq`: the shipped W4-FPT (what `ponder quantize` makes);
- `w4 + trained T + gptq`: the trained transforms under GPTQ;
- `w4 LM head only` / `w4 layers only`: round to nearest on the LM head alone or on the decoder layers alone (the
  rest bf16): which share of W4's KL the head carries, where none of the layer transforms reach;
- `w4 LM head only + head scale`: the head alone again, after an AWQ-style input scale on it (final norm weight ÷ c,
  head columns × c, exact in float; c = a^α, a the final states' mean |x| per channel on the calibration texts, α
  by the rounded head's KL on them): what the one transform that reaches the head can do there;
- `w4 + rotation`: the residual rotation of `models.fpt` (randomised Hadamard, norms folded, seed 0), then round
  to nearest everywhere (implemented, off by default).
Per row: perplexity, top-1 agreement and mean KL against bf16 on `ponder bench quant`'s held text (GSM8K train
solutions 1000-1039, MATH train 1000-1019, Alpaca 0-39; the transforms and GPTQ see GSM8K/MATH train rows
3000-3031), and the share of W4's KL gap each closes. `--gsm8k-dev N` also answers the dev split (GSM8K train rows
7100 on, the split every #39/#42 choice is made on) in Fast mode with each row's weights, as `ponder eval` runs
Fast there (greedy, batches of 8, asked for `\boxed{}`, 512-token cap, the app's int8 KV cache); the answers go to
bench/results/fpt_ablation_dev/fpt_ablation_<model>[_<tag>]/. Decode speed is the same for every row (same kernels, same shapes):
`ponder bench quant --decode` measures it. Results: bench/results/fpt_ablation_<model>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench.machine import cpu_name
from bench.quant import RESULTS, held_rows
from bench.quant_fidelity import compare, log_probs
from core.config import EngineConfig
from core.loading import GPTQ_TOKENS, calibration_batches, load_plain, load_tokenizer, set_threads, shipped_fpt_spec
from core.storage.model_store import ModelStore
from models.fpt import FptSpec, apply_fpt, random_rotation
from models.fpt_calibration import _normalised, fake_int4, quantize_w4_fpt
from models.quantization import quantize_model

ROWS = ("w4", "w4 + grid T", "w4 + trained T", "w4 + gptq", "w4 + grid T + gptq", "w4 + trained T + gptq",
        "w4 LM head only", "w4 layers only", "w4 LM head only + head scale", "w4 + rotation")
PARTS = {"w4 LM head only": (None, 4), "w4 layers only": (4, None), "w4 LM head only + head scale": (None, 4)}
"""Rows rounding one part only: (decoder layers' bits, LM head's bits), None = bf16."""


HEAD_ALPHAS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)


@torch.no_grad()
def head_scale(model, batches: list[torch.Tensor], group: int = 128, tokens: int = 3000,
               seed: int = 0) -> tuple[torch.Tensor, float]:
    """(c, α): the LM head's input scale c = a^α (geometric mean 1), a the final normed states' mean |x| per
    channel over `tokens` calibration positions, α the one whose int4-rounded head W·diag(c), fed x / c, has the
    lowest KL to the float head there (α = 0 is no scale)."""
    states = torch.cat([model.model(input_ids=b.view(1, -1)).last_hidden_state[0, 1:].float() for b in batches])
    states = states[torch.randperm(len(states), generator=torch.Generator().manual_seed(seed))[:tokens]]
    w = model.lm_head.weight.float()
    saliency = states.abs().mean(0).clamp(min=1e-6)

    def kl(c: torch.Tensor) -> float:
        wq, total = fake_int4(w * c, group), 0.0
        for i in range(0, len(states), 512):
            ref = torch.log_softmax(states[i:i + 512] @ w.t(), -1)
            got = torch.log_softmax((states[i:i + 512] / c) @ wq.t(), -1)
            total += float((ref.exp() * (ref - got)).sum())
        return total / len(states)

    scored = {a: kl(_normalised(saliency ** a)) for a in HEAD_ALPHAS}
    alpha = min(scored, key=scored.get)
    return _normalised(saliency ** alpha), alpha


@torch.no_grad()
def scale_head_input(model, c: torch.Tensor) -> None:
    """Final norm weight ÷ c, LM head columns × c, in place (a tied head is untied first): exact in float."""
    norm, head = model.model.norm, model.lm_head
    if head.weight is model.model.embed_tokens.weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    norm.weight.copy_((norm.weight.float() / c).to(norm.weight.dtype))
    head.weight.copy_((head.weight.float() * c).to(head.weight.dtype))


def build(row: str, hf_dir: Path, specs: dict[str, FptSpec | None]):
    """The quantized model of one row, from a fresh bf16 copy of the weights."""
    plain = load_plain(hf_dir, torch.bfloat16)
    if row == "w4 LM head only + head scale":
        c, alpha = head_scale(plain, calibration_batches(hf_dir))
        scale_head_input(plain, c)
        plain.ponder_head_alpha = alpha
    if row == "w4 + rotation":
        spec = FptSpec.identity(plain.config)
        spec.rotation = random_rotation(plain.config.hidden_size, seed=0)
        apply_fpt(plain.float(), spec)
        return quantize_model(plain, 4, 4, 128)
    if row in PARTS:
        return quantize_model(plain, *PARTS[row], 128)  # in place: a head scale's α stays on the model
    kind = "trained" if "trained" in row else "grid" if "grid" in row else None
    spec = specs.get(kind) if kind else None
    if "gptq" in row:
        return quantize_w4_fpt(plain, calibration_batches(hf_dir), 4, 128,
                               spec=spec or FptSpec.identity(plain.config), gptq_tokens=GPTQ_TOKENS)
    if spec is not None:
        apply_fpt(plain.float(), spec)
    return quantize_model(plain, 4, 4, 128)


DEV_OFFSET = 7100
FAST_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
"""Fast mode's system prompt in every #39/#42 dev and test comparison (`ponder eval --system`)."""


def dev_gsm8k(model, tokenizer, model_id: str, n: int, out: Path, row: str = "") -> dict:
    """Fast-mode greedy accuracy of `model` (quantized: ablation row `row`) on the first `n` dev questions, as
    `ponder eval` runs it; its answers go to `out`."""
    from core.data.datasets import load_items
    from core.engine import Engine
    from core.evaluation.evaluate import build_parser, evaluate, write_json

    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"
    engine = Engine(model, tokenizer, model_id=model_id, precision="w4", kv="int8")
    args = build_parser().parse_args(["--data", str(data), "--offset", str(DEV_OFFSET), "--limit", str(n),
                                      "--mode", "base", "--batch", "8", "--max-tokens", "512", "--temperature", "0",
                                      "--system", FAST_SYSTEM, "--out", str(out)])
    result = {**evaluate(engine, load_items(data, n, offset=DEV_OFFSET), args), "ablation_row": row}
    write_json(out, result)
    return {"gsm8k_dev_accuracy": round(result["accuracy"], 4), "gsm8k_dev_n": result["n"],
            "gsm8k_dev_rows": f"{DEV_OFFSET}-{DEV_OFFSET + result['n'] - 1}"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fpt_ablation", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=EngineConfig().model_id)
    p.add_argument("--trained", type=Path, default=None, help="folder holding the trained spec (fpt.safetensors)")
    p.add_argument("--rows", nargs="*", choices=ROWS, default=None, help="rows to measure (default: all there are)")
    p.add_argument("--tag", default="", help="suffix of the result files")
    p.add_argument("--gsm8k-dev", type=int, default=0, metavar="N",
                   help="also answer N dev questions (GSM8K train rows 7100 on) in Fast mode with each row's weights")
    args = p.parse_args(argv)
    set_threads(None)
    installed = ModelStore().get(args.model)
    specs = {"grid": shipped_fpt_spec(installed), "trained": FptSpec.load(args.trained) if args.trained else None}
    if args.trained and specs["trained"] is None:
        raise SystemExit(f"no fpt.safetensors in {args.trained}")
    tokenizer = load_tokenizer(installed.hf_dir)
    rows = held_rows(tokenizer)
    name = f"fpt_ablation_{installed.id}{'_' + args.tag if args.tag else ''}"
    path = RESULTS / f"{name}.json"
    report = json.loads(path.read_text()) if path.is_file() else {"rows": {}}
    if args.trained and report.get("trained_spec") not in (None, str(args.trained)):  # rows of another spec go
        report["rows"] = {k: v for k, v in report["rows"].items() if "trained" not in k}
    for earlier in report["rows"].values():  # rows kept from an earlier run keep that run's date
        earlier.setdefault("date", str(report.get("date", ""))[:10])
    report.update({"model": installed.id, "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
                   "held_text": "GSM8K train 1000-1039, MATH train 1000-1019 solutions, Alpaca 0-39 outputs",
                   "trained_spec": str(args.trained) if args.trained else report.get("trained_spec")})
    if args.trained and (args.trained / "provenance.json").is_file():
        report["trained_provenance"] = json.loads((args.trained / "provenance.json").read_text())
    ref = log_probs(load_plain(installed.hf_dir, torch.bfloat16), "bf16", rows)
    for row in args.rows or ROWS:
        if ("trained" in row and specs["trained"] is None) or ("grid" in row and specs["grid"] is None):
            print(f"{row}: skipped (no such spec for {installed.id})", file=sys.stderr)
            continue
        t = time.perf_counter()
        model = build(row, installed.hf_dir, specs)
        report["rows"][row] = {**compare(ref, log_probs(model, "bf16", rows), rows),
                               "seconds": round(time.perf_counter() - t, 1), "date": time.strftime("%Y-%m-%d")}
        if hasattr(model, "ponder_head_alpha"):
            report["rows"][row]["head_alpha"] = model.ponder_head_alpha
        if args.gsm8k_dev:
            slug = row.replace(" + ", "+").replace(" ", "_")
            report["rows"][row].update(dev_gsm8k(model, tokenizer, installed.id, args.gsm8k_dev,
                                                 RESULTS / "fpt_ablation_dev" / name / f"{slug}.json", row))
        del model
        print(row, json.dumps(report["rows"][row]), file=sys.stderr, flush=True)
        path.write_text(json.dumps(report, indent=2))
    path.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    rows = report["rows"]
    base = rows.get("w4", {}).get("mean_kl_nats")
    lines = ["| row | ppl | top-1 agreement | mean KL | share of W4's KL gap closed | Fast, GSM8K dev |",
             "|---|---:|---:|---:|---:|---:|"]
    for key, r in rows.items():
        closed = "" if not base else (f"(alone: {r['mean_kl_nats'] / base:.0%} of W4's KL)" if key in PARTS
                                      else f"{(base - r['mean_kl_nats']) / base:.0%}")
        dev = f"{r['gsm8k_dev_accuracy']:.1%} (n = {r['gsm8k_dev_n']})" if "gsm8k_dev_accuracy" in r else ""
        lines.append(f"| {key} | {r['perplexity']:.3f} | {r['top1_agreement']:.3f} | {r['mean_kl_nats']:.4f} | "
                     f"{closed} | {dev} |")
    lines.append(f"\n{report['model']}; KL against bf16 on {report['held_text']} "
                 f"({next(iter(rows.values()))['tokens'] if rows else 0} tokens); {report['cpu']}; rows measured "
                 + "; ".join(f"{day}: {', '.join(k for k, r in rows.items() if r.get('date') == day)}"
                             for day in sorted({r.get("date", "") for r in rows.values()})) + ".")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
