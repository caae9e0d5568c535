"""The most that 4 concurrent requests can gain over one on this host: one engine step of r requests, timed.

The server decodes every request that is answering in one joint step (core.decode.joint), so with r clients a
step serves r tokens. If a step of r single-row requests costs `t_r` and a step of one request `t_1`, then r
clients can get at most `r · t_1 / t_r` times one client's tokens per second: prefills, sampling and HTTP only
add to both sides (each costs a request as much with others beside it; `bench.server` measures the whole). One
row's step reads every weight once and is bound by the memory bus; four rows' is bound by the int4 kernel's
dot-product rate (`bench.kernels`), so `t_4 / t_1` is what the 4-client target of `bench.server` runs into.

`python -m bench.joint_bound [--model ID] [--rounds 7]`: the real model at its default precision, each request
holding a short prompt in its own int8 cache (as the server's do), the step sizes taking turns for `--rounds`
rounds (a 2-core host's speed drifts); medians. Prints JSON; `bench.server` runs it before its levels.
One request's step runs its layers in one C call (core/decode/_layer_step.c) and a joint step drives them from
Python, so `t_1` is the faster implementation's: the bound is the joint step's as the engine runs it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from core.config import EngineConfig
from core.decode.cache import new_cache
from core.loading import load_engine
from models.registry import DEFAULT_MODEL_ID

SIZES = (1, 2, 4, 8)
PROMPT = "What is the capital of Italy?"


def step_seconds(decoder, caches: list, steps: int) -> float:
    """Mean seconds of one joint step of len(caches) single-row requests (their caches grow by `steps` tokens)."""
    token = torch.tensor([100])
    items = [(token, cache, None) for cache in caches]
    start = time.perf_counter()
    for _ in range(steps):
        decoder.step_many(items)
    return (time.perf_counter() - start) / steps


def measure(model: str, rounds: int = 7, steps: int = 16) -> dict:
    """Median seconds of a joint step of each size in SIZES, and the gain each size can give at most."""
    engine = load_engine(EngineConfig(model_id=model), reasoning=False)
    decoder = engine.fused
    if decoder is None:
        raise SystemExit(f"{model}: no fused decode step at this precision (packed int4 only)")
    ids = engine.prompt_ids([{"role": "user", "content": PROMPT}])
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    with torch.inference_mode():
        for round_ in range(rounds + 1):  # round 0 warms up: first-call allocations and kernel setup
            for n in SIZES if round_ % 2 else SIZES[::-1]:
                caches = []
                for _ in range(n):
                    cache = new_cache(engine.model.config, engine.kv)
                    engine.open_prompt(ids, "base", cache)
                    caches.append(cache)
                seconds = step_seconds(decoder, caches, steps)
                if round_:
                    times[n].append(seconds)
    median = {n: statistics.median(ts) for n, ts in times.items()}
    return {"model": model, "precision": engine.precision, "rounds": rounds, "steps": steps,
            "step_ms": {str(n): round(1e3 * median[n], 2) for n in SIZES},
            "step_ms_rounds": {str(n): [round(1e3 * t, 2) for t in ts] for n, ts in times.items()},
            "max_gain": {str(n): round(n * median[1] / median[n], 2) for n in SIZES}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.joint_bound", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL_ID)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    print(json.dumps(measure(args.model, args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
