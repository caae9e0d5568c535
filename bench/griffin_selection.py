"""`python -m bench.griffin_selection`: how well a prompt predicts the feed-forward neurons its answer needs.

GRIFFIN keeps the neurons the prompt's tokens use most and bets that the answer uses the same ones ("flocking").
This measures the bet on the model the app serves (its weights dequantized to their grid, the reasoning adapter
on for the response), teacher-forced on GSM8K/MATH *train* solutions: the mean per-token KL(dense ‖ sparse) of
the response under neurons chosen
- `griffin`: from the prompt (what decoding does),
- `warm`: from the prompt plus the first W response tokens computed dense (a reselection after W tokens;
  the KL is taken over the tokens after them),
- `oracle`: from the prompt and the whole response (a bound: it has seen the tokens it is scored on),
- `random`: at random,
at several kept shares. Results: bench/results/griffin_selection.json.
"""
from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from bench.machine import cpu_name
from core.adapters import lora as adapters
from core.config import EngineConfig
from core.data.sft import encode_example, load_examples
from core.decode.cache import new_cache
from core.sparse import ff as sparse_ff
from core.sparse.caprese_e2e import griffin_masks, kl_after
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
        kl = {"griffin": [], "warm": [], "oracle": [], "random": []}
        for prompt, response in encoded:
            kl["griffin"].append(response_kl(model, prompt, response, chosen(model, keep, group, prompt)))
            kl["warm"].append(response_kl(model, prompt, response,
                                          chosen(model, keep, group, prompt, response[: args.warm]), args.warm))
            kl["oracle"].append(response_kl(model, prompt, response, chosen(model, keep, group, prompt, response)))
            kl["random"].append(response_kl(model, prompt, response, random_masks(model, keep, gen)))
        rows[str(keep)] = {k: sum(v) / len(v) for k, v in kl.items()}
        print(keep, json.dumps(rows[str(keep)]), flush=True)
    report = {"model": args.model, "precision": cfg.precision, "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "sequences": len(encoded), "response_tokens": sum(len(r) for _, r in encoded), "warm": args.warm,
              "mean_kl_dense_to_sparse": rows}
    out = ROOT / "bench" / "results" / "griffin_selection.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
