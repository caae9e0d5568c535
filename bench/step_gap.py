"""What a decode step spends beside its int4 products: the real step against the same matrices back to back.

Loads the default engine (as `bench.step_profile` does) and times, median of 48 after 6 warm-ups, each in three
rounds: one greedy step of `core.decode.fused` (`step`, its layers in one C call where that runs; `python layers`:
the same step with the layers driven from Python, as before core/decode/_layer_step.c), the step's 97 int4
products alone on its own packed weights in call order with random bf16 inputs (`int4 back to back`), and the
same with one or eight `torch.rms_norm` calls on 896 values after each product (`+1 op`, `+8 ops`): the cost of
a small torch op between products, including what it does to the next product. Step minus back to back is the
time a step loses outside the int4 kernel (Python, dispatch, the small ops). `generate` is what the app pays a
token: 1000 / decode_tok_s of `engine.generate` (greedy, 64 tokens, median of 3), as `bench.decode` reports
it (there with the prompt cache off, which changes the first token, not decode); generate minus step is the
decode loop's own time (rows, events, text). Print only; for an AVX2 laptop emulated:
`ATEN_CPU_CAPABILITY=avx2 python -m bench.step_gap > bench/results/step_gap_<cpu>.txt`.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import models.int4_kernel as ik
from bench.decode import default_config
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


class Timers:
    """The default engine of `model_id` and the times `main` prints, each a call returning ms (median of `n`)."""

    def __init__(self, model_id: str, n: int = 48):
        from core.loading import load_engine
        from core.prompting.chat_format import build_prompt_ids

        config = default_config(model_id)
        self.kv, self.n = config.kv, n
        self.engine = load_engine(config)
        self.fused, self.model = self.engine.fused, self.engine.model
        if self.fused is None:
            raise SystemExit("no fused decode step for this model here")
        self.parts = self.fused.parts()
        self.xs = [torch.randn(1, p.scales.shape[0] * p.group_size).to(torch.bfloat16) for p in self.parts]
        self.hidden = hidden = self.model.config.hidden_size
        self.small, self.weight = torch.randn(1, hidden).to(torch.bfloat16), torch.ones(hidden, dtype=torch.bfloat16)
        self.ids = torch.tensor([build_prompt_ids(self.engine.tokenizer, PROMPT)])

    def products(self, ops: int = 0) -> float:
        """The step's int4 products back to back, with `ops` small torch ops after each."""
        def run():
            for p, x in zip(self.parts, self.xs, strict=True):
                ik.int4_mm(x, p.data, p.group_size, p.scales)
                for _ in range(ops):
                    torch.rms_norm(self.small, (self.hidden,), self.weight, 1e-6)
        return median_ms(run, self.n)

    def norm_us(self) -> float:
        return median_ms(lambda: [torch.rms_norm(self.small, (self.hidden,), self.weight, 1e-6)
                                  for _ in range(100)]) * 10

    def step(self, layers_in_c: bool = True) -> float:
        """One greedy fused step (its layers in one C call, or driven from Python)."""
        from core.decode.cache import new_cache

        fused = self.fused
        plan = fused.plan
        fused.plan = plan if layers_in_c else None
        try:
            with torch.inference_mode():
                cache = new_cache(self.model.config, self.kv)
                self.model(input_ids=self.ids, cache=cache, use_cache=True, logits_to_keep=1)
                token = [torch.tensor([self.ids[0, -1].item()])]

                def one():
                    token[0] = fused.step(token[0], cache).argmax(-1)
                return median_ms(one, self.n)
        finally:
            fused.plan = plan

    def generate(self, tokens: int = 64, runs: int = 3) -> float:
        """ms a token of `engine.generate`, greedy: 1000 / its decode_tok_s, median of `runs`."""
        from core.config import SamplingConfig

        cfg = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=tokens, ignore_eos=True)
        self.engine.generate(PROMPT, cfg)
        return statistics.median(1e3 / self.engine.generate(PROMPT, cfg).stats.decode_tok_s for _ in range(runs))


def main(model_id: str = "qwen2.5-coder-0.5b-instruct") -> int:
    t = Timers(model_id)
    parts, fused = t.parts, t.fused
    print(f"# python -m bench.step_gap {model_id} on {cpu_name()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{ik.kernel_name()}, {torch.get_num_threads()} threads, {len(parts)} int4 products a step "
          f"({parts[0].data.dtype}: {'p32' if parts[0].data.dtype == torch.int8 else 'torch layout'}); ms")
    print(f"one torch.rms_norm on {t.hidden} values alone: {t.norm_us():.1f} us")
    for r in range(3):
        print(f"round {r}: generate {t.generate():.2f} | step {t.step():.2f} (layers in one C call: "
              f"{fused.plan is not None}) | python layers {t.step(False):.2f} | int4 back to back {t.products(0):.2f} "
              f"| +1 op between {t.products(1):.2f} | +8 ops {t.products(8):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
