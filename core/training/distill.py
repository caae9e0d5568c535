"""`ponder train distill`: reasoning traces by rejection sampling from a teacher model (STaR-style).

For each *train* question the teacher (any installed model at any precision: the 1.5B, or the 0.5B itself)
samples `--samples` answers in base mode, all questions of a chunk decoded as one batch through the engine's
decode loop. math-verify keeps the right ones that end in a `\\boxed{}` answer and fit `--max-trace-tokens`; the
shortest right one becomes a trace row (question, thinking, answer) for `ponder train sft --data`, with its
provenance (teacher, precision, sampling, source row, how many samples were right). Every right, finished, boxed
sample of any length also goes to `<out>.right.jsonl` in the same row format, so a later run can pick traces for
another budget or train on several per question (rejection-sampling fine-tuning) without sampling again. The
files are rewritten atomically after every chunk, and a run started again on the same file skips the questions
it already holds.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from core.config import EngineConfig, SamplingConfig
from core.data.datasets import Item, load_items
from core.data.sft import unbox
from core.reasoning.voting import is_correct, last_boxed

TEACHER_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Sample:
    text: str
    tokens: int
    finished: bool
    """Stopped by itself (end of turn), not by the token cap."""


def usable_right(samples: list[Sample], gold: str) -> tuple[list[Sample], int]:
    """(the right samples that finished by themselves with a boxed answer, distinct texts, shortest first; how many
    samples were right)."""
    right = [s for s in samples if is_correct(s.text, gold)]
    usable = {s.text: s for s in right if s.finished and last_boxed(s.text) is not None}
    return sorted(usable.values(), key=lambda s: s.tokens), len(right)


def pick_trace(samples: list[Sample], gold: str, max_trace_tokens: int) -> tuple[Sample | None, int]:
    """(the shortest right, finished, boxed sample within the length cap or None, how many samples were right)."""
    usable, n_right = usable_right(samples, gold)
    usable = [s for s in usable if s.tokens <= max_trace_tokens]
    return (usable[0] if usable else None), n_right


def trace_row(item: Item, sample: Sample, provenance: dict) -> dict:
    """A trace row: the sample's reasoning with its boxed answer written plainly (SFT adds the boxed answer after
    `</think>`), and the gold answer."""
    return {"question": item.prompt, "thinking": unbox(sample.text), "answer": item.gold,
            "provenance": {**provenance, "trace_tokens": sample.tokens}}


def candidate_trace_row(row: dict) -> dict | None:
    """A verifier candidate (`ponder train verifier`'s `<cache>.candidates.jsonl`: Reason mode's own samples) as a
    trace row, or None when it is wrong, was cut at the budget, or has no trace: a model's own right answers are
    on-policy traces for reward-ranked fine-tuning."""
    if not (row["correct"] and not row["budget_forced"] and (row["thinking"] or "").strip()):
        return None
    return {"question": row["question"], "thinking": unbox(row["thinking"]).strip(), "answer": row["gold"],
            "provenance": {"source": "verifier candidates", "question_index": row["question_index"],
                           "sample": row["sample"], "trace_tokens": row["thinking_tokens"]}}


def rft_rows(paths: list[Path], per_question: int, max_trace_tokens: int) -> list[dict]:
    """Rejection-sampling fine-tuning rows from distill outputs or verifier candidates: per question, up to
    `per_question` distinct right traces (by thinking text, across files), shortest first, each within
    `max_trace_tokens`. A missing file or a row that is neither is a ValueError naming it (a typo must not silently
    drop a file's rows)."""
    by_question: dict[str, dict[str, dict]] = {}
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                row = json.loads(line) if line.strip() else None
                if row is not None and "sample" in row and "correct" in row:
                    row = candidate_trace_row(row)
                if row is not None and not (row["question"] and row["thinking"] and "trace_tokens" in row["provenance"]):
                    raise KeyError("trace_tokens")
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{n}: not a `ponder train distill` row or verifier candidate ({err})") from err
            if row is not None and row["provenance"]["trace_tokens"] <= max_trace_tokens:
                by_question.setdefault(row["question"], {}).setdefault(row["thinking"].strip(), row)
    out = []
    for rows in by_question.values():
        out += sorted(rows.values(), key=lambda r: r["provenance"]["trace_tokens"])[:per_question]
    return out


def state_path(out: Path) -> Path:
    return out.with_name(out.name + ".state.json")


def right_path(out: Path) -> Path:
    """Every usable right sample, beside the trace file (`x.jsonl` -> `x.right.jsonl`)."""
    return out.with_name(f"{out.stem}.right{out.suffix or '.jsonl'}")


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_done(out: Path) -> tuple[list[dict], set[tuple[str, int]]]:
    """Rows already written to `out` and the (source, index) of every question a previous run finished (those
    without a trace too, from the state file beside it)."""
    if not out.is_file():
        return [], set()
    rows = _read_rows(out)
    done = {(r["provenance"]["source"], r["provenance"]["index"]) for r in rows if "provenance" in r}
    if state_path(out).is_file():
        done |= {(s, i) for s, i in json.loads(state_path(out).read_text())["done"]}
    return rows, done


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def distill(engine, items: list[tuple[str, int, Item]], out: Path, *, samples: int, chunk: int, sampling: SamplingConfig,
            max_trace_tokens: int, provenance: dict, should_stop=lambda: False, log=print) -> dict:
    """Sample, check and write traces for `items` ((file name, row index, item)); returns a summary."""
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, done = read_done(out)
    every = [r for r in _read_rows(right_path(out))
             if (r["provenance"]["source"], r["provenance"]["index"]) in done]  # a chunk cut short is sampled again
    todo = [(f, i, it) for f, i, it in items if (f, i) not in done]
    stats = {"questions": 0, "traces": 0, "samples_right": 0, "samples": 0, "tokens": 0, "seconds": 0.0}
    for start in range(0, len(todo), chunk):
        if should_stop():
            log("stopped: what was written is kept; run the same command again to go on")
            break
        part = todo[start:start + chunk]
        t = time.perf_counter()
        answers = engine.generate_batch([it.prompt for _, _, it in part for _ in range(samples)], sampling,
                                        mode="base", system=provenance["system"])
        seconds = time.perf_counter() - t
        for k, (source, index, item) in enumerate(part):
            group = [Sample(a.text, a.answer_tokens or a.stats.completion_tokens, a.finish_reason == "stop")
                     for a in answers[k * samples:(k + 1) * samples]]
            usable, n_right = usable_right(group, item.gold)
            best = next((s for s in usable if s.tokens <= max_trace_tokens), None)
            where = {**provenance, "source": source, "index": index, "right": n_right}
            every.extend(trace_row(item, s, where) for s in usable)
            if best is not None:
                rows.append(trace_row(item, best, where))
            done.add((source, index))
            stats["traces"] += best is not None
            stats["samples_right"] += n_right
            stats["tokens"] += sum(s.tokens for s in group)
        stats["questions"] += len(part)
        stats["samples"] += len(part) * samples
        stats["seconds"] += seconds
        write_atomic(right_path(out), "".join(json.dumps(r) + "\n" for r in every))
        write_atomic(out, "".join(json.dumps(r) + "\n" for r in rows))
        write_atomic(state_path(out), json.dumps({"done": sorted(done)}))
        log(f"[{stats['questions']}/{len(todo)}] {stats['traces']} traces, {stats['samples_right']}/"
            f"{stats['samples']} samples right, {stats['tokens'] / max(stats['seconds'], 1e-9):.1f} tok/s")
    return {**stats, "rows_in_file": len(rows), "right_in_file": len(every), "out": str(out)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ponder train distill", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", action="append", required=True, type=Path, help="GSM8K/MATH *train* JSONL (repeatable)")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="questions per file")
    p.add_argument("--out", required=True, type=Path, help="trace rows JSONL (resumable)")
    p.add_argument("--teacher", default="qwen2.5-coder-0.5b-instruct", help="installed model id")
    p.add_argument("--precision", default=None, help="teacher weights (default: the model's)")
    p.add_argument("--samples", type=int, default=4, help="answers sampled per question")
    p.add_argument("--chunk", type=int, default=4, help="questions decoded together (rows = chunk x samples)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-tokens", type=int, default=320, help="cap of one sampled answer")
    p.add_argument("--max-trace-tokens", type=int, default=240, help="longest trace kept (fits the 256 budget)")
    p.add_argument("--system", default=TEACHER_SYSTEM)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv=None, store=None) -> int:
    from core.loading import load_engine

    a = build_parser().parse_args(argv)
    if a.samples < 1 or a.chunk < 1:
        raise ValueError("--samples and --chunk must be at least 1")
    items = [(path.name, a.offset + i, it) for path in a.data for i, it in enumerate(load_items(path, a.limit, a.offset))]
    if any(it.gold is None for _, _, it in items):
        raise ValueError("distillation needs questions with reference answers (GSM8K / MATH rows)")
    engine = load_engine(EngineConfig(model_id=a.teacher, precision=a.precision, kv="bf16"), store=store,
                         reasoning=False)
    sampling = SamplingConfig(temperature=a.temperature, top_p=a.top_p, top_k=0, repetition_penalty=1.0,
                              max_tokens=a.max_tokens, seed=a.seed)
    provenance = {"teacher": a.teacher, "precision": engine.precision, "temperature": a.temperature,
                  "top_p": a.top_p, "samples": a.samples, "max_tokens": a.max_tokens, "seed": a.seed,
                  "system": a.system}
    stop = {"now": False}
    previous = signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    try:
        summary = distill(engine, items, a.out, samples=a.samples, chunk=a.chunk, sampling=sampling,
                          max_trace_tokens=a.max_trace_tokens, provenance=provenance, should_stop=lambda: stop["now"],
                          log=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        signal.signal(signal.SIGINT, previous)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
