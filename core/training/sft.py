"""`ponder train sft`: the run around core.training.masked_sft's setup → fit → save — presets, the run folder
with resumable checkpoints, STOP file / signals, JSON progress events, the `--estimate` timing, the evaluation
before/after and the adapter library — and its command line, including what a resume must share with the run
it continues. Also runs headless: `python -m core.training.sft --help`.
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict
from pathlib import Path

from core.config import SFT_PRESETS, SftArgs
from core.storage.model_store import ModelStore
from core.storage.paths import data_dir
from core.training.checkpoint import (
    CannotResume,
    RunDir,
    check_data_present,
    check_resume_data,
    load_checkpoint,
    read_state,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from core.training.masked_sft import Prepared, fit, new_optimizer, save, setup

PRESETS = SFT_PRESETS


def recipe_of(args: SftArgs) -> dict:
    keys = ("preset", "kind", "precision", "steps", "grad_accum", "rank", "alpha", "lr", "max_tokens", "held_out",
            "seed")
    return {k: getattr(args, k) for k in keys}


ESTIMATE_STEPS = 3
"""Steps an estimate trains: the first (kernel warm-up, first allocations) is run but not counted."""


def estimate_step_seconds(prep: Prepared, args: SftArgs, optim, order, on_step) -> float:
    """Seconds an average step of this run takes: a few real steps, the first left out (it costs several times a
    later one), as seconds per token times the data's mean example length — two random examples say little."""
    timed = []

    def record(entry: dict) -> None:
        timed.append(entry)
        on_step(entry)

    fit(prep.model, prep.train, args, lambda p: None, lambda: len(timed) >= ESTIMATE_STEPS, optim=optim, order=order,
        on_step=record)
    later = timed[1:] or timed
    per_token = sum(e["step_s"] for e in later) / max(1, sum(e["tokens"] for e in later))
    mean_tokens = sum(len(p) + len(r) for p, r in prep.train) / len(prep.train)
    return per_token * mean_tokens * args.grad_accum


def run(args: SftArgs, rd: RunDir, *, store: ModelStore | None = None, resume: bool = False,
        estimate: bool = False) -> Path | None:
    """One run with events, checkpoints and stop requests: train (or resume), evaluate, save. Returns the saved
    adapter folder; None when stopped (resumable) or after an estimate."""
    saved = None
    if resume and rd.has_checkpoint():  # the data must be what the checkpoint was trained on
        check_data_present(args.data)
        saved = read_state(rd.checkpoint)
    prep = setup(args, store, None if saved is None else
                 lambda key: check_resume_data(saved.get("data_hash"), key, args.data))
    total = args.steps
    rd.emit({"event": "loaded", "examples": len(prep.train), "held_out": len(prep.held), "total_steps": total},
            f"{len(prep.train)} training examples, {len(prep.held)} held out, {total} steps")
    optim, order = new_optimizer(prep.model, args), random.Random(args.seed)
    start, elapsed0, log = 0, 0.0, []
    if saved is not None:
        state = load_checkpoint(rd.checkpoint, prep.model, optim)
        restore_rng(state["rng"], order)
        start, elapsed0, log = state["step"], state["elapsed_s"], state["log"]
    done = {"tokens": 0, "steps": 0, "spent": 0.0}  # this session's steps

    def checkpoint(step: int) -> None:
        save_checkpoint(rd.checkpoint, prep.model, optim, {"step": step, "elapsed_s": elapsed0 + done["spent"],
                                                           "rng": rng_state(order), "log": log, "args": asdict(args),
                                                           "data_hash": prep.data_key, "model_id": args.model_id,
                                                           "recipe": recipe_of(args)})
        rd.emit({"event": "checkpoint", "step": step, "path": str(rd.checkpoint)})

    def on_step(entry: dict) -> None:
        log.append(entry)
        done["tokens"] += entry["tokens"]
        done["steps"] += 1
        done["spent"] += entry["step_s"]
        spent = done["spent"]
        rd.emit({"event": "progress", "step": entry["step"], "total": total, "loss": entry["loss"], "lr": entry["lr"],
                 "tokens_per_s": round(done["tokens"] / max(spent, 1e-9), 1), "elapsed_s": round(elapsed0 + spent, 1),
                 "eta_s": round((total - entry["step"]) * spent / done["steps"], 1)},
                f"step {entry['step']}/{total} loss {entry['loss']:.4f} lr {entry['lr']:.2e} "
                f"eta {(total - entry['step']) * spent / done['steps']:.0f}s")
        if not estimate and entry["step"] < total and entry["step"] % args.checkpoint_every == 0:
            checkpoint(entry["step"])

    if estimate:
        per_step = estimate_step_seconds(prep, args, optim, order, on_step)
        rd.emit({"event": "estimate", "seconds_per_step": round(per_step, 2), "total_s": round(per_step * total, 1)},
                f"{per_step:.1f} s a step: about {per_step * total / 60:.1f} minutes for {total} steps")
        return None
    fit(prep.model, prep.train, args, lambda p: None, rd.should_stop, optim=optim, start=start, order=order,
        on_step=on_step)
    step = log[-1]["step"] if log else 0
    if step > start or not rd.has_checkpoint():
        checkpoint(step)
    if step < total or rd.should_stop():
        rd.emit({"event": "stopped", "step": step, "resumable": True}, f"stopped after step {step}; resume with --resume")
        return None
    return finish(args, rd, prep, log)


