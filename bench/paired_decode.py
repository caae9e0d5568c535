"""Ponder against llama.cpp's Q4_0 in alternating bursts, so both decode on the same state of a drifting bus.

This host's read rate moves between phases of ~29 and ~50 GB/s that last tens of seconds (`bench.bus_drift`), and
`bench.decode --rounds` runs each system in a process of its own, a minute apart: a round's ratio then depends on
which phase each process met. Here both stay loaded, each in a worker process of its own (no two OpenMP runtimes
in one process), and take turns: a pair is one greedy generation of `--tokens` tokens by each, in alternating
order (AB, BA, ...), with the bus read between pairs (torch's sum over 512 MB on torch's threads, the cores). The
ratio of a pair compares runs a second apart. Writes bench/results/paired_decode[_<tag>].{json,md}: every pair, the
median ratio and its quartiles, and the medians on the pairs at or below the median bus and above it.
`PYTHONPATH=<a llama-cpp-python build> python -m bench.paired_decode --pairs 40 --tag amd_native`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.bus_drift import BUFFER_MB, bus_gb_s
from bench.machine import cpu_features, cpu_name, write_results

MARK = "@@ "
"""Marks a worker's reply, wherever it starts in a line (anything else a library prints is passed over)."""
SYSTEMS = ("ponder", "ponder:avx2", "llama_cpp_q4_0")
"""`ponder:avx2`: Ponder in a worker whose torch and int4 kernel are held to AVX2 (ATEN_CPU_CAPABILITY=avx2)."""


def worker(name: str, model_id: str, tokens: int, repack: bool) -> int:
    """Loads `name`, warms it, then runs one generation for each line on stdin and replies with its tok/s."""
    if name.startswith("ponder"):
        from bench.decode import default_config, default_system
        from bench.peers import PROMPT
        from core.config import SamplingConfig
        from core.loading import load_engine
        from models import int4_kernel
        from models.int4_kernel import kernel_name

        engine = load_engine(default_config(model_id, prompt_cache_tokens=0))
        cfg = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=tokens, ignore_eos=True)

        def once() -> float:
            return engine.generate(PROMPT, cfg).stats.decode_tok_s
        info = {"system": default_system(model_id), "int4_kernel": kernel_name(),
                "int4_layout": "p32" if int4_kernel.P32 else "torch"}
    else:
        from bench.peers import llama_build, llama_cpp_once, load_llama_cpp

        llm, ids, _ = load_llama_cpp(model_id, repack, q4_0=True)

        def once() -> float:
            return llama_cpp_once(llm, ids, tokens)[1]
        info = {"system": "llama_cpp_q4_0" if repack else "llama_cpp_q4_0_norepack", "llama_cpp": llama_build()}
    once()
    print(MARK + json.dumps(info), flush=True)
    for _ in sys.stdin:
        print(MARK + json.dumps({"tok_s": once()}), flush=True)
    return 0


class WorkerStopped(RuntimeError):
    pass


class Worker:
    def __init__(self, name: str, args):
        self.name = name
        cmd = [sys.executable, "-m", "bench.paired_decode", "--worker", name, "--model", args.model,
               "--tokens", str(args.tokens)] + ([] if args.repack else ["--no-repack"])
        env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2") if name.endswith(":avx2") else None
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=Path(__file__).resolve().parent.parent)
        self.info = self.reply()

    def reply(self) -> dict:
        for line in self.proc.stdout:
            if MARK in line:  # a library's own output may share the line
                try:
                    return json.loads(line.split(MARK, 1)[1])
                except ValueError:
                    raise WorkerStopped(f"the {self.name} worker's reply was cut short: {line!r}") from None
        raise WorkerStopped(f"the {self.name} worker stopped (exit {self.proc.wait()})")

    def run(self) -> float:
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise WorkerStopped(f"the {self.name} worker stopped (exit {self.proc.wait()})") from None
        return self.reply()["tok_s"]

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def summary(pairs: list[dict], systems: tuple[str, str]) -> dict:
    ratios = [p["ratio"] for p in pairs]
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    cut = statistics.median(p["bus_gb_s"] for p in pairs)
    halves = {"slow_bus": [p for p in pairs if p["bus_gb_s"] <= cut], "fast_bus": [p for p in pairs if p["bus_gb_s"] > cut]}
    out = {"pairs": len(pairs), "median_ratio": round(statistics.median(ratios), 3),
           "quartiles": [round(q[0], 3), round(q[2], 3)],
           "geometric_mean_ratio": round(statistics.geometric_mean(ratios), 3),
           "share_at_least_1_3": round(sum(r >= 1.3 for r in ratios) / len(ratios), 3),
           **{f"median_{s}_tok_s": round(statistics.median(p[s] for p in pairs), 1) for s in systems},
           "median_bus_gb_s": round(cut, 1)}
    for half, members in halves.items():
        if members:
            out[half] = {"pairs": len(members), "median_ratio": round(statistics.median(p["ratio"] for p in members), 3),
                         **{f"median_{s}_tok_s": round(statistics.median(p[s] for p in members), 1) for s in systems}}
    return out


