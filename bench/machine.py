"""What machine a benchmark ran on: every result file names its CPU (greedy text and speed differ between CPUs)."""
from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def per_call_s(fn, seconds: float = 0.3) -> float:
    """Seconds one call of `fn` takes: one warm-up call, then as many as fit in `seconds`."""
    import time

    fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls


def write_results(stem: str, data: dict, md: list[str], print_json: bool | None = None) -> None:
    """bench/results/<stem>.json (the data) and <stem>.md (the table lines); then prints one of them
    (None: neither)."""
    import json

    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    (results / f"{stem}.json").write_text(json.dumps(data, indent=2))
    (results / f"{stem}.md").write_text("\n".join(md) + "\n")
    if print_json is not None:
        print(json.dumps(data) if print_json else "\n".join(md))
