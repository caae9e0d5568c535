"""Masked LoRA SFT of an adapter (reasoning or skill): reading and encoding the training set, loading the base
with a trainable adapter, the loss, the learning-rate schedule, the optimizer loop and saving the adapter
(setup → fit → save). The `ponder train sft` run around it (run folder, checkpoints, evaluation, the library, the
command line) lives in core.training.sft.

Masked LoRA, two-pass form: each example's prompt is encoded by the base model with the adapter disabled
and no gradient (its KV cache is then exactly what inference will reuse); the response runs with the
adapter on that cache and is the only part with a loss. The base is the quantized model the app serves
(W4 by default), so the adapter is quantization-aware by construction (the paper's QAMR).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from core.adapters import lora as adapters
from core.config import EngineConfig, SftArgs
from core.data.sft import encode_example, encode_record, load_examples
from core.data.train import TrainRecord, split_held_out, validate_file
from core.decode.cache import new_cache
from core.events import TrainProgress
from core.loading import load_model, load_tokenizer, set_threads
from core.storage.model_store import ModelStore
from core.training.checkpoint import files_hash
from models.convert import AtomicDir
from models.quantization import dequantized_copy


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


@dataclass
class Prepared:
    """A loaded base with a trainable adapter and the encoded training set."""

    installed: object
    tokenizer: object
    model: torch.nn.Module
    train: list[tuple[list[int], list[int]]]
    held: list[TrainRecord] = field(default_factory=list)
    data_hash: str | None = None
    data_key: str = ""
    """What a checkpoint keeps of the data, to refuse a changed file on resume: `data_hash` (the checked records),
    or for data read without the check the files' bytes hash."""


def validated_records(args: SftArgs, tokenizer) -> tuple[list[TrainRecord], str]:
    """Every record of every file, refusing files with problems (the first few are named with their lines)."""
    reports = [validate_file(Path(p), tokenizer, kind=args.kind, max_tokens=args.max_tokens,
                             csv_columns=tuple(args.csv_columns) if args.csv_columns else None) for p in args.data]
    bad = [r for r in reports if not r.ok]
    if bad:
        raise ValueError(bad[0].summary())
    records = [rec for r in reports for rec in r.records]
    digest = reports[0].data_hash if len(reports) == 1 else hashlib.sha256(
        "".join(r.data_hash for r in reports).encode()).hexdigest()
    return records, digest


def uses_validated_data(args: SftArgs) -> bool:
    """Library/wizard runs read any checked format; the original `--out` reasoning runs read GSM8K/MATH rows."""
    return bool(args.name or args.preset) or args.kind == "skill"


def setup(args: SftArgs, store: ModelStore | None = None, check_data: Callable[[str], None] | None = None) -> Prepared:
    """Read the data and load the model with a new (or `init_adapter`'s) trainable adapter. `check_data(data_key)`
    runs once the data is read, before the model loads (a resume refuses changed data there)."""
    store = store or ModelStore()
    installed = store.get(args.model_id)
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(installed.hf_dir)
    held, digest = [], None
    if uses_validated_data(args):
        records, digest = validated_records(args, tokenizer)
        train, held = split_held_out(records, args.held_out, args.seed)
        encoded = [encode_record(tokenizer, rec, args.kind) for rec in train]
    else:
        examples = load_examples([Path(p) for p in args.data], args.examples, args.seed,
                                 max_chars=args.max_thinking_chars)
        encoded = [encode_example(tokenizer, ex) for ex in examples]
        encoded = [(p, r) for p, r in encoded if len(r) <= args.max_response_tokens]
    if not encoded:
        raise ValueError("no usable training examples (check the data files and --max-response-tokens)")
    data_key = digest if digest is not None else files_hash(args.data)
    if check_data is not None:
        check_data(data_key)
    base = load_model(installed, EngineConfig(model_id=args.model_id, precision=args.precision))
    if args.precision.startswith("w"):
        base = dequantized_copy(base)  # same function as the quantized base, dense kernels for backward
    if args.init_adapter:
        model = adapters.load_adapter(base, Path(args.init_adapter), trainable=True)
    else:
        model = adapters.attach_new(base, args.rank, args.alpha, args.dropout)
    return Prepared(installed, tokenizer, model, encoded, held, digest, data_key)


def new_optimizer(model, args: SftArgs) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)


def fit(model, encoded, args: SftArgs, report: Callable[[TrainProgress], None], should_stop=lambda: False, *,
        optim: torch.optim.Optimizer | None = None, start: int = 0, order: random.Random | None = None,
        on_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Optimizer steps `start`..`args.steps` (stopping early when `should_stop()` after a step); one log entry a
    step. `optim` and `order` (the data order's RNG) carry a resumed run's state."""
    params = [p for p in model.parameters() if p.requires_grad]
    optim = optim or new_optimizer(model, args)
    order = order or random.Random(args.seed)
    log, t0 = [], time.perf_counter()
    model.train()
    for step in range(start, args.steps):
        t_step = time.perf_counter()
        lr = lr_at(step, args.steps, args.lr, args.warmup_ratio)
        for group in optim.param_groups:
            group["lr"] = lr
        total, tokens = 0.0, 0
        for _ in range(args.grad_accum):
            prompt, response = encoded[order.randrange(len(encoded))]
            loss = masked_lora_loss(model, prompt, response) / args.grad_accum
            loss.backward()
            total += loss.item()
            tokens += len(prompt) + len(response)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        now = time.perf_counter()
        entry = {"step": step + 1, "loss": round(total, 4), "lr": lr, "elapsed_s": round(now - t0, 1),
                 "tokens": tokens, "step_s": round(now - t_step, 3)}
        log.append(entry)
        report(TrainProgress(step + 1, args.steps, total, lr, entry["elapsed_s"]))
        if on_step:
            on_step(entry)
        if should_stop():
            break
    model.eval()
    return log


def save(model, installed, args: SftArgs, log: list[dict], out: Path | None = None, data_hash: str | None = None) -> Path:
    out = Path(out or args.out)
    meta = {"kind": args.kind, "base_model": args.model_id, "base_precision": args.precision,
            "base_fingerprint": adapters.base_fingerprint(installed.hf_dir), "args": asdict(args),
            "data_hash": data_hash, "final_loss": log[-1]["loss"] if log else None, "steps_done": len(log),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with AtomicDir(out) as tmp:
        adapters.save_adapter(model, tmp, meta)
        (tmp / "train_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    return out


def train_sft(args: SftArgs, report: Callable[[TrainProgress], None] = lambda p: None,
              store: ModelStore | None = None, should_stop=lambda: False) -> Path:
    prep = setup(args, store)
    log = fit(prep.model, prep.train, args, report, should_stop)
    return save(prep.model, prep.installed, args, log, data_hash=prep.data_hash)

