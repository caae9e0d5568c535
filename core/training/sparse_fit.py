"""`ponder train cats` and `ponder train caprese`: calibrate CATS thresholds and fit Caprese branches on a loaded
model, and save them as the model's components. The methods live in `core.sparse`; this module loads models
(`core.loading`) and runs them, so `core.sparse` never imports the loader."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from core.adapters import lora as adapters
from core.config import EngineConfig
from core.data.sft import encode_example, load_examples
from core.loading import _reasoning_cards, load_engine, load_model, load_tokenizer
from core.sparse.caprese import WEIGHTS_FILE, Branches, load, save, train
from core.sparse.caprese_e2e import train_e2e
from core.sparse.cats import calibrate
from core.sparse.cats import save as save_cats
from core.sparse.ff import SparsePlan
from core.storage.model_store import ModelStore
from core.storage.paths import resource_dir
from models.quantization import dequantized_copy


def train_cats(argv=None) -> int:
    """`ponder train cats`: calibrate the model's CATS thresholds and save them as its component."""


    data = resource_dir().parent.parent / "shared" / "data"
    p = argparse.ArgumentParser(prog="ponder train cats", description=train_cats.__doc__)
    p.add_argument("--data", nargs="+", type=Path,
                   default=[data / "gsm8k" / "train.jsonl", data / "math" / "train.jsonl"])
    p.add_argument("--examples", type=int, default=128, help="calibration sequences")
    p.add_argument("--sparsity", type=float, default=0.5, help="share of activations zeroed per layer")
    p.add_argument("--model", default=EngineConfig().model_id)
    p.add_argument("--precision", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="folder (default: the model's own cats component)")
    args = p.parse_args(argv)
    missing = [str(f) for f in args.data if not Path(f).is_file()]
    if missing:
        p.error(f"no such data file: {', '.join(missing)}")
    if not 0 < args.sparsity < 1:
        p.error("--sparsity must be between 0 and 1")
    t = time.perf_counter()
    engine = load_engine(EngineConfig(model_id=args.model, precision=args.precision), reasoning=True)
    examples = load_examples(args.data, args.examples, seed=args.seed + 1)
    thresholds = calibrate(engine, examples, args.sparsity, seed=args.seed)
    meta = {"sparsity": args.sparsity, "precision": engine.precision, "model": engine.model_id,
            "examples": len(examples), "data": [str(f) for f in args.data], "seconds": round(time.perf_counter() - t, 1)}
    out = save_cats(args.out or ModelStore().get(args.model).folder / "components" / "cats", thresholds, meta)
    print(json.dumps({**meta, "thresholds": [round(v, 4) for v in thresholds]}))
    print(f"Saved to {out}")
    return 0


