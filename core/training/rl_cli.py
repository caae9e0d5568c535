"""`ponder train rl`: the command line of budget-forcing RL (core.training.rl), its flags, and resuming a run's
saved arguments."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import asdict, fields, replace
from pathlib import Path

from core.storage.model_store import ModelStore
from core.storage.paths import data_dir
from core.training.checkpoint import RunDir
from core.training.rl import LENGTHS, RlArgs, run
from models.quantization import PRECISIONS

FLAGS = ("margin", "group", "questions", "steps", "lr", "warmup_ratio", "kl", "clip", "updates", "tis_cap", "temperature",
         "answer_tokens",
         "model_id", "precision", "checkpoint_every", "seed")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ponder train rl", description=(
        "Budget-forcing RL (GRPO with the soft-barrier length reward) of a reasoning adapter."))
    p.add_argument("--data", action="append", help="GSM8K/MATH/trace JSONL (repeatable)")
    p.add_argument("--adapter", default=None, help="starting adapter: folder or library name (default: the model's)")
    p.add_argument("--budgets", default="128,256,512", help="comma-separated thinking budgets")
    defaults = RlArgs(data=("x",))
    for name in FLAGS:
        value = getattr(defaults, name)
        if name == "precision":  # the model's own default, resolved once --model-id is known
            p.add_argument("--precision", choices=PRECISIONS, default=None)
            continue
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    p.add_argument("--length", choices=LENGTHS, default="total", help="what the barrier measures")
    p.add_argument("--compute", choices=("fp32", "bf16"), default="fp32", help="dtype of rollouts and updates")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--name", default=None, help="save into the adapter library under this name")
    p.add_argument("--run-dir", default=None, help="checkpoints and logs (default: <data dir>/training/<name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir (or of --name); with "
                   "--steps N it runs to N steps instead (N at or below the saved step: save the adapter now)")
    p.add_argument("--json-progress", action="store_true", help="one JSON event per stdout line")
    return p


def args_from_cli(a: argparse.Namespace) -> RlArgs:
    if not a.data:
        raise ValueError("give the questions with --data FILE")
    try:
        budgets = tuple(int(b) for b in a.budgets.split(",") if b.strip())
    except ValueError as err:
        raise ValueError("--budgets takes comma-separated integers, e.g. 128,256,512") from err
    values = {k: getattr(a, k) for k in (*FLAGS, "adapter", "length", "compute", "threads", "name", "run_dir")}
    return RlArgs(data=tuple(a.data), budgets=budgets, **values)


def args_from_json(saved: dict) -> RlArgs:
    saved = {"tis_cap": 0.0, **saved}  # runs begun before importance sampling resume without it
    saved = {f.name: saved[f.name] for f in fields(RlArgs) if f.name in saved}
    return RlArgs(**{**saved, "data": tuple(saved["data"]), "budgets": tuple(saved["budgets"])})


def main(argv=None, store: ModelStore | None = None) -> int:
    a = build_parser().parse_args(argv)
    rd = RunDir(Path(a.run_dir) if a.run_dir else data_dir() / "training" / (a.name or "rl"),
                json_progress=a.json_progress)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if a.resume:
            args = args_from_json(rd.read_args())
            given = sys.argv[1:] if argv is None else argv
            if a.steps != args.steps and any(x == "--steps" or x.startswith("--steps=") for x in given):
                args = replace(args, steps=a.steps)  # train longer, or end now and save what was learned
                rd.write_args(asdict(args))
        else:
            args = args_from_cli(a)
            rd.start_fresh(asdict(args))
        rd.stop_on_signals()
        run(args, rd, store=store, resume=a.resume)
    except Exception as err:
        return rd.fail(err)
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
