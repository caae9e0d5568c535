"""Decode benchmark: HF transformers baselines vs Ponder's precisions/KV formats vs llama.cpp, one run, one prompt.

Each system runs in its own subprocess (`--one NAME`) so its peak RSS is its own and a crash (llama.cpp's
AMX path segfaults on some VMs) cannot take the benchmark down. Batch 1, greedy, a fixed number of new
tokens (end-of-turn ignored), median of --runs. Writes bench/results/decode.json and decode.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.machine import cpu_features, cpu_name
from bench.peers import LONG_PROMPTS, PROMPT, llama_available, llama_build, long_prompt, run_hf, run_llama_cpp

RESULTS = Path(__file__).resolve().parent / "results"
PONDER_SYSTEMS = {  # name: (precision, kv, head_bits, int4 group size)
    "ponder_bf16_kvbf16": ("bf16", "bf16", 4, 128),
    "ponder_bf16_kv8": ("bf16", "int8", 4, 128),
    "ponder_w8_kv8": ("w8", "int8", 8, 128),
    "ponder_w4_head8_kv8": ("w4", "int8", 8, 128),
    "ponder_w4_kvbf16": ("w4", "bf16", 4, 128),
    "ponder_w4a16kv8": ("w4", "int8", 4, 128),
    "ponder_w4a16kv8_g32": ("w4", "int8", 4, 32),
    "ponder_w4fpt_kvbf16": ("w4-fpt", "bf16", 4, 128),
    "ponder_w4fpt_a16kv8": ("w4-fpt", "int8", 4, 128),
}
DEFAULT_SYSTEM = "ponder_w4fpt_a16kv8"
"""The app's default for the embedded model: W4-FPT weights, bf16 activations, int8 KV (W4A16KV8)."""


def default_system(model_id: str) -> str:
    """The system a model runs in the app: its default weights (models.registry) at W4A16KV8."""
    from models.registry import default_precision

    return DEFAULT_SYSTEM if default_precision(model_id) == "w4-fpt" else "ponder_w4a16kv8"


def default_config(model_id: str, **extra):
    """The EngineConfig of `default_system(model_id)`, with `extra` fields (e.g. prompt_cache_tokens=0)."""
    from core.config import EngineConfig

    precision, kv, head_bits, group = PONDER_SYSTEMS[default_system(model_id)]
    return EngineConfig(model_id=model_id, precision=precision, kv=kv, head_bits=head_bits, group_size=group, **extra)

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
VARIANTS = {  # the default system run another way: name → what it measures
    "ponder_w4a16kv8_reason": "decode under the reasoning adapter (Reason mode's thinking tokens)",
    "ponder_w4a16kv8_parallel8": "8 answers from one prefill, aggregate tokens/s",
    "griffin": "GRIFFIN: the prompt keeps half of each layer's feed-forward neurons (selection inside TTFT)",
    "griffin_caprese": "GRIFFIN plus the model's Caprese low-rank branches",
    "cats": "CATS: per-layer thresholds on |SiLU(gate)| zero half of the feed-forward activations (dense kernels)",
    "cats_caprese": "CATS plus the model's Caprese low-rank branches fitted for CATS",
}
SPARSE_DECODE = {"griffin": "griffin", "griffin_caprese": "griffin+caprese", "cats": "cats", "cats_caprese": "cats+caprese"}
"""The variants that decode with a sparse feed-forward: bench name → the engine's `decode` mode."""


