"""bench.decode --rounds: systems measured again in interleaved rounds, each round's ratio to llama.cpp's Q4_0."""
from __future__ import annotations

import argparse

import pytest

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


def test_paired_bursts_alternate_the_order_and_split_the_ratios_by_the_bus(monkeypatch, tmp_path):
    """bench.paired_decode: pair i runs A then B when i is even, B then A when odd; each pair's ratio is A/B; the
    summary's halves split the pairs at the median bus read before them."""
    from bench import machine, paired_decode

    order, buses = [], iter([60.0, 30.0, 61.0, 31.0])  # the halves are by bus, not by position
    rates = {"ponder": iter([90.0, 96.0, 120.0, 130.0]), "llama_cpp_q4_0": iter([80.0, 80.0, 80.0, 80.0])}

    class Worker:
        def __init__(self, name, args):
            self.name, self.info = name, {"system": name}

        def run(self):
            order.append(self.name)
            return next(rates[self.name])

        def close(self):
            pass

    written = {}
    monkeypatch.setattr(paired_decode, "Worker", Worker)
    monkeypatch.setattr(paired_decode, "bus_gb_s", lambda buf: next(buses))
    monkeypatch.setattr(paired_decode, "BUFFER_MB", 1)
    monkeypatch.setattr(paired_decode.time, "sleep", lambda s: None)
    monkeypatch.setattr(paired_decode, "write_results", lambda stem, data, md, print_json=None:
                        written.update(stem=stem, data=data, md=md))
    assert paired_decode.main(["--pairs", "4", "--tag", "t"]) == 0
    assert order == ["ponder", "llama_cpp_q4_0", "llama_cpp_q4_0", "ponder"] * 2
    report = written["data"]
    assert [p["ratio"] for p in report["pairs"]] == [1.125, 1.2, 1.5, 1.625]
    s = report["summary"]
    assert s["median_ratio"] == 1.35 and s["median_bus_gb_s"] == 45.5 and report["stopped"] is None
    assert s["quartiles"] == pytest.approx([1.181, 1.531], abs=1e-3)  # inclusive: inside the data
    assert s["slow_bus"]["pairs"] == 2 and s["slow_bus"]["median_ratio"] == pytest.approx(1.4125, abs=1e-3)
    assert s["fast_bus"]["pairs"] == 2 and s["fast_bus"]["median_ratio"] == pytest.approx(1.3125, abs=1e-3)
    assert s["fast_bus"]["median_ponder_tok_s"] == 105.0 and s["slow_bus"]["median_ponder_tok_s"] == 113.0
    assert written["stem"] == "paired_decode_t" and any("**Median ratio 1.35**" in line for line in written["md"])
    assert machine.cpu_name()  # the report names its CPU


def test_paired_bursts_keep_the_pairs_measured_before_a_worker_stops(monkeypatch):
    from bench import paired_decode

    runs = iter([90.0, 80.0, 85.0])

    class Worker:
        def __init__(self, name, args):
            self.name, self.info = name, {"system": name}

        def run(self):
            value = next(runs, None)
            if value is None:
                raise paired_decode.WorkerStopped(f"the {self.name} worker stopped (exit -9)")
            return value

        def close(self):
            pass

    written = {}
    monkeypatch.setattr(paired_decode, "Worker", Worker)
    monkeypatch.setattr(paired_decode, "bus_gb_s", lambda buf: 30.0)
    monkeypatch.setattr(paired_decode, "BUFFER_MB", 1)
    monkeypatch.setattr(paired_decode.time, "sleep", lambda s: None)
    monkeypatch.setattr(paired_decode, "write_results", lambda stem, data, md, print_json=None: written.update(data=data))
    assert paired_decode.main(["--pairs", "5"]) == 0
    report = written["data"]
    assert len(report["pairs"]) == 1 and report["pairs"][0]["ratio"] == 1.125
    assert "stopped" in report["stopped"] and report["summary"]["quartiles"] == [1.125, 1.125]
