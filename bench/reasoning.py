"""Reasoning benchmark: TTFT of reasoning vs base mode on one shared prefill (vs a naive adapter re-prefill),
both on the same prompt text (the reasoning system prompt states the budget; base mode's default is shorter),
aggregate decode throughput of N parallel streams from one prefill, and the switcher's added latency.

`python -m bench.reasoning [--json]`; writes bench/results/reasoning.json and reasoning.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = ("A bakery sells muffins for $3 each and cookies for $2 each. On Monday it sold 45 muffins and twice as many "
          "cookies. How much money did it make on Monday?")


def median_of(fn, runs):
    return statistics.median(fn() for _ in range(runs))


def main(argv=None) -> int:
    from core.config import EngineConfig, SamplingConfig
    from core.decode.cache import new_cache
    from core.decode.prefill import prefill
    from core.loading import load_engine
    from core.prompting.prompts import reasoning_system

    p = argparse.ArgumentParser(prog="python -m bench.reasoning")
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    engine = load_engine(EngineConfig(prompt_cache_tokens=0))  # every TTFT below a cold prefill
    if not engine.can_reason:
        raise SystemExit("no reasoning adapter installed")
    one = SamplingConfig(temperature=0, max_tokens=1, repetition_penalty=1.0)

    def ttft(mode, system=None):
        kw = {"system": system} if system else {}
        return engine.generate(PROMPT, one, mode=mode, budget=256, answer_max_tokens=1, **kw).stats.ttft_s

    same_prompt = reasoning_system(256)  # the reasoning prompt (with its budget statement), answered directly

    def naive_ttft():  # re-encode the whole prompt with the adapter on, then take the first thinking token
        ids = engine.prompt_ids(PROMPT, reasoning_system(256)) + list(engine.markers.think_open)
        t = time.perf_counter()
        logits, _ = prefill(engine.model, torch.tensor([ids]), new_cache(engine.model.config, engine.kv))
        logits.argmax(-1)
        return time.perf_counter() - t

    engine.generate(PROMPT, one, mode="reason", budget=4, answer_max_tokens=1)  # warm-up
    results = {"ttft_base_same_prompt_s": median_of(lambda: ttft("base", same_prompt), args.runs),
               "ttft_reason_s": median_of(lambda: ttft("reason"), args.runs),
               "ttft_naive_reprefill_s": median_of(naive_ttft, args.runs),
               "ttft_base_default_prompt_s": median_of(lambda: ttft("base"), args.runs)}
    base = results["ttft_base_same_prompt_s"]
    results["ttft_reason_over_base"] = results["ttft_reason_s"] / base
    results["ttft_naive_over_base"] = results["ttft_naive_reprefill_s"] / base
    results["ttft_reason_over_base_default_prompt"] = results["ttft_reason_s"] / results["ttft_base_default_prompt_s"]
    if engine.router is not None:
        auto = [engine.generate(PROMPT, one, mode="auto", budget=256, answer_max_tokens=1) for _ in range(args.runs)]
        results["switcher_latency_s"] = statistics.median(a.route.latency_s for a in auto)
        results["switcher_share_of_ttft"] = results["switcher_latency_s"] / base
    sampling = SamplingConfig(temperature=0.7, top_p=0.95, top_k=0, repetition_penalty=1.0, seed=0, ignore_eos=True)
    throughput = {}
    for n in (1, 4, 8):
        answer = None
        for event in engine.parallel(PROMPT, sampling, n=n, mode="reason", budget=args.tokens,
                                     answer_max_tokens=8):
            answer = getattr(event, "answer", answer)
        throughput[n] = answer.stats.decode_tok_s
    results["aggregate_tok_s"] = throughput
    results["parallel8_over_1"] = throughput[8] / throughput[1]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "reasoning.json").write_text(json.dumps(results, indent=2))
    md = ["| measure | value |", "|---|---:|"] + [
        f"| {k} | {v:.4f} |" for k, v in results.items() if isinstance(v, float)] + [
        f"| aggregate tok/s, N={n} | {v:.1f} |" for n, v in throughput.items()]
    (RESULTS / "reasoning.md").write_text("\n".join(md) + "\n")
    print(json.dumps(results) if args.json else "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