@contextlib.contextmanager
def quiet_machine():
    """Hold the machine's benchmark lock while timing: a long job started under the same lock (for example
    `flock "$TMPDIR/ponder-bench.lock" ponder train caprese`) finishes before a measurement starts, and waits
    for one that has started."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "ponder-bench.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_ponder(name: str, model_id: str, tokens: int, runs: int, ff_keep: float = 0.5, ff_reselect: int = 0,
               long: bool = True) -> dict:
    from core.config import EngineConfig, SamplingConfig
    from core.loading import load_engine
    from models import int4_kernel
    from models.int4_kernel import kernel_name

    variant = name if name in VARIANTS else None
    precision, kv, head_bits, group = PONDER_SYSTEMS[default_system(model_id) if variant else name]
    decode = SPARSE_DECODE.get(variant, "dense")
    engine = load_engine(EngineConfig(model_id=model_id, precision=precision, kv=kv, head_bits=head_bits,
                                      group_size=group, decode=decode,  # the base model, as llama.cpp and HF run
                                      ff_keep=ff_keep, ff_reselect=ff_reselect,
                                      prompt_cache_tokens=0),  # each run's TTFT a cold prefill of the same prompt
                         reasoning=variant == "ponder_w4a16kv8_reason")
    if decode != "dense" and engine.missing_for_decode():
        raise SystemExit(engine.missing_for_decode())
    cfg = SamplingConfig(temperature=0, repetition_penalty=1.0, max_tokens=tokens, ignore_eos=True)
    if variant == "ponder_w4a16kv8_reason":
        if engine.adapter_name is None:
            raise SystemExit("no reasoning adapter for this model")
        kw = {"mode": "reason", "budget": tokens, "answer_max_tokens": 4}
    else:
        kw = {}

    def generate():
        if variant == "ponder_w4a16kv8_parallel8":
            from core.engine import collect

            return collect(engine.parallel(PROMPT, replace(cfg, temperature=0.7, seed=0), n=8, mode="base"))
        return engine.generate(PROMPT, cfg, **kw)

    engine.generate(PROMPT, SamplingConfig(temperature=0, max_tokens=8, ignore_eos=True), **kw)  # warm-up
    ttfts, rates, answer = [], [], None
    for _ in range(runs):
        answer = generate()
        ttfts.append(answer.stats.ttft_s)
        rates.append(answer.stats.decode_tok_s)
    cached = answer.stats.prompt_tokens + answer.stats.completion_tokens - 1
    out = {"ttft_s": statistics.median(ttfts), "decode_tok_s": statistics.median(rates),
           "kv_bytes_per_token": answer.stats.kv_cache_bytes / cached, "prompt_tokens": answer.stats.prompt_tokens,
           "sample": answer.text[:160], "int4_kernel": kernel_name(), "int4_layout": "p32" if int4_kernel.P32 else "torch"}
    if variant:
        out["what"] = VARIANTS[variant]
        out["kv_bytes_per_token"] = None
    selection = getattr(engine.last_cache, "ff_selection", None)
    if selection is not None:
        out["selection_build_s"] = selection.build_s
    if name == default_system(model_id) and long:
        for n in LONG_PROMPTS:
            text = long_prompt(engine.tokenizer, n)
            engine.generate(text, replace(cfg, max_tokens=1))  # warm-up at this length
            out[f"ttft_{n}_s"] = statistics.median([engine.generate(text, replace(cfg, max_tokens=1)).stats.ttft_s
                                                    for _ in range(2)])
        out.update(kv_allocation(engine))
    return out


def kv_allocation(engine, contexts=(2048, 8192)) -> dict:
    """Allocated bytes of the int8 and the bf16 cache after a real prefill of each context length plus a few decode
    steps (buffers as they lie in memory, not bytes per token times tokens)."""
    import torch

    from core.decode.cache import allocated_bytes, new_cache

    out = {}
    for n in contexts:
        ids = torch.randint(1000, 20000, (1, n))
        sizes = {}
        for kv in ("bf16", "int8"):
            cache = new_cache(engine.model.config, kv)
            with torch.inference_mode():
                for start in range(0, n, 1024):
                    engine.model(input_ids=ids[:, start:start + 1024], cache=cache, use_cache=True, logits_to_keep=1)
                for _ in range(4):
                    engine.model(input_ids=ids[:, :1], cache=cache, use_cache=True, logits_to_keep=1)
            sizes[kv] = allocated_bytes(cache)
            del cache
        out[f"kv_allocated_{n}"] = sizes
    return out


def prepare(name: str, model_id: str) -> None:
    from core.config import EngineConfig
    from core.loading import load_model
    from core.storage.model_store import ModelStore

    precision, kv, head_bits, group = PONDER_SYSTEMS[default_system(model_id) if name in VARIANTS else name]
    load_model(ModelStore().get(model_id), EngineConfig(model_id=model_id, precision=precision, kv=kv,
                                                         head_bits=head_bits, group_size=group))


def one(name: str, model_id: str, tokens: int, runs: int, ff_keep: float = 0.5, ff_reselect: int = 0,
        long: bool = True) -> dict:
    if name in ("hf_fp32", "hf_bf16"):
        out = run_hf(name[3:], model_id, tokens, runs)
    elif name.startswith("llama_cpp"):
        out = run_llama_cpp(model_id, tokens, runs, repack=not name.endswith("norepack"), q4_0="q4_0" in name, long=long)
    else:
        out = run_ponder(name, model_id, tokens, runs, ff_keep, ff_reselect, long)
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def spawn(name: str, args, kernel: str | None = None, short: bool = False) -> dict | None:
    """`name` measured in a process of its own; `kernel`: the int4 kernel path it must run on (PONDER_INT4_KERNEL),
    `PATH@torch` on torch's packing where the path would move the weights into Ponder's p32 (PONDER_INT4_LAYOUT);
    `short`: decode only, without the long prompts' first-token times."""
    kernel, _, layout = (kernel or "").partition("@")
    env = dict(os.environ, PONDER_INT4_KERNEL=kernel, PONDER_INT4_LAYOUT=layout) if kernel else None
    cmd = [sys.executable, "-m", "bench.decode", "--one", name, "--tokens", str(args.tokens), "--runs",
           str(args.runs), "--model", args.model, "--ff-keep", str(args.ff_keep), "--ff-reselect", str(args.ff_reselect)]
    if short or kernel and not layout:  # prompts past CHUNKED_ROWS and the cache's size do not depend on the decode
        cmd.append("--short")  # kernel (on AVX2 they do depend on the layout: p32 prompts run on Ponder's kernel)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent, env=env)
    if proc.returncode != 0:
        print(f"[bench] {name} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}",
              file=sys.stderr)
        return {"error": f"exit {proc.returncode}"}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if kernel and (result.get("int4_kernel") != f"ponder {kernel}" or layout and result.get("int4_layout") != layout):
        return {"error": f"asked for the {kernel} kernel ({layout or 'its layout'}), ran on "
                         f"{result.get('int4_kernel')} ({result.get('int4_layout')})"}
    print(f"[bench] {name}: {result['decode_tok_s']:.1f} tok/s, TTFT {result['ttft_s']:.3f}s, "
          f"RSS {result['peak_rss_mb']:.0f} MB", file=sys.stderr)
    return result


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def summarize(systems: dict, model_id: str = DEFAULT_MODEL) -> dict:
    ok = {k: v for k, v in systems.items() if v and "error" not in v}
    ours = ok.get(default_system(model_id), {})
    llama = ok.get("llama_cpp") or ok.get("llama_cpp_norepack")
    q4_0 = ok.get("llama_cpp_q4_0") or ok.get("llama_cpp_q4_0_norepack")
    ratios = {
        "w4a16kv8_vs_llama_cpp_q4_0": ratio(ours.get("decode_tok_s"), q4_0["decode_tok_s"]) if q4_0 else None,
        "w4a16kv8_vs_hf_fp32": ratio(ours.get("decode_tok_s"), ok.get("hf_fp32", {}).get("decode_tok_s")),
        "w4a16kv8_vs_hf_bf16": ratio(ours.get("decode_tok_s"), ok.get("hf_bf16", {}).get("decode_tok_s")),
        "w4a16kv8_vs_llama_cpp": ratio(ours.get("decode_tok_s"), llama["decode_tok_s"]) if llama else None,
        "kv_int8_vs_bf16_bytes": ratio(ours.get("kv_bytes_per_token"),
                                       ok.get("ponder_w4fpt_kvbf16", {}).get("kv_bytes_per_token")),
        "parallel8_vs_1": ratio(ok.get("ponder_w4a16kv8_parallel8", {}).get("decode_tok_s"), ours.get("decode_tok_s")),
        "reason_vs_base": ratio(ok.get("ponder_w4a16kv8_reason", {}).get("decode_tok_s"), ours.get("decode_tok_s")),
    }
    for name in SPARSE_DECODE:
        ratios[f"{name}_vs_dense"] = ratio(ok.get(name, {}).get("decode_tok_s"), ours.get("decode_tok_s"))
    for n in LONG_PROMPTS:
        ratios[f"ttft_{n}_vs_llama_cpp"] = ratio(ours.get(f"ttft_{n}_s"), (llama or {}).get(f"ttft_{n}_s"))
    for key, sizes in ours.items():
        if key.startswith("kv_allocated_"):
            ratios[f"kv_int8_vs_bf16_allocated_{int(key.rsplit('_', 1)[1]) // 1024}k"] = ratio(sizes["int8"],
                                                                                              sizes["bf16"])
    return ratios


