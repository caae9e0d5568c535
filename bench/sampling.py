"""What picking the next token costs on Qwen's 151,936-entry vocabulary, against the plain torch ops it replaced.

For 1 and 8 rows of bf16 logits: greedy, the chat default (T 0.7, top-k 40, top-p 0.9, penalty 1.05 over 300 seen
tokens), RL's unfiltered draw at T 0.7, the draw of `ponder eval --parallel` and the verifier's collection (T 0.7,
top-p 0.95, no top-k) and the log-prob of the pick that RL and the vote record. `core.decode.sampling` is timed beside
`reference` (the same computations as plain out-of-place torch ops: `float()`, `argmax`, `softmax` + `multinomial`
over the whole vocabulary, `logsumexp`, as Ponder drew until 2026-12-06), in one process, each the median of 5 rounds
of `per_call_s`. With --decode, the default model's decode speed with each sampler too, alternating
in one process: one row greedy, 8 parallel answers at the chat default, 8 at RL's unfiltered T 0.7 and 8 at the
evaluations' draw (128 tokens each, end-of-turn ignored), also with Ponder's sampler taking torch's topk instead of
the C shortlist. Writes bench/results/sampling[_<tag>].{json,md}.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from bench.machine import cpu_name, per_call_s, write_results
from core.config import SamplingConfig
from core.decode import sampling

VOCAB = 151936
CASES = {
    "greedy": SamplingConfig(temperature=0.0, repetition_penalty=1.0),
    "chat default": SamplingConfig(),
    "RL draw (T 0.7, unfiltered)": SamplingConfig(temperature=0.7, top_k=0, top_p=1.0, repetition_penalty=1.0),
    "eval votes (T 0.7, top-p 0.95)": SamplingConfig(temperature=0.7, top_k=0, top_p=0.95, repetition_penalty=1.0),
}


def reference(logits, cfg: SamplingConfig, generator, seen):
    """The draw as plain torch ops (the shipped code before the in-place sampler)."""
    logits = logits.float()
    if seen is not None:
        logits = sampling.apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if cfg.greedy:
        return logits.argmax(dim=-1)
    logits = logits / cfg.temperature
    short = sampling.shortlist(logits, cfg.top_k, cfg.top_p)
    if short is not None:
        values, ids = short
        return ids.gather(1, torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)).squeeze(-1)
    probs = torch.softmax(sampling.filter_top_k_top_p(logits, cfg.top_k, cfg.top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def reference_logprobs(logits, picks, cfg: SamplingConfig, seen=None):
    logits = logits.float()
    if seen is not None:
        logits = sampling.apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if not cfg.greedy:
        logits = logits / cfg.temperature
    return logits.gather(1, picks.view(-1, 1)).squeeze(1) - torch.logsumexp(logits, dim=-1)


def decode_speeds(model_id: str | None, rounds: int = 3) -> list[dict]:
    """Decode tok/s of the default model with Ponder's sampler and with `reference`, alternating."""
    from dataclasses import replace

    from core import engine as engine_module
    from core.config import EngineConfig
    from core.decode import rows
    from core.loading import load_engine
    from models.registry import DEFAULT_MODEL_ID

    engine = load_engine(EngineConfig(model_id=model_id or DEFAULT_MODEL_ID, prompt_cache_tokens=0))
    prompt = "Write a Python function that checks whether a number is prime, and explain how it works."
    greedy = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=128, ignore_eos=True)
    runs = {"1 row, greedy": lambda: engine.generate(prompt, greedy, mode="base"),
            "8 rows, chat default": lambda: engine_module.collect(engine.parallel(
                prompt, replace(SamplingConfig(), max_tokens=128, ignore_eos=True, seed=0), n=8, mode="base")),
            "8 rows, RL draw": lambda: engine_module.collect(engine.parallel(
                prompt, replace(CASES["RL draw (T 0.7, unfiltered)"], max_tokens=128, ignore_eos=True, seed=0), n=8,
                mode="base")),
            "8 rows, eval votes": lambda: engine_module.collect(engine.parallel(
                prompt, replace(CASES["eval votes (T 0.7, top-p 0.95)"], max_tokens=128, ignore_eos=True, seed=0), n=8,
                mode="base"))}
    ours, scan = (rows.sample_next, rows.pick_logprobs), sampling.top_candidates
    variants = ("reference", "ponder_torch_topk", "ponder")
    speeds = {(name, which): [] for name in runs for which in variants}
    runs["1 row, greedy"]()  # warm-up
    try:
        for _ in range(rounds):
            for which in variants:
                rows.sample_next, rows.pick_logprobs = (reference, reference_logprobs) if which == "reference" else ours
                sampling.top_candidates = scan if which == "ponder" else (lambda *a: None)
                for name, run in runs.items():
                    speeds[name, which].append(run().stats.decode_tok_s)
    finally:
        (rows.sample_next, rows.pick_logprobs), sampling.top_candidates = ours, scan
    return [{"case": name, **{f"{which}_tok_s": statistics.median(speeds[name, which]) for which in variants}}
            for name in runs]