def train_caprese(argv=None) -> int:
    """`ponder train caprese`: fit the model's Caprese branches and save them as its component."""


    data = resource_dir().parent.parent / "shared" / "data"
    p = argparse.ArgumentParser(prog="ponder train caprese", description=train_caprese.__doc__)
    p.add_argument("--data", nargs="+", type=Path,
                   default=[data / "gsm8k" / "train.jsonl", data / "math" / "train.jsonl"],
                   help="GSM8K / MATH / trace JSONL files (train splits: the sequences are teacher-forced)")
    p.add_argument("--examples", type=int, default=256, help="training sequences")
    p.add_argument("--dev", type=int, default=32, help="further sequences the fit is measured on")
    p.add_argument("--rank", type=int, default=128)
    p.add_argument("--sparse", choices=("griffin", "cats"), default="griffin", help="the sparsity to recover")
    p.add_argument("--keep", type=float, default=0.5, help="GRIFFIN's share of kept neurons the branches recover")
    p.add_argument("--model", default=EngineConfig().model_id)
    p.add_argument("--precision", default=None, help="weights (default: the model's, as the app serves it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="folder (default: the model's own caprese component)")
    p.add_argument("--stage", choices=("both", "layer-wise", "e2e"), default="both",
                   help="layer-wise fit, end-to-end training after it, or both (e2e alone starts from --out's)")
    p.add_argument("--e2e-steps", type=int, default=128, help="end-to-end training sequences (one per step)")
    p.add_argument("--e2e-dev", type=int, default=16, help="held-out sequences the end-to-end stage keeps its best on")
    p.add_argument("--lr", type=float, default=5e-5, help="end-to-end learning rate (AdamW)")
    args = p.parse_args(argv)
    missing = [str(f) for f in args.data if not Path(f).is_file()]
    if missing:
        p.error(f"no such data file: {', '.join(missing)}")
    engine = load_engine(EngineConfig(model_id=args.model, precision=args.precision), reasoning=True)
    if args.sparse == "cats" and engine.cats is None:
        p.error("this model has no CATS calibration: run `ponder train cats` first")
    plan = SparsePlan("griffin", keep=args.keep) if args.sparse == "griffin" else SparsePlan(
        "cats", thresholds=tuple(engine.cats["thresholds"]))
    if not 0 < args.rank <= engine.model.config.hidden_size:
        p.error(f"--rank must be between 1 and {engine.model.config.hidden_size}")
    folder = "caprese" if args.sparse == "griffin" else "caprese-cats"
    out = args.out or ModelStore().get(args.model).folder / "components" / folder
    what = f"GRIFFIN at {args.keep:.0%}" if args.sparse == "griffin" else "CATS"
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.stage == "e2e":
        if not (out / WEIGHTS_FILE).is_file():
            p.error(f"no branches in {out} to start from: run the layer-wise stage first")
    else:
        examples = load_examples(args.data, args.examples + args.dev, seed=args.seed)
        train_ex, dev_ex = examples[: args.examples], examples[args.examples:]
        print(f"Fitting rank-{args.rank} Caprese branches for {what} on {len(train_ex)} sequences "
              f"({len(dev_ex)} held out), {engine.model_id} at {engine.precision}", flush=True)
        branches, meta = train(engine, train_ex, dev_ex, rank=args.rank, plan=plan, report=log)
        meta["data"] = [str(f) for f in args.data]
        meta["seed"] = args.seed
        meta["commands"] = [_command(argv, "layer-wise")]
        save(branches, engine.model, out)
        print(json.dumps({k: v for k, v in meta.items() if k != "layers"}, indent=2))
        print(f"Saved the layer-wise branches to {out}", flush=True)
    if args.stage != "layer-wise" and args.e2e_steps > 0:
        model_id, precision = engine.model_id, engine.precision
        del engine  # the end-to-end stage differentiates through a dense copy instead
        _end_to_end(args, model_id, precision, plan, out, log, _command(argv, "e2e"))
    return 0


def _command(argv, stage: str) -> str:
    """The command line that runs `stage` again (recorded with the branches it made)."""
    words = list(sys.argv[1:] if argv is None else argv)
    if "--stage" in words:
        i = words.index("--stage")
        del words[i:i + 2]
    return " ".join(["ponder train caprese", *words, "--stage", stage])


def _end_to_end(args, model_id: str, precision: str, plan: SparsePlan, out: Path, log, command: str) -> Branches:
    """Train the branches saved in `out` end to end (core.sparse.caprese_e2e) on further sequences of the same files
    (after the layer-wise ones), and save the best over them."""

    model, tokenizer, group = trainable_model(model_id, precision)
    branches = load(out, model)  # in this model's basis
    examples = load_examples(args.data, args.examples + args.dev + args.e2e_steps + args.e2e_dev, seed=args.seed)
    rest = [encode_example(tokenizer, ex) for ex in examples[args.examples + args.dev:]]
    rest = [(prompt, response) for prompt, response in rest if 2 < len(response) <= 512]
    dev, train_set = rest[: args.e2e_dev], rest[args.e2e_dev:]
    print(f"Training the branches end to end: {args.e2e_steps} steps on {len(train_set)} further sequences, "
          f"{len(dev)} held out", flush=True)
    kept, stats = train_e2e(model, train_set, dev, branches, plan, steps=args.e2e_steps, lr=args.lr, group=group,
                            seed=args.seed, report=lambda entry: log(json.dumps(entry)))
    kept.meta["commands"] = branches.meta.get("commands", []) + [command]
    save(kept, model, out)
    print(json.dumps({k: v for k, v in stats.items() if k != "log"}, indent=2))
    print(f"Saved to {out}")
    return kept


def trainable_model(model_id: str, precision: str, store=None):
    """The served weights dequantized to their grid (dense bf16, frozen) with the model's reasoning adapter on:
    the model the end-to-end stage differentiates through. Returns (model, tokenizer, packed group or None)."""


    store = store or ModelStore()
    installed = store.get(model_id)
    cfg = EngineConfig(model_id=model_id, precision=precision)
    base = load_model(installed, cfg)
    group = cfg.group_size if precision.startswith("w4") else None  # GRIFFIN keeps whole chunks of int4 groups
    if precision.startswith("w"):
        base = dequantized_copy(base)
    cards = _reasoning_cards(installed, store, None, [])
    model = adapters.load_adapter(base, cards[0].folder) if cards else base
    model.requires_grad_(False)
    model.eval()
    return model, load_tokenizer(installed.hf_dir), group
