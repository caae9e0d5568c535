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


FEATURES = ("avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi", "avx512_bf16",
            "amx_tile", "amx_int8", "amx_bf16", "asimd", "sve")
"""The CPU flags that decide which kernels run (Ponder's int4 paths, torch's packing, llama.cpp's builds)."""


def cpu_features() -> dict:
    """The flags of FEATURES this CPU has, torch's CPU capability (what it packs int4 weights for; lowered by
    ATEN_CPU_CAPABILITY, as when an AVX2 laptop is emulated) and that variable."""
    import os

    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        capability = None
    return {"flags": [f for f in FEATURES if f in flags], "torch_capability": capability,
            "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY")}


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
