"""Fit a model's FPTQuant° transforms once and ship them: resources/fpt/<model id>/{fpt.safetensors,provenance.json}.

The transforms depend only on the base weights and the shipped calibration texts, so every machine would compute
the same spec; fitting it here once takes that pass off the user's first launch, which then only merges the spec
and runs GPTQ (core.loading.shipped_fpt_spec; the spec is used only for base weights whose source sha256 matches).

    python -m scripts.fit_fpt_spec --model qwen2.5-coder-0.5b-instruct
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

import torch

from bench.machine import cpu_name
from core.loading import CALIBRATION_FILE, calibration_batches, load_plain, set_threads, source_sha256
from core.storage.model_store import ModelStore
from core.storage.paths import resource_dir
from models.fpt_calibration import calibrate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="activations the statistics are collected in (float32: fast on every CPU)")
    args = p.parse_args(argv)
    installed = ModelStore().get(args.model)
    base = source_sha256(installed)
    if base is None:
        print(f"{installed.id} was not installed from a pinned file: nothing to pin a spec to", file=sys.stderr)
        return 2
    set_threads(None)
    start = time.perf_counter()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = load_plain(installed.hf_dir, dtype)
    spec = calibrate(model, calibration_batches(installed.hf_dir), group=args.group, rotate=False)
    seconds = time.perf_counter() - start
    folder = resource_dir() / "fpt" / installed.id
    folder.mkdir(parents=True, exist_ok=True)
    spec.save(folder)
    texts = (resource_dir() / "calibration" / CALIBRATION_FILE).read_bytes()
    provenance = {
        "model": installed.id, "base_sha256": base, "method": "grid-search calibration (models/fpt_calibration.py)",
        "rotation": False, "group_size": args.group, "activations": args.dtype,
        "calibration_texts_sha256": hashlib.sha256(texts).hexdigest(),
        "command": f"python -m scripts.fit_fpt_spec --model {installed.id} --group {args.group} --dtype {args.dtype}",
        "cpu": cpu_name(), "torch": torch.__version__, "seconds": round(seconds, 1),
        "date": time.strftime("%Y-%m-%d"),
    }
    (folder / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    print(json.dumps(provenance, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