def finish(args: SftArgs, rd: RunDir, prep: Prepared, log: list[dict]) -> Path | None:
    """Evaluate before/after on the held-out records, then save to the library (`--name`) or to `--out`.
    None when a stop was asked for during the evaluation."""
    from core.evaluation.adapters import evaluate_adapter

    if args.name:
        result = evaluate_adapter(prep.model, prep.tokenizer, prep.held, args.kind, max_new_tokens=args.eval_tokens,
                                  limit=args.eval_examples, should_stop=rd.should_stop)
        if rd.should_stop():  # cancelled while evaluating: the trained checkpoint stays, nothing is saved
            step = log[-1]["step"] if log else 0
            rd.emit({"event": "stopped", "step": step, "resumable": True}, f"stopped after step {step}")
            return None
        rd.emit({"event": "eval", **result}, f"before: {result['before']}  after: {result['after']}")
        metrics = {"final_loss": log[-1]["loss"] if log else None, "eval_examples": result["examples"],
                   "before": result["before"], "after": result["after"]}
        folder = save(prep.model, prep.installed, args, log, rd.path / "adapter", prep.data_hash)
        from core.adapters.library import AdapterLibrary

        card = AdapterLibrary().add_from_folder(folder, args.model_id, args.name, kind=args.kind,
                                                data_hash=prep.data_hash, recipe=recipe_of(args), metrics=metrics)
        out = Path(card.folder)
    else:
        out = save(prep.model, prep.installed, args, log, data_hash=prep.data_hash)
    rd.emit({"event": "saved", "name": args.name, "folder": str(out)}, f"saved adapter to {out}")
    return out


FLAGS = ("model_id", "precision", "examples", "steps", "grad_accum", "rank", "alpha", "dropout", "lr", "warmup_ratio",
         "max_response_tokens", "max_thinking_chars", "max_tokens", "held_out", "eval_examples", "eval_tokens",
         "checkpoint_every", "seed", "threads")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ponder train sft", description=(
        "Train a LoRA adapter by masked SFT (two-pass). With --name it is evaluated on the held-out records and "
        "saved into the adapter library; with --out it is saved to a folder."))
    p.add_argument("--data", action="append", help="training file, JSONL or CSV (repeatable)")
    p.add_argument("--out", default="", help="output adapter folder")
    p.add_argument("--name", default="", help="save into the adapter library under this name")
    p.add_argument("--kind", choices=("skill", "reasoning"), default=None,
                   help="default: skill with --name, reasoning with --out")
    p.add_argument("--preset", choices=tuple(SFT_PRESETS), default="", help="recipe defaults (explicit flags win)")
    p.add_argument("--columns", default=None, help="CSV columns PROMPT,RESPONSE (default prompt,response)")
    p.add_argument("--init-adapter", default=None, help="continue training this adapter folder")
    p.add_argument("--run-dir", default=None, help="checkpoints and logs (default: <data dir>/training/<name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir (or of --name)")
    p.add_argument("--json-progress", action="store_true", help="one JSON event per stdout line")
    p.add_argument("--estimate", action="store_true", help="time a few real steps, print the estimate, save nothing")
    defaults = SftArgs(data=("x",))
    for name in FLAGS:
        value = getattr(defaults, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else int, default=None)
    return p


