"""Reasoning-adapter SFT recipe: setup → fit → save. Also runs headless: `python -m core.training --help`.

Masked LoRA, two-pass form: each example's prompt is encoded by the base model with the adapter disabled
and no gradient (its KV cache is then exactly what inference will reuse); the response runs with the
adapter on that cache and is the only part with a loss. The base is the quantized model the app serves
(W4 by default), so the adapter is quantization-aware by construction (the paper's QAMR).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from models.convert import AtomicDir
from models.quantization import dequantized_copy

from . import adapters
from .cache import new_cache
from .config import EngineConfig, SftArgs
from .events import TrainProgress
from .loading import load_model, load_tokenizer, set_threads
from .model_store import ModelStore
from .sft_data import encode_example, load_examples


def masked_lora_loss(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Mean next-token loss on the response; the prompt runs base-only without gradient."""
    cache = new_cache(model.config, "bf16")
    with torch.no_grad(), adapters.base(model):
        model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1)
    inputs = torch.tensor([response[:-1]])
    labels = torch.tensor(response[1:])
    logits = model(input_ids=inputs, cache=cache, use_cache=True).logits[0].float()  # (T, V)
    return torch.nn.functional.cross_entropy(logits, labels)


def lr_at(step: int, total: int, peak: float, warmup_ratio: float) -> float:
    warm = max(1, int(total * warmup_ratio))
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def setup(args: SftArgs, store: ModelStore | None = None):
    store = store or ModelStore()
    installed = store.get(args.model_id)
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(installed.hf_dir)
    base = load_model(installed, EngineConfig(model_id=args.model_id, precision=args.precision))
    if args.precision in ("w4", "w8"):
        base = dequantized_copy(base)  # same function as the quantized base, dense kernels for backward
    if args.init_adapter:
        model = adapters.load_adapter(base, Path(args.init_adapter), trainable=True)
    else:
        model = adapters.attach_new(base, args.rank, args.alpha, args.dropout)
    examples = load_examples([Path(p) for p in args.data], args.examples, args.seed)
    encoded = [encode_example(tokenizer, ex) for ex in examples]
    encoded = [(p, r) for p, r in encoded if len(r) <= args.max_response_tokens]
    if not encoded:
        raise ValueError("no usable training examples (check the data files and --max-response-tokens)")
    return installed, model, encoded


def fit(model, encoded, args: SftArgs, report: Callable[[TrainProgress], None], should_stop=lambda: False) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    order = random.Random(args.seed)
    log, start = [], time.perf_counter()
    model.train()
    for step in range(args.steps):
        lr = lr_at(step, args.steps, args.lr, args.warmup_ratio)
        for group in optim.param_groups:
            group["lr"] = lr
        total = 0.0
        for _ in range(args.grad_accum):
            prompt, response = encoded[order.randrange(len(encoded))]
            loss = masked_lora_loss(model, prompt, response) / args.grad_accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        entry = {"step": step + 1, "loss": round(total, 4), "lr": lr, "elapsed_s": round(time.perf_counter() - start, 1)}
        log.append(entry)
        report(TrainProgress(step + 1, args.steps, total, lr, entry["elapsed_s"]))
        if should_stop():
            break
    model.eval()
    return log


def save(model, installed, args: SftArgs, log: list[dict]) -> Path:
    out = Path(args.out)
    meta = {"kind": "reasoning", "base_model": args.model_id, "base_precision": args.precision,
            "base_fingerprint": adapters.base_fingerprint(installed.hf_dir), "args": asdict(args),
            "final_loss": log[-1]["loss"] if log else None, "steps_done": len(log),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with AtomicDir(out) as tmp:
        adapters.save_adapter(model, tmp, meta)
        (tmp / "train_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    return out


def train_sft(args: SftArgs, report: Callable[[TrainProgress], None] = lambda p: None,
              store: ModelStore | None = None, should_stop=lambda: False) -> Path:
    installed, model, encoded = setup(args, store)
    log = fit(model, encoded, args, report, should_stop)
    return save(model, installed, args, log)


def parse_args(argv=None) -> SftArgs:
    p = argparse.ArgumentParser(prog="ponder train sft", description="Train a reasoning LoRA adapter (masked, two-pass).")
    p.add_argument("--data", action="append", required=True, help="GSM8K/MATH-format JSONL (repeatable)")
    p.add_argument("--out", required=True, help="output adapter folder")
    defaults = SftArgs(data=("x",))
    for name in ("model_id", "precision", "examples", "steps", "grad_accum", "rank", "alpha", "lr",
                 "max_response_tokens", "seed", "threads"):
        value = getattr(defaults, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else int, default=value)
    p.add_argument("--init-adapter", default=None, help="continue training this adapter folder")
    a = p.parse_args(argv)
    return SftArgs(**{**vars(a), "data": tuple(a.data)})


def main(argv=None) -> int:
    import signal
    import threading

    args = parse_args(argv)
    stop = threading.Event()

    def on_signal(signum, frame):  # Ctrl+C / SIGTERM: finish the step, save what was learned, exit
        print("stopping after this step; the adapter trained so far will be saved", flush=True)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    def report(pr: TrainProgress) -> None:
        print(f"step {pr.step}/{pr.total_steps} loss {pr.loss:.4f} lr {pr.lr:.2e} {pr.elapsed_s:.0f}s", flush=True)

    out = train_sft(args, report, should_stop=stop.is_set)
    print(f"saved adapter to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
