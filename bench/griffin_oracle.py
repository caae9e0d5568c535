"""`python -m bench.griffin_oracle`: the accuracy bound of GRIFFIN at a kept share — neurons chosen with hindsight.

GRIFFIN picks each answer's feed-forward neurons before the answer exists (from the prompt, or with
`--ff-reselect` from the answer so far). The oracle picks them from the prompt **and the dense model's whole
answer** (GRIFFIN's scores summed over both), then answers again, greedy, with those neurons: no rule that chooses
one set per answer from what it has seen can do better at that share, so its accuracy bounds them all
(docs/algorithms.md B.1). The dense answers come from an earlier `ponder eval` file of the same questions, mode and
settings (`--dense`), re-tokenized; each oracle answer is scored with math-verify on the whole reply like theirs.
Results: bench/results/griffin_oracle_<model>_<keep>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import time
from pathlib import Path

import torch

from bench.machine import cpu_name
from core.config import EngineConfig, SamplingConfig
from core.data.datasets import load_items
from core.sparse.ff import Scorer

ROOT = Path(__file__).resolve().parents[1]


def oracle_scoring(engine, keep: float, answer_ids: list[int]):
    """A replacement for `engine._scoring`: score the prompt's prefill as GRIFFIN does, then the dense answer
    after it (on a copy of the cache, which stays at the prompt), and give the cache the cut blocks of both."""
    @contextlib.contextmanager
    def scoring(cache, mask=None):
        scorer = Scorer(keep)
        with scorer.collect(engine.model):
            yield
        ahead = copy.deepcopy(cache)
        with scorer.collect(engine.model), torch.inference_mode():
            engine.model(input_ids=torch.tensor([answer_ids]), cache=ahead, use_cache=True, logits_to_keep=1)
        cache.ff_selection = scorer.build(engine.model)
    return scoring


def main(argv=None) -> int:
    from core.loading import load_engine
    from core.reasoning.voting import is_correct

    p = argparse.ArgumentParser(prog="python -m bench.griffin_oracle", description=__doc__.split("\n\n")[0])
    p.add_argument("--dense", type=Path, required=True, help="`ponder eval --mode base` JSON of the dense model")
    p.add_argument("--keep", type=float, default=0.7)
    p.add_argument("--limit", type=int, default=None, help="the first N questions of the dense file")
    p.add_argument("--max-tokens", type=int, default=512, help="the dense run's answer cap")
    args = p.parse_args(argv)
    dense = json.loads(args.dense.read_text())
    if dense["mode"] != "base" or dense.get("decode", "dense") != "dense" or dense["temperature"] != 0:
        raise SystemExit("--dense must be a greedy, dense, base-mode `ponder eval` result")
    questions = dense["questions"][: args.limit]
    offset = min(q["index"] for q in dense["questions"])
    items = load_items(Path(dense["data"]), max(q["index"] for q in questions) + 1 - offset, offset)
    engine = load_engine(EngineConfig(model_id=dense["model"], precision=dense["precision"], kv=dense["kv"],
                                      decode="griffin", ff_keep=args.keep), reasoning=False)
    sampling = SamplingConfig(temperature=0, top_k=0, top_p=1.0, repetition_penalty=1.0, max_tokens=args.max_tokens)
    plain_scoring, rows = engine._scoring, []
    for q in questions:
        item = items[q["index"] - offset]
        answer_ids = engine.tokenizer(q["text"], add_special_tokens=False)["input_ids"]
        engine._scoring = oracle_scoring(engine, args.keep, answer_ids)
        try:
            answer = engine.generate(item.prompt, sampling, mode="base", system=dense["system"])
        finally:
            engine._scoring = plain_scoring
        right = bool(is_correct(answer.text, item.gold))
        rows.append({"index": q["index"], "correct": right, "dense_correct": q["correct"], "text": answer.text})
        print(f"[{len(rows)}/{len(questions)}] oracle {sum(r['correct'] for r in rows)} / dense "
              f"{sum(r['dense_correct'] for r in rows)}", flush=True)
    n = len(rows)
    report = {"model": dense["model"], "precision": dense["precision"], "kv": dense["kv"], "keep": args.keep,
              "dense_file": str(args.dense), "n": n, "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "dense_accuracy": sum(r["dense_correct"] for r in rows) / n,
              "oracle_accuracy": sum(r["correct"] for r in rows) / n,
              "lost": sum(r["dense_correct"] and not r["correct"] for r in rows),
              "gained": sum(r["correct"] and not r["dense_correct"] for r in rows), "questions": rows}
    out = ROOT / "bench" / "results" / f"griffin_oracle_{dense['model']}_{args.keep}.json"
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "questions"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
