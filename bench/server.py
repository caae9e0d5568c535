"""Local OpenAI server benchmark: requests/s, tokens/s and p50/p95 latency for 1, 4 and 16 concurrent clients,
against `ponder serve` on the embedded model in a subprocess (as a user runs it).

Each client sends its requests one after another: short prompts, greedy, `max_tokens` 32 with `ignore_eos`
so every request costs the same tokens, streamed (so time to first token is measured too). The server decodes
up to `--max-batch` requests together (default 4, as `ponder serve`): a request that arrives while others decode
joins at the next step; `--max-batch 1` answers one at a time (FIFO), the comparison. `python -m bench.server
[--max-tokens 32] [--model ID] [--max-batch N] [--rounds 3] [--tag T]`: the levels take turns, `--rounds` times
(in reverse order every other round), and each level's figures pool its rounds; writes
bench/results/server[_T].json and .md with the CPU name, load average and date. Before the levels it runs
`bench.joint_bound` (`--no-bound` skips it): what a joint step of 4 requests costs against one, the most 4 clients
can gain on this host.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx

from bench.machine import cpu_name
from models.registry import DEFAULT_MODEL_ID

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LEVELS = ((1, 8), (4, 4), (16, 2))  # (concurrent clients, requests per client): 8+ requests a level, so that a
# level lasts long enough for its requests/s to be steady on a host whose speed moves by ±10% minute to minute
PROMPTS = ["What is 2+2?", "Name a primary colour.", "Say hello in French.", "What is the capital of Italy?",
           "Give one prime number.", "What is 10 minus 3?", "Name a planet.", "Spell 'cat' backwards."]


def start_server(model: str, max_batch: int) -> tuple[subprocess.Popen, str]:
    """`ponder serve --port 0` in a subprocess; returns it and its /v1 URL once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", "0", "--model", model, "--max-batch",
                             str(max_batch)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT)
    for line in proc.stderr:
        match = re.search(r"^Serving \S+ at (http://\S+/v1)", line)
        if match:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining its log
            return proc, match.group(1)
    raise RuntimeError(f"ponder serve exited with {proc.wait()} before serving")


