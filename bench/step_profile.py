"""Where one decode step's time goes: the default engine's step on the real model, split by torch op.

Prefills the decode benchmark's prompt, then times `steps` one-token steps (batch `rows`) through the engine's
model exactly as the decode loop calls it, once plain (wall time per step) and once under torch's profiler
(self time per op). The report groups ops into the int4 matmul kernels, the int8 cache, attention, the other
ops, and what is left: the Python and dispatch time around the ops. Writes
`bench/results/step_profile[_<model>].json` and `.md`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import models.int4_kernel
from bench.decode import DEFAULT_MODEL, default_config, quiet_machine
from bench.machine import cpu_name
from bench.peers import PROMPT

RESULTS = Path(__file__).resolve().parent / "results"
GROUPS = {  # op name fragment → group, first match wins
    "_weight_int4pack_mm": "int4 matmul kernels",
    "ponder::int4_mm": "int4 matmul kernels",
    "_weight_int8pack_mm": "int8 matmul kernels",
    "aten::mm": "bf16/fp32 matmuls (attention, LoRA)",
    "aten::bmm": "bf16/fp32 matmuls (attention, LoRA)",
    "aten::matmul": "bf16/fp32 matmuls (attention, LoRA)",
    "aten::addmm": "bf16/fp32 matmuls (attention, LoRA)",
    "aten::linear": "bf16/fp32 matmuls (attention, LoRA)",
    "softmax": "attention softmax",
}


def _group(name: str) -> str:
    for fragment, group in GROUPS.items():
        if fragment in name:
            return group
    return "other ops"


@contextlib.contextmanager
def _int4_calls_recorded():
    """Ponder's own int4 kernel is no torch op: name its calls for the profiler while it runs."""
    import torch

    import core.decode.fused
    import models.quantization

    plain = models.int4_kernel.int4_mm

    def recorded(*args):
        with torch.profiler.record_function("ponder::int4_mm"):
            return plain(*args)

    core.decode.fused.int4_mm = models.quantization.int4_mm = recorded
    try:
        yield
    finally:
        core.decode.fused.int4_mm = models.quantization.int4_mm = plain


def profile_step(model_id: str, rows: int, steps: int, reasoning: bool) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from core.decode.cache import new_cache
    from core.loading import load_engine
    from core.prompting.chat_format import build_prompt_ids

    config = default_config(model_id)
    kv = config.kv
    engine = load_engine(config, reasoning=reasoning)
    if reasoning and engine.slots.reasoning is None:
        raise SystemExit("no reasoning adapter for this model")
    model = engine.model
    ids = torch.tensor([build_prompt_ids(engine.tokenizer, PROMPT)])

    fused = engine.fused  # the step the decode loop takes (core.engine.Engine._decode)
    if fused is not None:  # its layers driven from Python, so that the profiler sees each op (bench.step_gap times
        fused.plan = None  # the step with its layers in one C call, which the profiler would see as no op at all)
    if fused is not None and reasoning:
        fused = fused.with_adapter(engine.slots.reasoning.peft_name)

    def one_step(token, cache):
        if fused is not None:
            return fused.step(token[:, 0], cache)
        return model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]

    def run(n: int, cache) -> list[float]:
        token = torch.tensor([[ids[0, -1].item()]] * rows)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            token = one_step(token, cache).argmax(-1, keepdim=True)
            times.append(time.perf_counter() - t)
        return times

    def fresh_cache():
        cache = new_cache(model.config, kv)
        model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        if rows > 1:
            cache.batch_repeat_interleave(rows)
        return cache

    with torch.inference_mode(), engine.slots.using(engine.slots.reasoning if reasoning else None):
        run(8, fresh_cache())  # warm-up
        wall = run(steps, fresh_cache())
        cache = fresh_cache()
        with profile(activities=[ProfilerActivity.CPU]) as prof, _int4_calls_recorded():
            run(steps, cache)
    per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.key_averages():
        if event.key.startswith("ProfilerStep") or event.self_cpu_time_total <= 0:
            continue
        per_op[event.key][0] += event.self_cpu_time_total / 1000 / steps  # ms per step
        per_op[event.key][1] += event.count / steps
    groups: dict[str, float] = defaultdict(float)
    calls = 0.0
    for name, (ms, count) in per_op.items():
        groups[_group(name)] += ms
        calls += count
    step_ms = statistics.median(wall) * 1000
    ops_ms = sum(groups.values())
    top = sorted(per_op.items(), key=lambda kv: -kv[1][0])[:15]
    return {
        "model": model_id, "cpu": cpu_name(), "rows": rows, "steps": steps, "reasoning": reasoning,
        "int4_decode_kernel": models.int4_kernel.kernel_name(),
        "path": "core.decode.fused" if fused is not None else "transformers modules (core.decode.lean_layers)",
        "int4_weight_mb": round(sum(p.data.numel() + p.scales.numel() * 2 for p in engine.fused.parts()) / 2**20, 1)
        if engine.fused is not None else None,
        "step_ms": round(step_ms, 2), "tok_s": round(rows * 1000 / step_ms, 1),
        "ops_ms_per_step_profiled": round(ops_ms, 2), "op_calls_per_step": round(calls),
        "groups_ms": {k: round(v, 2) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_ops": [{"op": k, "ms": round(v[0], 3), "calls": round(v[1], 1)} for k, v in top],
        "note": "ops' self time comes from a profiled run (the profiler adds its own cost per op); the step's wall "
                "time from an unprofiled one. Wall minus the kernels is what a compiled or fused step could save.",
    }


def to_markdown(result: dict) -> str:
    lines = [f"Decode step profile: {result['model']}, {result['rows']} row(s), reasoning adapter "
             f"{'on' if result['reasoning'] else 'off'}, {result['cpu']}, step through {result['path']}", "",
             f"Step (wall, unprofiled): {result['step_ms']} ms ({result['tok_s']} tok/s); "
             f"{result['op_calls_per_step']} op calls a step", "", "| group | ms per step |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in result["groups_ms"].items()]
    lines += ["", "| op | ms per step | calls per step |", "|---|---:|---:|"]
    lines += [f"| {o['op']} | {o['ms']} | {o['calls']} |" for o in result["top_ops"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.step_profile", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--reason", action="store_true", help="steps under the reasoning adapter")
    p.add_argument("--out", type=Path, default=None, help="file stem (default bench/results/step_profile...)")
    args = p.parse_args(argv)
    from core.loading import set_threads

    set_threads(None)
    with quiet_machine():
        result = profile_step(args.model, args.rows, args.steps, args.reason)
    suffix = ("" if args.model == DEFAULT_MODEL else f"_{args.model}") + (f"_rows{args.rows}" if args.rows > 1
                                                                          else "") + ("_reason" if args.reason else "")
    stem = args.out or RESULTS / f"step_profile{suffix}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")  # not with_suffix: model ids hold dots
    Path(f"{stem}.md").write_text(to_markdown(result))
    print(to_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