def markdown(report: dict) -> str:
    rows = ["| system | decode tok/s | TTFT s | peak RSS MB | KV bytes/token |", "|---|---:|---:|---:|---:|"]
    for name, r in report["systems"].items():
        if not r or "error" in r:
            rows.append(f"| {name} | failed ({(r or {}).get('error', '?')}) | | | |")
            continue
        kv = f"{r['kv_bytes_per_token']:.0f}" if r.get("kv_bytes_per_token") else "—"
        rows.append(f"| {name} | {r['decode_tok_s']:.1f} | {r['ttft_s']:.3f} | {r['peak_rss_mb']:.0f} | {kv} |")
    rows.append("")
    for name, r in report["systems"].items():
        long = [f"{n} tokens {r[f'ttft_{n}_s']:.2f} s" for n in LONG_PROMPTS if (r or {}).get(f"ttft_{n}_s")]
        if long:
            rows.append(f"- {name} time to first token: " + ", ".join(long))
        if (r or {}).get("what"):
            built = r.get("selection_build_s")
            rows.append(f"- {name}: {r['what']}" + ("" if built is None else
                                                   f"; building its cut weights took {built * 1000:.0f} ms of the TTFT"))
    rows += [f"- `{k}`: {v}" for k, v in report["ratios"].items()]
    r = report.get("rounds") or {}
    if r.get("decode_tok_s"):
        def listed(values, fmt):
            return ", ".join("—" if v is None else format(v, fmt) for v in values)

        rows.append(f"\n{len(next(iter(r['decode_tok_s'].values())))} interleaved rounds (the first is the table above), "
                    "decode tok/s:")
        for n, vs in r["decode_tok_s"].items():
            done = [v for v in vs if v is not None]
            rows.append(f"- {n}: {listed(vs, '.1f')} (median {statistics.median(done):.1f})" if done else f"- {n}: —")
        if r.get("median_w4a16kv8_vs_llama_cpp_q4_0"):
            rows.append(f"- ratio to llama.cpp's Q4_0, round by round: {listed(r['w4a16kv8_vs_llama_cpp_q4_0'], '.3f')}; "
                        f"**median {r['median_w4a16kv8_vs_llama_cpp_q4_0']}**")
    rows.append(f"\n{report['tokens']} new tokens, median of {report['runs']} runs, {report['threads']} threads, "
                f"{report['machine']}, {report['date']}.")
    features = report.get("cpu_features")
    if features:
        rows.append(f"CPU flags: {' '.join(features['flags'])}; torch packs int4 for {features['torch_capability']}"
                    + (f" (ATEN_CPU_CAPABILITY={features['ATEN_CPU_CAPABILITY']})"
                       if features["ATEN_CPU_CAPABILITY"] else "")
                    + f"; int4 kernel: {report.get('int4_decode_kernel')}.")
    if report.get("llama_cpp_build"):
        rows.append(f"llama.cpp: llama-cpp-python {report['llama_cpp_build']['version']}, "
                    f"{report['llama_cpp_build']['system_info'].strip()}")
    return "\n".join(rows) + "\n"