def one_request(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, tokens = None, 0
    with client.stream("POST", "/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"latency_s": time.perf_counter() - start, "ttft_s": first, "tokens": tokens}


def joint_bound(model: str) -> dict:
    """`bench.joint_bound` in a subprocess before the server starts: what one joint step of r requests costs."""
    out = subprocess.run([sys.executable, "-m", "bench.joint_bound", "--model", model], cwd=ROOT, check=True,
                         stdout=subprocess.PIPE, text=True).stdout  # its errors reach the terminal
    return json.loads(out.strip().splitlines()[-1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_level(url: str, model: str, clients: int, per_client: int, max_tokens: int) -> tuple[list[dict], float]:
    """One level once: every request's record and the wall time it took."""
    def client_run(k: int) -> list[dict]:
        with httpx.Client(base_url=url, timeout=3600) as client:
            return [one_request(client, model, PROMPTS[(k + i) % len(PROMPTS)], max_tokens) for i in range(per_client)]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client_run, range(clients)) for r in rs]
    return results, time.perf_counter() - start


def summarise(clients: int, runs: list[tuple[list[dict], float]]) -> dict:
    """A level over its rounds: requests/s over the summed wall time, latencies pooled, and each round's rate."""
    results = [r for rs, _ in runs for r in rs]
    wall = sum(w for _, w in runs)
    latencies = [r["latency_s"] for r in results]
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    return {"clients": clients, "requests": len(results), "wall_s": round(wall, 2),
            "requests_per_s": round(len(results) / wall, 3),
            "rounds_requests_per_s": [round(len(rs) / w, 3) for rs, w in runs],
            "tokens_per_s": round(sum(r["tokens"] for r in results) / wall, 2),
            "p50_s": round(statistics.median(latencies), 2), "p95_s": round(percentile(latencies, 0.95), 2),
            "ttft_p50_s": round(statistics.median(ttfts), 2) if ttfts else None,
            "ttft_p95_s": round(percentile(ttfts, 0.95), 2) if ttfts else None}


def markdown(result: dict) -> str:
    lines = ["| clients | requests | requests/s | tokens/s | p50 latency s | p95 latency s | p50 TTFT s | p95 TTFT s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["levels"]:
        lines.append(f"| {r['clients']} | {r['requests']} | {r['requests_per_s']:.3f} | {r['tokens_per_s']:.1f} | "
                     f"{r['p50_s']:.2f} | {r['p95_s']:.2f} | {r['ttft_p50_s']:.2f} | {r['ttft_p95_s']:.2f} |")
    by_clients = {r["clients"]: r for r in result["levels"]}
    if 1 in by_clients and 4 in by_clients:
        ratio = by_clients[4]["requests_per_s"] / by_clients[1]["requests_per_s"]
        rounds = [f"{a / b:.2f}" for a, b in zip(by_clients[4].get("rounds_requests_per_s", []),
                                                by_clients[1].get("rounds_requests_per_s", []), strict=False)]
        lines += ["", f"4 clients against 1: **{ratio:.2f}×** the requests/s"
                  + (f" (round by round: {', '.join(rounds)}×)." if len(rounds) > 1 else ".")]
    bound = result.get("joint_bound")
    if bound:
        ms = bound["step_ms"]
        lines += ["", f"Bound (`bench.joint_bound`, before the levels): one engine step of 1 / 2 / 4 / 8 single-row "
                  f"requests takes {ms['1']} / {ms['2']} / {ms['4']} / {ms['8']} ms (medians of {bound['rounds']} "
                  f"rounds), so 4 clients can get at most **{bound['max_gain']['4']:.2f}×** one client's tokens/s."]
    weights = (bound or {}).get("precision", "W4").upper()
    lines += ["", f"`ponder serve --max-batch {result.get('max_batch', 1)}` ({result['model']}, {weights}, int8 KV), "
              f"{result['max_tokens']} greedy tokens per request "
              f"(ignore_eos), streamed; {result['cpu']}, {result['cpus']} CPUs, load average "
              f"{result['load_before']} before / {result['load_after']} after; {result['date']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL_ID)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=4, help="the server's --max-batch (default 4)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times every level runs, the levels taking turns (a 2-core host's speed drifts minute "
                             "to minute; interleaved rounds share the drift between levels)")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--json", action="store_true", help="print the JSON result")
    parser.add_argument("--no-bound", action="store_true", help="skip bench.joint_bound (the step-cost bound)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    bound = None if args.no_bound else joint_bound(args.model)
    load_before = [round(x, 2) for x in os.getloadavg()]
    proc, url = start_server(args.model, args.max_batch)
    result = {"model": args.model, "max_tokens": args.max_tokens, "max_batch": args.max_batch, "levels": [],
              "rounds": args.rounds,
              "tag": args.tag, "cpu": cpu_name(), "joint_bound": bound,
              "cpus": os.cpu_count(), "load_before": load_before, "python": platform.python_version()}
    try:
        with httpx.Client(base_url=url, timeout=3600) as client:
            one_request(client, args.model, "Hi", 4)  # warm-up: first-call kernel and cache setup
        runs: dict[int, list] = {clients: [] for clients, _ in LEVELS}
        for round_ in range(args.rounds):
            for clients, per_client in LEVELS if round_ % 2 == 0 else LEVELS[::-1]:  # each level after each other
                runs[clients].append(run_level(url, args.model, clients, per_client, args.max_tokens))
                result["levels"] = [summarise(c, r) for c, r in runs.items() if r]
                result.update(load_after=[round(x, 2) for x in os.getloadavg()],
                              date=datetime.now().strftime("%Y-%m-%d %H:%M"))
                save(result)  # after each level, so a long run keeps what it measured
                print(json.dumps(summarise(clients, runs[clients][-1:])), file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    print(json.dumps(result) if args.json else markdown(result))
    return 0


def save(result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "server" + (f"_{result['tag']}" if result.get("tag") else "")
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(result))


if __name__ == "__main__":
    raise SystemExit(main())
