"""`ponder ask`: one question answered headlessly, streamed to stdout (or one JSON object)."""
from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import replace

from core.config import DECODE_MODES, KV_FORMATS, EngineConfig, SamplingConfig
from models.quantization import PRECISIONS
from models.registry import DEFAULT_MODEL_ID, default_budget

from .args import question, real, whole

MODES = ("auto", "reason", "base")


def add_parser(sub) -> None:
    ask = sub.add_parser("ask", help="answer a question headlessly, streaming to stdout")
    ask.add_argument("text", metavar="TEXT", type=question, help="the question (use - to read it from stdin)")
    ask.add_argument("--mode", choices=MODES, default="base",
                     help="base: answer directly (default); reason: think first with the reasoning adapter; "
                          "auto: the switcher decides")
    ask.add_argument("--budget", type=whole(0), default=None,
                     help="thinking budget in tokens; 0 = no budget, up to the context (default: the model's, "
                          "chosen on dev: 512 for both shipped models, 256 for imports)")
    ask.add_argument("--answer-max-tokens", type=whole(1), default=256, help="cap on the answer after thinking (default 256)")
    ask.add_argument("--parallel", type=whole(1, 8), default=1, metavar="N",
                     help="sample N answers (1-8) from one prefill and vote (verifier-weighted when available, by "
                          "count where the model's verifier records that as measured better)")
    ask.add_argument("--model", default=DEFAULT_MODEL_ID, help=f"installed model id (default {DEFAULT_MODEL_ID})")
    ask.add_argument("--temperature", type=real(0), default=0.7, help="0 = greedy and deterministic (default 0.7)")
    ask.add_argument("--top-p", type=real(0, 1, low_open=True), default=0.9, help="nucleus sampling threshold (default 0.9)")
    ask.add_argument("--top-k", type=whole(0), default=40, help="keep the k most likely tokens, 0 = off (default 40)")
    ask.add_argument("--repetition-penalty", type=real(0, low_open=True), default=1.05, help="1 = off (default 1.05)")
    ask.add_argument("--max-tokens", type=whole(1), default=512, help="cap on generated tokens (default 512)")
    ask.add_argument("--seed", type=whole(-(2**63), 2**64 - 1), default=None,
                     help="seed for repeatable sampling (a 64-bit whole number)")
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

    from ..progress import TerminalProgress

    sampling = SamplingConfig(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, repetition_penalty=args.repetition_penalty,
        max_tokens=args.max_tokens, seed=args.seed, stop=tuple(args.stop),
    )
    cfg = EngineConfig(model_id=args.model, precision=args.precision, kv=args.kv, head_bits=args.head_bits,
                       group_size=args.group_size, decode=args.decode,
                       threads=args.threads)
    card = None
    if args.adapter is not None:
        from .adapters import ask_adapter

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