def timed(reference_fn, ponder_fn) -> tuple[float, float]:
    """Median µs a call of each, over 5 alternating rounds."""
    rounds = [(per_call_s(reference_fn, 0.3), per_call_s(ponder_fn, 0.3)) for _ in range(5)]
    return tuple(statistics.median(r[i] for r in rounds) * 1e6 for i in (0, 1))


def measure(rows: int, gen: torch.Generator) -> list[dict]:
    torch.manual_seed(rows)
    logits = (torch.randn(rows, VOCAB) * 3).bfloat16()
    seen = torch.randint(0, VOCAB, (rows, 300))
    picks = torch.zeros(rows, dtype=torch.long)
    results = []
    for name, cfg in CASES.items():
        s = seen if cfg.repetition_penalty != 1.0 else None
        ref, ours = timed(lambda cfg=cfg, s=s: reference(logits, cfg, gen, s),
                          lambda cfg=cfg, s=s: sampling.sample_next(logits, cfg, gen, s))
        results.append({"rows": rows, "case": name, "reference_us": ref, "ponder_us": ours})
    rl = CASES["RL draw (T 0.7, unfiltered)"]
    ref, ours = timed(lambda: reference_logprobs(logits, picks, rl), lambda: sampling.pick_logprobs(logits, picks, rl))
    return results + [{"rows": rows, "case": "log-prob of the pick (T 0.7)", "reference_us": ref, "ponder_us": ours}]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--tag", default="")
    parser.add_argument("--decode", action="store_true", help="also decode tok/s of the default model, A/B")
    parser.add_argument("--model", default=None, help="model for --decode (default: the embedded one)")
    args = parser.parse_args(argv)
    gen = sampling.make_generator(0)
    results = [r for rows in args.rows.split(",") for r in measure(int(rows), gen)]
    md = [f"Next-token pick on a {VOCAB:,}-entry vocabulary, bf16 logits, {cpu_name()}, "
          f"{torch.get_num_threads()} threads", "", "| rows | case | plain torch µs | Ponder µs | speed-up |",
          "|---:|---|---:|---:|---:|"]
    for r in results:
        r["speedup"] = round(r["reference_us"] / r["ponder_us"], 1)
        md.append(f"| {r['rows']} | {r['case']} | {r['reference_us']:.0f} | {r['ponder_us']:.0f} | "
                  f"{r['speedup']}× |")
    data = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "results": results}
    if args.decode:
        data["decode"] = decode_speeds(args.model)
        md += ["", f"Decode, 128 tokens, median of 3 alternating rounds ({args.model or 'the embedded model'}, its "
               "default weights; the middle column: Ponder's sampler with torch's topk in place of the C shortlist)",
               "", "| case | plain torch tok/s | Ponder, torch topk tok/s | Ponder tok/s | speed-up over plain torch |",
               "|---|---:|---:|---:|---:|"]
        for d in data["decode"]:
            d["speedup"] = round(d["ponder_tok_s"] / d["reference_tok_s"], 2)
            md.append(f"| {d['case']} | {d['reference_tok_s']:.1f} | {d['ponder_torch_topk_tok_s']:.1f} | "
                      f"{d['ponder_tok_s']:.1f} | {d['speedup']}× |")
    write_results("sampling" + (f"_{args.tag}" if args.tag else ""), data, md, print_json=False)


if __name__ == "__main__":
    main()
