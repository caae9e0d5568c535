"""`python -m bench.griffin_selection`: how well a prompt predicts the feed-forward neurons its answer needs.

GRIFFIN keeps the neurons the prompt's tokens use most and bets that the answer uses the same ones ("flocking").
This measures the bet on the model the app serves (its weights dequantized to their grid, the reasoning adapter
on for the response), teacher-forced on GSM8K/MATH *train* solutions: the mean per-token KL(dense ‖ sparse) of
the response under neurons chosen
- `griffin`: from the prompt (what decoding does),
- `warm`: from the prompt plus the first W response tokens computed dense (a reselection after W tokens;
  the KL is taken over the tokens after them),
- `every{k}_d{decay}`: reselection during decoding, as `--ff-reselect K --ff-decay D` decodes: every k-th
  response token runs dense, its down-projection input is added to the scores (the earlier ones times D), and the next
  tokens run on the neurons chosen anew; the dense tokens count in the mean (their KL is 0, their cost is real),
- `oracle`: from the prompt and the whole response (a bound: it has seen the tokens it is scored on),
- `random`: at random,
at several kept shares. Results: bench/results/griffin_selection[_<model>].json (no suffix for the default model).
"""
from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn import functional as F

from bench.machine import cpu_name
from core.adapters import lora as adapters
from core.config import EngineConfig
from core.data.sft import encode_example, load_examples
from core.decode.cache import crop, new_cache
from core.sparse import ff as sparse_ff
from core.sparse.caprese_e2e import griffin_masks, kl_after, sparse_forward
from core.training.sparse_fit import trainable_model

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def _prefill(model, ids, cache, scorer=None, base=False):
    with torch.no_grad(), (scorer.collect(model) if scorer else nullcontext()), (
            adapters.base(model) if base else nullcontext()):
        model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)


def response_kl(model, prompt, response, masks, skip: int = 0) -> float:
    """Mean KL(dense ‖ masked sparse) over the response tokens after the first `skip` (those run dense)."""
    cache = new_cache(model.config, "bf16")
    _prefill(model, prompt, cache, base=True)
    if skip:
        _prefill(model, response[:skip], cache)
    no_branch = [torch.zeros(1, model.config.hidden_size) for _ in masks]
    with torch.no_grad():
        return kl_after(model, cache, response[skip:-1], no_branch, [b.t() for b in no_branch], masks).item()


def periodic_kl(model, keep, group, prompt, response, every: int, decay: float) -> float:
    """Mean KL(dense ‖ sparse) over the response when every `every`-th token runs dense and reselects (see the
    module docstring); the sparse tokens see the sparse run's own cache, as in decoding."""
    cache = new_cache(model.config, "bf16")
    scorer = sparse_ff.Scorer(keep, min_tokens=1)  # the dense steps are one token each
    _prefill(model, prompt, cache, scorer, base=True)
    tokens, start = response[:-1], cache.get_seq_length()
    with torch.no_grad():
        dense = F.log_softmax(model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True).logits[0].float(),
                              dim=-1)
    crop(cache, start)
    layers = model.config.num_hidden_layers
    no_branch = [torch.zeros(1, model.config.hidden_size) for _ in range(layers)]
    no_branch_t = [b.t() for b in no_branch]
    pieces, pos = [], 0
    with torch.no_grad():
        while pos < len(tokens):
            seg = tokens[pos: pos + every - 1]
            if seg:
                masks = griffin_masks(scorer, layers, group)
                with sparse_forward(model, no_branch, no_branch_t, masks):
                    pieces.append(model(input_ids=torch.tensor([seg]), cache=cache, use_cache=True).logits[0])
                pos += len(seg)
            if pos < len(tokens):  # the dense step: scored like a prompt token, the older scores decayed
                for i in scorer.sums:
                    scorer.sums[i] = scorer.sums[i] * decay
                with scorer.collect(model):
                    pieces.append(model(input_ids=torch.tensor([[tokens[pos]]]), cache=cache, use_cache=True).logits[0])
                pos += 1
    logits = torch.cat(pieces).float()
    return F.kl_div(F.log_softmax(logits, dim=-1), dense, log_target=True, reduction="batchmean").item()


def chosen(model, keep, group, prompt, response_part=None):
    """GRIFFIN's masks from the prompt (base model) and, when given, response tokens (adapter on) after it."""
    scorer = sparse_ff.Scorer(keep)
    cache = new_cache(model.config, "bf16")
    _prefill(model, prompt, cache, scorer, base=True)
    if response_part:
        _prefill(model, response_part, cache, scorer)
    return griffin_masks(scorer, model.config.num_hidden_layers, group)


def random_masks(model, keep, gen):
    size = model.config.intermediate_size
    n = sparse_ff.kept_count(size, keep)
    masks = []
    for _ in range(model.config.num_hidden_layers):
        m = torch.zeros(size)
        m[torch.randperm(size, generator=gen)[:n]] = 1
        masks.append(m)
    return masks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.griffin_selection", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=EngineConfig().model_id)
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--keep", type=float, nargs="+", default=[0.5, 0.75, 0.875])
    p.add_argument("--warm", type=int, default=32, help="dense response tokens before a reselection")
    p.add_argument("--every", type=int, nargs="*", default=[], help="reselection periods to measure")
    p.add_argument("--decay", type=float, nargs="+", default=[1.0], help="earlier scores' factors at a reselection")
    p.add_argument("--skip", nargs="*", default=[], choices=["griffin", "warm", "oracle", "random"],
                   help="selections not to measure")
    args = p.parse_args(argv)
    cfg = EngineConfig(model_id=args.model)
    model, tokenizer, group = trainable_model(args.model, cfg.precision)
    files = [DATA / "gsm8k" / "train.jsonl", DATA / "math" / "train.jsonl"]
    examples = load_examples(files, 1000, seed=0)[600:]  # past what `ponder train caprese` fits on by default
    encoded = [e for e in (encode_example(tokenizer, ex) for ex in examples) if len(e[1]) > 2 * args.warm]
    encoded = encoded[: args.sequences]
    gen = torch.Generator().manual_seed(0)
    rows = {}
    for keep in args.keep:
        periodic = [(k, d) for k in args.every for d in args.decay]
        kl = {k: [] for k in ["griffin", "warm", *(f"every{k}_d{d}" for k, d in periodic), "oracle", "random"]
              if k not in args.skip}
        for prompt, response in encoded:
            if "griffin" in kl:
                kl["griffin"].append(response_kl(model, prompt, response, chosen(model, keep, group, prompt)))
            if "warm" in kl:
                kl["warm"].append(response_kl(model, prompt, response,
                                              chosen(model, keep, group, prompt, response[: args.warm]), args.warm))
            for k, d in periodic:
                kl[f"every{k}_d{d}"].append(periodic_kl(model, keep, group, prompt, response, k, d))
            if "oracle" in kl:
                kl["oracle"].append(response_kl(model, prompt, response, chosen(model, keep, group, prompt, response)))
            if "random" in kl:
                kl["random"].append(response_kl(model, prompt, response, random_masks(model, keep, gen)))
        rows[str(keep)] = {k: sum(v) / len(v) for k, v in kl.items()}
        print(keep, json.dumps(rows[str(keep)]), flush=True)
    report = {"model": args.model, "precision": cfg.precision, "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "sequences": len(encoded), "response_tokens": sum(len(r) for _, r in encoded), "warm": args.warm,
              "mean_kl_dense_to_sparse": rows}
    suffix = "" if args.model == EngineConfig().model_id else f"_{args.model}"
    out = ROOT / "bench" / "results" / f"griffin_selection{suffix}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
