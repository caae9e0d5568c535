"""bench.decode --rounds: systems measured again in interleaved rounds, each round's ratio to llama.cpp's Q4_0."""
from __future__ import annotations

import argparse

from bench import decode


def test_rounds_interleave_the_systems_and_take_the_median_of_per_round_ratios(monkeypatch):
    calls = []
    rates = {"ponder_w4fpt_a16kv8": iter([120.0, 90.0]), "llama_cpp_q4_0": iter([100.0, 100.0]),
             "ponder_w4fpt_a16kv8 [avx2-int16]": iter([60.0, 40.0])}

    def spawn(name, args, kernel=None, short=False):
        calls.append((name, kernel, short))
        return {"decode_tok_s": next(rates[name if kernel is None else f"{name} [{kernel}]"])}

    monkeypatch.setattr(decode, "spawn", spawn)
    row = {"ttft_s": 0.2, "peak_rss_mb": 1000}
    systems = {"ponder_w4fpt_a16kv8": {**row, "decode_tok_s": 110.0}, "llama_cpp_q4_0": {**row, "decode_tok_s": 100.0},
               "llama_cpp": {"error": "exit 1"}, "ponder_w4fpt_a16kv8 [avx2-int16]": {**row, "decode_tok_s": 50.0}}
    args = argparse.Namespace(rounds=3, model="qwen2.5-coder-0.5b-instruct")
    out = decode.rounds(systems, args)
    # failed systems are not rerun; the others alternate, decode only, kernel rows on their kernel
    assert calls == [("ponder_w4fpt_a16kv8", None, True), ("llama_cpp_q4_0", None, True),
                     ("ponder_w4fpt_a16kv8", "avx2-int16", True)] * 2
    assert out["decode_tok_s"] == {"ponder_w4fpt_a16kv8": [110.0, 120.0, 90.0], "llama_cpp_q4_0": [100.0, 100.0, 100.0],
                                   "ponder_w4fpt_a16kv8 [avx2-int16]": [50.0, 60.0, 40.0]}
    assert out["w4a16kv8_vs_llama_cpp_q4_0"] == [1.1, 1.2, 0.9]
    assert out["median_w4a16kv8_vs_llama_cpp_q4_0"] == 1.1
    report = {"systems": systems, "ratios": {}, "tokens": 128, "runs": 3, "threads": 2, "machine": "m", "date": "d",
              "rounds": out}
    text = decode.markdown(report)
    assert "1.100, 1.200, 0.900; **median 1.1**" in text and "50.0, 60.0, 40.0 (median 50.0)" in text
    assert "rounds" not in decode.markdown({**report, "rounds": {"decode_tok_s": {}}})  # every system failed