def markdown(report: dict) -> list[str]:
    s, (a, b) = report["summary"], report["systems"]
    lines = [f"# bench.paired_decode: {report['model']} on {report['machine']}, {report['date']}, "
             f"{report['tokens']} tokens a generation; ratio = {a} / {b}", "",
             f"| pair | order | bus GB/s | {a} tok/s | {b} tok/s | ratio |", "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {i} | {p['order']} | {p['bus_gb_s']:.1f} | {p[a]:.1f} | {p[b]:.1f} | {p['ratio']:.3f} |"
              for i, p in enumerate(report["pairs"])]
    lines += ["", f"**Median ratio {s['median_ratio']}** over {s['pairs']} pairs (quartiles {s['quartiles'][0]}–"
              f"{s['quartiles'][1]}; geometric mean {s['geometric_mean_ratio']}; {100 * s['share_at_least_1_3']:.0f}% "
              f"of pairs at 1.3× or more). Medians: {a} {s[f'median_{a}_tok_s']} tok/s, {b} "
              f"{s[f'median_{b}_tok_s']} tok/s, bus {s['median_bus_gb_s']} GB/s."]
    for half in ("slow_bus", "fast_bus"):
        if half in s:
            h = s[half]
            lines.append(f"- {half.replace('_', ' ')} ({h['pairs']} pairs): ratio {h['median_ratio']}, {a} "
                         f"{h[f'median_{a}_tok_s']}, {b} {h[f'median_{b}_tok_s']} tok/s")
    lines.append("\n" + " ".join(f"{k}: {v}." for k, v in report["workers"].items()))
    lines.append(f"CPU flags: {' '.join(report['cpu_features']['flags'])}.")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--systems", nargs=2, choices=SYSTEMS, default=["ponder", "llama_cpp_q4_0"],
                   help="the two systems; the ratio is the first's tok/s over the second's")
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--no-repack", dest="repack", action="store_false",
                   help="llama.cpp on plain CPU buffers (where its repacked ones crash)")
    p.add_argument("--tag", default="")
    p.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.model, args.tokens, args.repack)
    systems = tuple(args.systems)
    if systems[0] == systems[1]:
        raise SystemExit("bench.paired_decode: give two different systems")
    workers: dict[str, Worker] = {}
    pairs, stopped = [], None
    try:
        for name in systems:
            workers[name] = Worker(name, args)
        buf = torch.ones(BUFFER_MB * 2**20 // 4)
        for i in range(args.pairs):
            order = systems if i % 2 == 0 else systems[::-1]
            pair = {"order": "AB" if i % 2 == 0 else "BA", "bus_gb_s": round(bus_gb_s(buf), 2)}
            for name in order:
                time.sleep(0.05)  # the other worker's threads are idle
                pair[name] = round(workers[name].run(), 2)
            pair["ratio"] = round(pair[systems[0]] / pair[systems[1]], 4)
            pairs.append(pair)
            print(f"[{i}] {pair}", file=sys.stderr, flush=True)
    except WorkerStopped as e:  # keep the pairs measured so far
        stopped = str(e)
        print(f"[bench] {stopped}; writing the {len(pairs)} pairs measured", file=sys.stderr)
    finally:
        for w in workers.values():
            w.close()
    if not pairs:
        raise SystemExit(f"bench.paired_decode: no pair measured ({stopped})")
    report = {"model": args.model, "machine": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "tokens": args.tokens, "threads": torch.get_num_threads(), "cpu_features": cpu_features(),
              "systems": systems, "workers": {k: w.info for k, w in workers.items()}, "pairs": pairs,
              "summary": summary(pairs, systems), "stopped": stopped}
    write_results(f"paired_decode{'_' + args.tag if args.tag else ''}", report, markdown(report), print_json=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