def rounds(systems: dict, args) -> dict:
    """Measures the systems that ran again, `args.rounds - 1` more times, interleaved (decode only, each in a process of
    its own), so that a host whose speed drifts over minutes moves every system alike: each round's ratio of Ponder's
    default to llama.cpp's Q4_0 compares runs made a minute apart, and their median is the figure to quote."""
    names = [n for n, r in systems.items() if r and "error" not in r]
    rates = {n: [systems[n]["decode_tok_s"]] for n in names}
    for _ in range(args.rounds - 1):
        for n in names:
            base, _, kernel = n.partition(" [")  # a --kernels row: '<system> [<path>]'
            rates[n].append((spawn(base, args, kernel.rstrip("]") or None, short=True) or {}).get("decode_tok_s"))
    out = {"decode_tok_s": rates}
    ours = rates.get(default_system(args.model))
    q4_0 = rates.get("llama_cpp_q4_0") or rates.get("llama_cpp_q4_0_norepack")
    if ours and q4_0:
        per = [ratio(a, b) for a, b in zip(ours, q4_0, strict=True)]
        out["w4a16kv8_vs_llama_cpp_q4_0"] = per
        out["median_w4a16kv8_vs_llama_cpp_q4_0"] = round(statistics.median(r for r in per if r), 3) if any(per) else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.decode")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    p.add_argument("--short", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tag", default="", help="suffix of the result files (a CPU family, a kernel)")
    p.add_argument("--ff-keep", type=float, default=0.5, help="share of neurons the GRIFFIN variants keep")
    p.add_argument("--ff-reselect", type=int, default=0, help="GRIFFIN variants: reselect every N steps (0: never)")
    p.add_argument("--systems", nargs="+", default=None, metavar="NAME",
                   help="run only these (written to decode_subset.json/.md, the full table stays)")
    p.add_argument("--kernels", nargs="+", default=(), metavar="PATH",
                   help="also run the model's default system on each of these int4 kernel paths "
                        "(PONDER_INT4_KERNEL values; PATH@torch: on torch's packing, not p32), as rows "
                        "'<system> [<path>]' of the same run")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure the systems this many times, interleaved, and give each round's ratio to "
                        "llama.cpp's Q4_0 and their median (a host whose speed drifts moves all systems alike)")
    args = p.parse_args(argv)
    if args.one:
        with quiet_machine():
            print(json.dumps(one(args.one, args.model, args.tokens, args.runs, args.ff_keep, args.ff_reselect,
                                 long=not args.short)))
        return 0
    if args.prepare:
        prepare(args.prepare, args.model)
        return 0
    names = ["hf_bf16", default_system(args.model)] if args.quick else ["hf_fp32", "hf_bf16", *PONDER_SYSTEMS, *VARIANTS]
    if args.systems:
        unknown = set(args.systems) - {"hf_fp32", "hf_bf16", *PONDER_SYSTEMS, *VARIANTS, "llama_cpp", "llama_cpp_q4_0"}
        if unknown:
            p.error(f"unknown systems: {', '.join(sorted(unknown))}")
        names = [n for n in args.systems if not n.startswith("llama_cpp")]
    for name in names:  # quantize-once happens here, so the measured processes only restore
        if name in PONDER_SYSTEMS or name in VARIANTS:
            subprocess.run([sys.executable, "-m", "bench.decode", "--prepare", name, "--model", args.model],
                           check=True, cwd=Path(__file__).resolve().parent.parent, capture_output=True)
    systems = {n: spawn(n, args) for n in names}
    for kernel in args.kernels:
        systems[f"{default_system(args.model)} [{kernel}]"] = spawn(default_system(args.model), args, kernel)
    for gguf in ("llama_cpp", "llama_cpp_q4_0"):  # the embedded GGUF, then llama.cpp's own pure Q4_0 of it
        if llama_available() and not args.quick and (not args.systems or gguf in args.systems):
            systems[gguf] = spawn(gguf, args)
            if "error" in systems[gguf]:
                systems[f"{gguf}_norepack"] = spawn(f"{gguf}_norepack", args)
    import torch

    from models.int4_kernel import kernel_name

    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
        "cpu_features": cpu_features(), "threads": torch.get_num_threads(), "int4_decode_kernel": kernel_name(),
        "llama_cpp_build": llama_build() if any(n.startswith("llama_cpp") for n in systems) else None,
        "model": args.model, "tokens": args.tokens, "ff_keep": args.ff_keep, "ff_reselect": args.ff_reselect,
        "runs": args.runs, "prompt": PROMPT, "systems": systems, "ratios": summarize(systems, args.model),
    }
    if args.rounds > 1:
        report["rounds"] = rounds(systems, args)
    RESULTS.mkdir(exist_ok=True)
    stem = "decode_subset" if args.systems else "decode"
    if args.tag:
        stem += "_" + args.tag
    if args.model != DEFAULT_MODEL:  # another model's results sit beside the default's (decode_subset_<model>)
        stem += "_" + args.model
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2))
    (RESULTS / f"{stem}.md").write_text(markdown(report))
    print(json.dumps(report) if args.json else markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
