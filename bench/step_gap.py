"""What a decode step spends beside its int4 products: the real step against the same matrices back to back.

Loads the default engine (as `bench.step_profile` does) and times, median of 48 after 6 warm-ups, each in three
rounds: one greedy step of `core.decode.fused` (`step`, its layers in one C call where that runs; `python layers`:
the same step with the layers driven from Python, as before core/decode/_layer_step.c), the step's 97 int4
products alone on its own packed weights in call order with random bf16 inputs (`int4 back to back`), and the
same with one or eight `torch.rms_norm` calls on 896 values after each product (`+1 op`, `+8 ops`): the cost of
a small torch op between products, including what it does to the next product. Step minus back to back is the
time a step loses outside the int4 kernel (Python, dispatch, the small ops). Print only; for an AVX2 laptop emulated:
`ATEN_CPU_CAPABILITY=avx2 python -m bench.step_gap > bench/results/step_gap_<cpu>.txt`.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import models.int4_kernel as ik
from bench.decode import PONDER_SYSTEMS, default_system
from bench.machine import cpu_name
from bench.peers import PROMPT


def median_ms(f, n: int = 48) -> float:
    for _ in range(6):
        f()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(model_id: str = "qwen2.5-coder-0.5b-instruct") -> int:
    from core.config import EngineConfig
    from core.decode.cache import new_cache
    from core.loading import load_engine
    from core.prompting.chat_format import build_prompt_ids

    precision, kv, head_bits, group = PONDER_SYSTEMS[default_system(model_id)]
    engine = load_engine(EngineConfig(model_id=model_id, precision=precision, kv=kv, head_bits=head_bits,
                                      group_size=group))
    fused, model = engine.fused, engine.model
    if fused is None:
        raise SystemExit("no fused decode step for this model here")
    parts = fused.parts()
    xs = [torch.randn(1, p.scales.shape[0] * p.group_size).to(torch.bfloat16) for p in parts]
    hidden = model.config.hidden_size
    small, weight = torch.randn(1, hidden).to(torch.bfloat16), torch.ones(hidden, dtype=torch.bfloat16)
    ids = torch.tensor([build_prompt_ids(engine.tokenizer, PROMPT)])

    def products(ops: int):
        def run():
            for p, x in zip(parts, xs, strict=True):
                ik.int4_mm(x, p.data, p.group_size, p.scales)
                for _ in range(ops):
                    torch.rms_norm(small, (hidden,), weight, 1e-6)
        return run

    def step_ms(layers_in_c: bool = True) -> float:
        plan = fused.plan
        fused.plan = plan if layers_in_c else None
        try:
            return _step_ms()
        finally:
            fused.plan = plan

    def _step_ms() -> float:
        with torch.inference_mode():
            cache = new_cache(model.config, kv)
            model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            token = [torch.tensor([ids[0, -1].item()])]

            def one():
                token[0] = fused.step(token[0], cache).argmax(-1)
            return median_ms(one)

    print(f"# python -m bench.step_gap {model_id} on {cpu_name()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{ik.kernel_name()}, {torch.get_num_threads()} threads, {len(parts)} int4 products a step "
          f"({parts[0].data.dtype}: {'p32' if parts[0].data.dtype == torch.int8 else 'torch layout'}); ms")
    norm_us = median_ms(lambda: [torch.rms_norm(small, (hidden,), weight, 1e-6) for _ in range(100)]) * 10
    print(f"one torch.rms_norm on {hidden} values alone: {norm_us:.1f} us")
    for r in range(3):
        print(f"round {r}: step {step_ms():.2f} (layers in one C call: {fused.plan is not None}) | python layers "
              f"{step_ms(False):.2f} | int4 back to back {median_ms(products(0)):.2f} | +1 op between "
              f"{median_ms(products(1)):.2f} | +8 ops {median_ms(products(8)):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
