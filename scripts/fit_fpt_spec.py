"""Fit a model's FPTQuant° transforms once and ship them: resources/fpt/<model id>/{fpt.safetensors,provenance.json}.

The transforms depend only on the base weights and the shipped calibration texts, so every machine would compute
the same spec; fitting it here once takes that pass off the user's first launch, which then only merges the spec
and runs GPTQ (core.loading.shipped_fpt_spec; the spec is used only for base weights whose source sha256 matches).

    python -m scripts.fit_fpt_spec --model qwen2.5-coder-0.5b-instruct
    python -m scripts.fit_fpt_spec --model qwen2.5-coder-0.5b-instruct --train --out DIR   # trained (A.7)
    python -m scripts.fit_fpt_spec --model qwen2.5-coder-0.5b-instruct --end-to-end --start DIR --out DIR2

`--train` starts from the grid search's spec and trains each layer's scales on the same texts
(models/fpt_training.py); it saves after every layer into --out and a rerun continues there. `--end-to-end`
then trains all layers' scales together against the float model's outputs (models/fpt_end_to_end.py);
`--extra-texts N` adds GSM8K and MATH train texts to its rows (the shipped texts alone overfit it on the 1.5B).
`--on-held-text` trains it on `bench.fpt_ablation`'s held text itself instead, scored on the positions the ablation
scores (the replies' tokens; each held row whole in one row of --length; values unrounded, as a bf16 cache keeps
them; the LM head stays float, as in every run of this stage, and one row in eight is held out): a measured bound on
what these scales can reach there (never shipped; --out must lie outside resources/).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

from bench.machine import cpu_name
from core.loading import CALIBRATION_FILE, calibration_batches, load_plain, set_threads, shipped_fpt_spec, source_sha256
from core.storage.model_store import ModelStore
from core.storage.paths import resource_dir
from models.fpt_calibration import calibrate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="activations the statistics are collected in (float32: fast on every CPU)")
    p.add_argument("--train", action="store_true", help="train the scales layer by layer (models/fpt_training.py)")
    p.add_argument("--end-to-end", action="store_true",
                   help="train every layer's scales together against the float model's outputs "
                        "(models/fpt_end_to_end.py), from --start; --steps are then optimizer steps of --batch rows")
    p.add_argument("--batch", type=int, default=2, help="--end-to-end: rows of --length tokens a step")
    p.add_argument("--extra-texts", type=int, default=0, metavar="N",
                   help="--end-to-end: also train on N GSM8K and N MATH train problems with their solutions (rows "
                        f"{EXTRA_ROW} on, no other stage's), beside the shipped calibration texts")
    p.add_argument("--on-held-text", action="store_true",
                   help="--end-to-end: train on the ablation's held text (bench.quant.held_rows) and nothing else, "
                        "to bound what the transforms can reach there; the spec is a measurement, never shipped")
    p.add_argument("--start", default="grid",
                   help="--train's starting point: grid (the grid search's spec, the shipped one if present), "
                        "identity (none), or a folder holding a spec, e.g. a shorter run's, to train further")
    p.add_argument("--steps", type=int, default=60, help="--train: Adam steps per layer")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--length", type=int, default=256,
                   help="tokens per training row (--on-held-text: at least the longest held row's, 547 on Qwen2.5)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for the spec (default: resources/fpt/<model>; required with --train: a trained spec "
                        "is shipped by copying its fpt.safetensors and provenance.json there once it measures better)")
    args = p.parse_args(argv)
    if (args.train or args.end_to_end) and (args.out is None or args.group != 128):
        p.error("--train and --end-to-end need --out DIR and group 128")
    if args.train and args.end_to_end:
        p.error("--train and --end-to-end are separate runs: train layer by layer first, then --start its --out")
    if args.on_held_text and (not args.end_to_end or args.extra_texts
                              or args.out.resolve().is_relative_to(resource_dir())):
        p.error("--on-held-text is an --end-to-end bound on the held text alone, saved outside resources/")
    installed = ModelStore().get(args.model)
    base = source_sha256(installed)
    if base is None:
        print(f"{installed.id} was not installed from a pinned file: nothing to pin a spec to", file=sys.stderr)
        return 2
    set_threads(None)
    start = time.perf_counter()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = load_plain(installed.hf_dir, dtype)
    folder = args.out or resource_dir() / "fpt" / installed.id
    batches = calibration_batches(installed.hf_dir)
    method = "grid-search calibration (models/fpt_calibration.py)"
    extra = {}
    if args.train:
        from models.fpt_training import train_transforms

        init = None
        if not (folder / "training" / "log.json").is_file():  # resuming: the state has it
            init = start_spec(p, args.start, installed, model, batches)
        spec, log = train_transforms(model, batches, init, length=args.length, steps=args.steps, lr=args.lr,
                                     state=folder / "training", report=lambda r: print(json.dumps(r), flush=True))
        method = (f"trained layer by layer from the {args.start} spec (models/fpt_training.py): output MSE of each "
                  "layer (int4 weights, int8 values) against the float layer, straight-through rounding")
        extra = {"start": args.start, "steps_per_layer": args.steps, "lr": args.lr, "row_tokens": args.length,
                 "layers_kept": sum(r["kept"] for r in log), "layer_seconds": round(sum(r["seconds"] for r in log), 1),
                 "held_loss": [[round(r["held_loss_start"], 6), round(r["held_loss_trained"], 6)] for r in log]}
    elif args.end_to_end:
        from models.fpt_end_to_end import train_end_to_end

        init = start_spec(p, args.start, installed, model, batches)
        extra, texts = extra_batches(installed.hf_dir, args.extra_texts)
        rows = None
        if args.on_held_text:
            eos = model.config.eos_token_id
            rows, texts = held_text_rows(installed.hf_dir, args.length, eos if isinstance(eos, int) else 0), HELD_TEXT
        spec, log = train_end_to_end(model, batches + extra, init, length=args.length, steps=args.steps,
                                     batch=args.batch, lr=args.lr, state=folder / "end_to_end",
                                     report=lambda r: print(json.dumps(r), flush=True), texts=texts, rows=rows,
                                     kv8=not args.on_held_text)
        values = "unrounded values, the replies' positions only" if args.on_held_text else "int8 values"
        method = (f"trained end to end from the {args.start} spec (models/fpt_end_to_end.py): KL of the quantized "
                  f"model (int4 weights, {values}) to the float model, straight-through rounding")
        extra = {"start": args.start, "steps": args.steps, "batch_rows": args.batch, "lr": args.lr, "texts": texts,
                 "row_tokens": args.length, "kept": log["kept"], "held_kl": [round(log["held_kl_start"], 6),
                                                                             round(log["held_kl_trained"], 6)],
                 "train_seconds": log["seconds"]}
    else:
        spec = calibrate(model, batches, group=args.group, rotate=False)
    seconds = time.perf_counter() - start
    folder.mkdir(parents=True, exist_ok=True)
    spec.save(folder)
    texts = (resource_dir() / "calibration" / CALIBRATION_FILE).read_bytes()
    provenance = {
        "model": installed.id, "base_sha256": base, "method": method, **extra,
        "rotation": False, "group_size": args.group,
        "activations": "float32" if args.train or args.end_to_end else args.dtype,
        "calibration_texts_sha256": hashlib.sha256(texts).hexdigest(),
        "command": "python -m scripts.fit_fpt_spec " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_name(), "torch": torch.__version__, "seconds": round(seconds, 1),
        "date": time.strftime("%Y-%m-%d"),
    }
    (folder / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    print(json.dumps(provenance, indent=2))
    return 0


EXTRA_ROW = 5000
"""First GSM8K/MATH train row of `--extra-texts` (no calibration, held text, dev split, trace or head used them)."""


def extra_batches(hf_dir: Path, n: int) -> tuple[list[torch.Tensor], str]:
    """Token ids of n GSM8K and n MATH train problems with their solutions from row EXTRA_ROW on, cut as the
    shipped calibration texts are, and a name for them ("shipped" when n is 0)."""
    if n <= 0:
        return [], "shipped"
    from core.loading import CALIBRATION_TOKENS, load_tokenizer

    tokenizer, data, texts = load_tokenizer(hf_dir), Path(__file__).resolve().parents[2] / "shared" / "data", []
    for name, question, solution in (("gsm8k", "question", "answer"), ("math", "problem", "solution")):
        lines = (data / name / "train.jsonl").read_text().splitlines()[EXTRA_ROW:EXTRA_ROW + n]
        texts += [f"{row[question]}\n{row[solution]}" for row in map(json.loads, lines)]
    batches = [torch.tensor(tokenizer(t)["input_ids"][:CALIBRATION_TOKENS]) for t in texts]
    return batches, f"shipped + GSM8K and MATH train rows {EXTRA_ROW}-{EXTRA_ROW + n - 1}"


HELD_TEXT = "the ablation's held text (bench.quant.held_rows), as a bound"


def held_text_rows(hf_dir: Path, length: int, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ablation's held text (bench.quant.held_rows) as rows of `length` tokens, each held row whole in one
    (longest first, into the first row with room; end-of-text tokens pad), and the weight of each position's
    prediction: 1 where the ablation scores it (a reply's tokens), else 0. Unlike the ablation's, a held row packed
    after others has them in its context."""
    from bench.quant import held_rows
    from core.loading import load_tokenizer

    held = sorted(held_rows(load_tokenizer(hf_dir)), key=lambda r: -len(r[0]))
    if len(held[0][0]) > length:
        raise SystemExit(f"--on-held-text: the longest held row has {len(held[0][0])} tokens; use --length >= that")
    rows, weights, used = [], [], []
    for ids, start in held:
        i = next((i for i, n in enumerate(used) if n + len(ids) <= length), len(rows))
        if i == len(rows):
            rows.append(torch.full((length,), eos))
            weights.append(torch.zeros(length))
            used.append(0)
        at = used[i]
        rows[i][at:at + len(ids)] = torch.tensor(ids)
        weights[i][at + start:at + len(ids) - 1] = 1.0  # position p predicts token p + 1: the reply's tokens
        used[i] += len(ids)
    return torch.stack(rows), torch.stack(weights)


def start_spec(p, start: str, installed, model, batches):
    """The spec a training run starts from: grid, identity (None) or the spec in folder `start`."""
    from models.fpt import FptSpec

    if start == "grid":
        return grid_spec(installed) or calibrate(model, batches, group=128, rotate=False)
    if start == "identity":
        return FptSpec.identity(model.config)
    spec = FptSpec.load(Path(start))
    if spec is None:
        p.error(f"--start {start}: no spec there (fpt.safetensors)")
    return spec


def grid_spec(installed):
    """The shipped spec when it is the grid search's (sha-checked), else None."""
    try:
        made = json.loads((resource_dir() / "fpt" / installed.id / "provenance.json").read_text())["method"]
    except (OSError, ValueError, KeyError):
        return None
    return shipped_fpt_spec(installed) if made.startswith("grid") else None


if __name__ == "__main__":
    raise SystemExit(main())