def args_from_cli(a: argparse.Namespace) -> SftArgs:
    """Defaults, then the preset, then the flags given."""
    if not a.data:
        raise ValueError("give the training data with --data FILE")
    if not (a.out or a.name or a.estimate):
        raise ValueError("say where the adapter goes: --name NAME (the library) or --out FOLDER")
    values = dict(SFT_PRESETS.get(a.preset, {}))
    values.update({k: getattr(a, k) for k in FLAGS if getattr(a, k) is not None})
    columns = tuple(c.strip() for c in a.columns.split(",")) if a.columns else None
    if columns is not None and len(columns) != 2:
        raise ValueError("--columns takes two names: PROMPT,RESPONSE")
    if a.name:  # a bad name is said now, not after the training
        from core.adapters.cards import validate_adapter_name

        validate_adapter_name(a.name)
    kind = a.kind or ("skill" if a.name else "reasoning")
    return SftArgs(data=tuple(a.data), out=a.out, name=a.name, kind=kind, preset=a.preset, csv_columns=columns,
                   init_adapter=a.init_adapter, **values)


def args_from_json(saved: dict) -> SftArgs:
    saved = dict(saved, data=tuple(saved["data"]))
    if saved.get("csv_columns"):
        saved["csv_columns"] = tuple(saved["csv_columns"])
    return SftArgs(**saved)


RESUME_FIELDS = {
    "model": ("model_id", "precision"),
    "data file": ("data", "csv_columns"),
    "kind": ("kind",),
    "recipe": ("preset", "steps", "grad_accum", "rank", "alpha", "dropout", "lr", "warmup_ratio", "max_tokens",
               "held_out", "seed", "examples", "max_response_tokens", "max_thinking_chars", "init_adapter"),
    "destination": ("name", "out"),
}
"""What a resumed run must share with the command that asks for it (checkpoint spacing, evaluation size and
threads may differ), by the word a message uses for it."""


def _same(key: str, a, b) -> bool:
    if key == "data":
        return [str(Path(p).absolute()) for p in a] == [str(Path(p).absolute()) for p in b]
    return a == b


def said(words: list[str]) -> str:
    """'model', 'model and recipe', 'model, data file and recipe'."""
    return " and ".join(filter(None, (", ".join(words[:-1]), words[-1]))) if words else ""


def differences(saved: SftArgs, wanted: SftArgs) -> list[str]:
    """What of RESUME_FIELDS differs between a saved run and the one asked for ([] when resuming fits)."""
    return [label for label, keys in RESUME_FIELDS.items()
            if not all(_same(k, getattr(saved, k), getattr(wanted, k)) for k in keys)]


def saved_run_differences(run_dir: Path, argv: list[str]) -> list[str]:
    """What the run saved in `run_dir` differs in from the `[train sft] ...` command line `argv` would start
    ([] when `--resume` would train what `argv` asks for; ["settings"] when either cannot be read)."""
    argv = [x for x in argv if x != "--resume"]
    argv = argv[2:] if argv[:2] == ["train", "sft"] else argv
    try:
        wanted = args_from_cli(build_parser().parse_args(argv))
        saved = args_from_json(json.loads((Path(run_dir) / "args.json").read_text()))
    except (OSError, ValueError, TypeError, KeyError, SystemExit):
        return ["settings"]
    return differences(saved, wanted)


def run_dir_for(a: argparse.Namespace) -> Path:
    if a.run_dir:
        return Path(a.run_dir)
    label = a.name or (Path(a.out).name if a.out else "estimate")
    return data_dir() / "training" / label


def main(argv=None, store: ModelStore | None = None) -> int:
    a = build_parser().parse_args(argv)
    rd = RunDir(run_dir_for(a), json_progress=a.json_progress)
    try:
        if a.resume:
            args = args_from_json(rd.read_args())
            if a.data and (a.name or a.out):  # the command says what it wants trained: it must be the saved run
                differ = differences(args, args_from_cli(a))
                if differ:
                    raise CannotResume(f"the run in {rd.path} was started with another {said(differ)}: "
                                       "start it again (without --resume)")
        else:
            args = args_from_cli(a)
            if not a.estimate:
                rd.start_fresh(asdict(args))
        rd.stop_on_signals()
        run(args, rd, store=store, resume=a.resume, estimate=a.estimate)
    except Exception as err:
        return rd.fail(err)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
