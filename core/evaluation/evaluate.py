"""`ponder eval`: accuracy, thinking/answer tokens, budget-forced share, TTFT and latency on a data file;
`--route-only` measures the switcher alone (prefill + head). Also `python -m core.evaluation.evaluate`."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from core.config import DECODE_MODES, KV_FORMATS, EngineConfig, SamplingConfig
from core.data.datasets import load_items
from core.decode.cache import new_cache
from core.decode.prefill import prefill
from core.events import DoneEvent
from core.prompting.chat_format import DEFAULT_SYSTEM
from core.prompting.prompts import reasoning_system
from core.reasoning.voting import is_correct, score_candidates
from models.int4_kernel import kernel_name
from models.quantization import GROUP_SIZE, GROUP_SIZES, PRECISIONS


def grade(text: str, gold: str | None) -> bool | None:
    """Right or wrong against the gold answer; None for a row without one (a chat instruction: timed, not scored)."""
    return None if gold is None else is_correct(text, gold)


def graded_accuracy(rows: list[dict]) -> float | None:
    graded = [r["correct"] for r in rows if r["correct"] is not None]
    return sum(graded) / len(graded) if graded else None


def run_one(engine, item, args, sampling):
    kw = {"mode": args.mode, "budget": args.budget or None, "answer_max_tokens": args.answer_max_tokens}
    if args.system:
        kw["system"] = args.system
    events = (engine.parallel(item.prompt, sampling, n=args.parallel, **kw) if args.parallel > 1
              else engine.stream(item.prompt, sampling, **kw))
    for event in events:
        if isinstance(event, DoneEvent):
            return event.answer
    raise RuntimeError("no answer")


def batched_rows(engine, pending, args, rows: list[dict], total: int) -> list[dict]:
    """Greedy rows for `--batch K`: K questions decoded together (same rules as one at a time). `pending`: the
    (row index, item) pairs still to answer; `rows`: those answered before (a resumed run), kept in row order."""
    greedy = SamplingConfig(temperature=0, top_k=0, top_p=1.0, repetition_penalty=1.0, max_tokens=args.max_tokens)
    for start in range(0, len(pending), args.batch):
        chunk = pending[start:start + args.batch]
        t = time.perf_counter()
        answers = engine.generate_batch([i.prompt for _, i in chunk], greedy, mode=args.mode,
                                        budget=args.budget or None, answer_max_tokens=args.answer_max_tokens,
                                        system=args.system or DEFAULT_SYSTEM)
        per_question = (time.perf_counter() - t) / len(chunk)
        for (index, item), a in zip(chunk, answers, strict=True):
            rows.append({"index": index, "correct": grade(a.text, item.gold), "thinking_tokens": a.thinking_tokens,
                         "text": a.text, "thinking": a.thinking, "answer_tokens": a.answer_tokens,
                         "budget_forced": a.budget_forced, "ttft_s": 0.0, "latency_s": per_question,
                         "reasoned": bool(a.route and a.route.reason)})
        rows.sort(key=lambda r: r["index"])
        save_partial(engine, rows, args, args.batch, total)
        if args.progress:
            print(f"[{len(rows)}/{total}] acc {graded_accuracy(rows)} {per_question:.1f}s/question",
                  file=sys.stderr, flush=True)
    return rows


def save_partial(engine, rows: list[dict], args, batch: int, total: int) -> None:
    """Write what was measured so far after every question or batch: a long run stopped early keeps it, and
    `--resume` continues it."""
    if getattr(args, "out", None):
        write_json(args.out, {**summarize(engine, rows, args, batch), "partial": len(rows) < total,
                              "questions": rows})


def resumed_rows(path: Path | None, engine, args, indices: set[int]) -> list[dict]:
    """The rows of an earlier run of the same settings saved at `path` (those among `indices`), to skip; a file of
    other settings is refused, since its rows would not be comparable."""
    if path is None or not Path(path).is_file():
        return []
    before = json.loads(Path(path).read_text())
    now = {**settings_of(args), **engine_settings(engine)}
    if not args.temperature:  # greedy rows do not depend on where the run started; sampled rows are seeded by it
        now.pop("offset")
    differ = [k for k in now if k in before and str(before[k]) != str(now[k])]
    if differ:
        raise ValueError(f"{path} was measured with other settings ({', '.join(differ)}): not resumed")
    return [q for q in before.get("questions", []) if q["index"] in indices]


def evaluate(engine, items, args) -> dict:
    """Answer and score `items` (rows `args.offset`…); with `args.resume`, the rows already in `args.out` (same
    settings) are kept and not answered again."""
    greedy = args.parallel == 1 and args.temperature == 0
    batch = getattr(args, "batch", 1)
    if batch > 1 and not greedy:
        raise ValueError("--batch works for greedy single answers")
    offset = getattr(args, "offset", 0)
    indexed = [(offset + k, item) for k, item in enumerate(items)]
    rows = resumed_rows(args.out, engine, args, {i for i, _ in indexed}) if getattr(args, "resume", False) else []
    done = {r["index"] for r in rows}
    pending = [(i, item) for i, item in indexed if i not in done]
    if batch > 1:
        rows = batched_rows(engine, pending, args, rows, len(items))
    for index, item in pending if batch <= 1 else []:
        sampling = SamplingConfig(temperature=args.temperature, top_p=0.95 if not greedy else 1.0, top_k=0,
                                  repetition_penalty=1.0, max_tokens=args.max_tokens,
                                  seed=None if args.seed is None else args.seed + index - offset)
        t = time.perf_counter()
        answer = run_one(engine, item, args, sampling)
        latency = time.perf_counter() - t
        row = {"index": index, "correct": grade(answer.text, item.gold),
               "thinking_tokens": answer.thinking_tokens, "text": answer.text, "thinking": answer.thinking,
               "answer_tokens": answer.answer_tokens if answer.thinking_tokens else
               (answer.answer_tokens or answer.stats.completion_tokens),
               "budget_forced": answer.budget_forced, "ttft_s": answer.stats.ttft_s, "latency_s": latency,
               "reasoned": bool(answer.route and answer.route.reason)}
        if answer.candidates and item.gold is not None:
            row.update(score_candidates([{"answer": c.final_answer, "score": c.score, "text": c.text,
                                          "thinking": c.thinking, "thinking_tokens": c.thinking_tokens,
                                          "logprob_mean": c.logprob_mean, "logprob_lowest": c.logprob_lowest,
                                          "head_score": c.head_score}
                                         for c in answer.candidates], item.gold))
        rows = sorted([*rows, row], key=lambda r: r["index"])
        save_partial(engine, rows, args, batch, len(items))
        if args.progress:
            print(f"[{len(rows)}/{len(items)}] acc {graded_accuracy(rows)} latency {latency:.1f}s", file=sys.stderr,
                  flush=True)
    return {**summarize(engine, rows, args, batch), "questions": rows}


def write_json(path: Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def reasoning_adapter_name(engine) -> str | None:
    slots = getattr(engine, "slots", None)
    return getattr(slots.reasoning, "name", None) if slots is not None else None


def settings_of(args) -> dict:
    """What makes two runs' answers comparable (the engine's side is checked by the model/precision keys)."""
    return {"mode": args.mode, "budget": args.budget, "parallel": args.parallel, "vote": args.vote,
            "temperature": args.temperature, "data": str(args.data), "system": args.system,
            "max_tokens": args.max_tokens, "answer_max_tokens": args.answer_max_tokens,
            "seed": getattr(args, "seed", None), "offset": getattr(args, "offset", 0),
            "switcher": str(args.switcher) if getattr(args, "switcher", None) else None}


def engine_settings(engine) -> dict:
    return {"model": engine.model_id, "adapter": reasoning_adapter_name(engine), "precision": engine.precision,
            "kv": engine.kv, "decode": engine.decode,
            "ff_keep": engine.ff_keep if engine.decode != "dense" else None,
            "ff_reselect": engine.ff_reselect if engine.decode.startswith("griffin") else None,
            "ff_decay": engine.ff_decay if engine.decode.startswith("griffin") and engine.ff_reselect else None,
            "int4_kernel": kernel_name(),  # its paths round differently: a resumed run must use the same one
            "codes_sha256": getattr(engine.model, "ponder_codes", None)}  # which W4-FPT rounding: prepared per machine


def summarize(engine, rows: list[dict], args, batch: int) -> dict:
    mean = lambda key: statistics.fmean(r[key] for r in rows) if rows else 0.0  # noqa: E731
    out = {"n": len(rows), "accuracy": graded_accuracy(rows) if rows else 0.0,
           "n_graded": sum(r["correct"] is not None for r in rows), "mean_thinking_tokens": mean("thinking_tokens"),
           "mean_answer_tokens": mean("answer_tokens"), "budget_forced_share": mean("budget_forced"),
           "mean_latency_s": mean("latency_s"), "mean_ttft_s": mean("ttft_s"), "reasoned_share": mean("reasoned"),
           **settings_of(args), "batch": batch, "group_size": getattr(args, "group_size", None),
           **engine_settings(engine)}
    if batch > 1:  # one prefill serves the whole batch: per-question TTFT is not measured
        out["mean_ttft_s"] = None
    voted = [r for r in rows if "pass_at_n" in r]  # graded rows: chat rows have no vote to score
    if args.parallel > 1 and voted:
        for method in ("weighted", "majority", "best"):
            out[f"accuracy_{method}"] = statistics.fmean(r[f"correct_{method}"] for r in voted)
        out["pass_at_n"] = statistics.fmean(r["pass_at_n"] for r in voted)
        out["accuracy"] = out[f"accuracy_{args.vote}"]
    return out


@torch.inference_mode()
def route_only(engine, items, expect: str, budget: int) -> dict:
    if engine.router is None:
        raise ValueError("no switcher is installed for this model")
    hits, head_s, ttft = [], [], []
    for item in items:
        ids = engine.prompt_ids(item.prompt, reasoning_system(budget))
        cache = new_cache(engine.model.config, engine.kv)
        t = time.perf_counter()
        with engine._base():
            logits, hidden = prefill(engine.model, torch.tensor([ids]), cache, want_hidden=True)
        logits.argmax(-1)
        prefill_s = time.perf_counter() - t
        decision = engine.route("auto", hidden)
        hits.append(decision.reason == (expect == "reason"))
        head_s.append(decision.latency_s)
        ttft.append(prefill_s)
    return {"n": len(items), "accuracy": statistics.fmean(hits), "expect": expect,
            "mean_added_latency_s": statistics.fmean(head_s), "mean_prefill_s": statistics.fmean(ttft),
            "added_latency_share_of_ttft": statistics.fmean(head_s) / statistics.fmean(ttft)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ponder eval", description="Evaluate on a GSM8K/MATH/Alpaca JSONL file.")
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--mode", choices=("base", "reason", "auto"), default="reason")
    p.add_argument("--budget", type=int, default=256, help="thinking budget, 0 = none")
    p.add_argument("--answer-max-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=320, help="cap for base-mode answers")
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--batch", type=int, default=1,
                   help="greedy only: decode K questions together for throughput (latency becomes per-batch / K)")
    p.add_argument("--vote", choices=("weighted", "majority", "best"), default=None,
                   help="which vote's accuracy is the headline (all are reported; default: the rule the app uses, "
                        "from the model's verifier)")
    p.add_argument("--temperature", type=float, default=None, help="default: 0 for one stream, 0.7 for parallel")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=EngineConfig().model_id)
    p.add_argument("--adapter", default=None, help="reasoning adapter from the library (default: the model's own)")
    p.add_argument("--precision", choices=PRECISIONS, default=None, help="weights (default: the model's, as the app runs it)")
    p.add_argument("--kv", choices=KV_FORMATS, default=EngineConfig().kv, help="KV cache format")
    p.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=GROUP_SIZE, help="int4 group size")
    p.add_argument("--head-bits", type=int, choices=(4, 8), default=4, help="bits of the quantized LM head")
    p.add_argument("--decode", choices=DECODE_MODES, default="dense",
                   help="decode-step feed-forward: dense, or griffin (per-prompt sparse neurons)")
    p.add_argument("--ff-keep", type=float, default=EngineConfig().ff_keep, help="share of neurons griffin keeps")
    p.add_argument("--ff-reselect", type=int, default=0, help="griffin: reselect every N decode steps (0: never)")
    p.add_argument("--ff-decay", type=float, default=1.0, help="griffin reselection: factor on earlier scores")
    p.add_argument("--system", default=None, help="system prompt (default: Ponder's); e.g. ask base mode for \\boxed{}")
    p.add_argument("--switcher", type=Path, default=None,
                   help="auto: route with the switcher in this folder (`ponder train switcher --out`), not the model's")
    p.add_argument("--route-only", action="store_true", help="prefill + switcher only")
    p.add_argument("--expect", choices=("reason", "base"), help="with --route-only: the right decision for the file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows already in --out (a stopped run of the same settings) and answer the rest")
    p.add_argument("--progress", action="store_true")
    return p


def main(argv=None) -> int:
    from core.loading import load_engine, use_switcher

    args = build_parser().parse_args(argv)
    if args.temperature is None:
        args.temperature = 0.0 if args.parallel == 1 else 0.7
    items = load_items(args.data, args.limit, args.offset)
    engine = load_engine(EngineConfig(model_id=args.model, precision=args.precision, kv=args.kv,
                                      group_size=args.group_size, head_bits=args.head_bits, decode=args.decode,
                                      ff_keep=args.ff_keep, ff_reselect=args.ff_reselect, ff_decay=args.ff_decay,
                                      reasoning_adapter=args.adapter), reasoning=True)
    if args.vote is None:  # the app's own rule, so `accuracy` grades the answers it would give
        args.vote = engine.verifier.vote if engine.verifier is not None else "majority"
    if args.switcher:
        use_switcher(engine, args.switcher)
    if args.adapter and reasoning_adapter_name(engine) != args.adapter:
        raise ValueError(f"the reasoning adapter '{args.adapter}' did not load: {' '.join(engine.warnings)}")
    if args.route_only:
        if not args.expect:
            raise ValueError("--route-only needs --expect reason|base")
        result = route_only(engine, items, args.expect, args.budget)
    else:
        if all(i.gold is None for i in items):
            print(f"note: {args.data} has no reference answers here: the rows are timed, not scored",
                  file=sys.stderr)
        result = evaluate(engine, items, args)
    summary = {k: v for k, v in result.items() if k != "questions"}  # per-question rows go to --out only
    text = json.dumps(summary, indent=None if args.json else 2)
    if args.out:
        write_json(args.out, result)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
