"""`ponder bench NAME [ARGS…]`: the benchmarks a user can run, reached without importing them.

Benchmarks live in `bench/` beside the product, not in it: `ponder bench decode --runs 3` runs
`python -m bench.decode --runs 3` in the source checkout (each benchmark owns its flags: `ponder bench decode
--help`). The installed app has no benchmarks and says so.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHES = {
    "decode": "decode speed, TTFT, memory: HF baselines vs Ponder vs llama.cpp",
    "quant": "quantization fidelity, accuracy and speed per weight/KV format",
    "sparse": "speed and accuracy of each efficient-decode mode",
    "memory": "resident memory of `ponder ask` and of the open window",
    "server": "local server requests/s and p50/p95 latency for 1, 4 and 16 clients",
    "machine_bounds": "this CPU's memory bandwidth and dot-product rates, and the decode bounds they set",
    "first_answer": "a fresh clone's wait for its first answer, stage by stage",
}
SOURCE = Path(__file__).resolve().parents[2]


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks (from a source checkout): " + ", ".join(BENCHES))
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    for name, text in BENCHES.items():
        bsub.add_parser(name, help=f"{text} (`ponder bench {name} --help`)", add_help=False)


def cmd_bench(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHES:
        print(f"ponder bench: choose a benchmark: {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    if getattr(sys, "frozen", False) or not (SOURCE / "bench" / f"{argv[0]}.py").is_file():
        print("ponder bench: the benchmarks run from a source checkout of Ponder (see README)", file=sys.stderr)
        return 1
    return subprocess.run([sys.executable, "-m", f"bench.{argv[0]}", *argv[1:]], cwd=SOURCE).returncode
