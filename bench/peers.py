"""The baselines Ponder's decode benchmark measures itself against, on the same prompt: HF transformers (fp32,
bf16) and llama.cpp (the model's own GGUF, or a pure Q4_0 file its quantizer makes from it, with or without its
CPU repack). Each runs in `bench.decode`'s subprocess for one system."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

PROMPT = "Write a Python function that checks whether a number is prime, and explain how it works."
LONG_PROMPTS = (512, 2048)
"""Prompt lengths whose time to first token is measured for the default system and llama.cpp."""
FILLER = ("The history of computing is a long story of people trying to make machines do arithmetic faster and "
          "more reliably, from the abacus to mechanical calculators, punched cards, vacuum tubes, transistors "
          "and finally integrated circuits that hold billions of switches on a chip the size of a fingernail. ")


def long_prompt(tokenizer, tokens: int) -> str:
    """A user message whose chat prompt is `tokens` tokens long (within a few)."""
    from core.prompting.chat_format import build_prompt_ids

    words = (FILLER * (tokens // 40 + 2)).split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # the most words whose prompt fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(build_prompt_ids(tokenizer, " ".join(words[:mid]))) <= tokens else (lo, mid - 1)
    return " ".join(words[:lo])


def run_hf(dtype_name: str, model_id: str, tokens: int, runs: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from core.loading import load_tokenizer, set_threads
    from core.prompting.chat_format import build_prompt_ids
    from core.storage.model_store import ModelStore

    set_threads(None)
    hf = ModelStore().get(model_id).hf_dir
    dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=dtype, trust_remote_code=False).eval()
    ids = torch.tensor([build_prompt_ids(load_tokenizer(hf), PROMPT)])
    kw = dict(do_sample=False, pad_token_id=0)
    ttfts, rates = [], []
    for _ in range(runs):
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        ttft = time.perf_counter() - t
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **kw)
        total = time.perf_counter() - t
        ttfts.append(ttft)
        rates.append((tokens - 1) / max(total - ttft, 1e-9))
    kv_per_token = 2 * model.config.num_hidden_layers * model.config.num_key_value_heads * (
        model.config.hidden_size // model.config.num_attention_heads) * (4 if dtype_name == "fp32" else 2)
    return {"ttft_s": statistics.median(ttfts), "decode_tok_s": statistics.median(rates),
            "kv_bytes_per_token": kv_per_token, "prompt_tokens": ids.shape[1]}


def q4_0_gguf(gguf: Path, model_id: str) -> Path:
    """The same GGUF re-quantized by llama.cpp's own quantizer to pure Q4_0 (every matrix, output included): the
    same bits per weight as Ponder's int4 (4 + a 16-bit scale per 32), so the comparison is of kernels, not bit
    widths. Made once, in the temp folder."""
    import tempfile

    import llama_cpp

    out = Path(tempfile.gettempdir()) / f"ponder-bench-{model_id}-q4_0.gguf"
    if not out.is_file():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.pure, params.allow_requantize = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, True, True
        params.quantize_output_tensor = True
        part = Path(str(out) + ".part")
        if llama_cpp.llama_model_quantize(str(gguf).encode(), str(part).encode(), params) != 0:
            raise RuntimeError("llama.cpp could not quantize the GGUF to Q4_0")
        part.replace(out)
    return out


def load_llama_cpp(model_id: str, repack: bool, q4_0: bool = False):
    """(llama_cpp.Llama on the model's GGUF, or llama.cpp's own pure Q4_0 of it, the chat prompt's ids, tokenizer)."""
    import llama_cpp

    from core.loading import load_tokenizer
    from core.prompting.chat_format import build_prompt_ids
    from core.storage.model_store import ModelStore

    m = ModelStore().get(model_id)
    gguf = m.folder / "model.gguf"
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is missing")
    if q4_0:
        gguf = q4_0_gguf(gguf, model_id)
    if not repack:  # llama.cpp's extra (AMX/repack) buffers crash on some VMs: plain CPU buffers instead
        default = llama_cpp.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama_model_default_params = params
        llama_cpp.llama.llama_cpp.llama_model_default_params = params
    from core.loading import set_threads

    llm = llama_cpp.Llama(model_path=str(gguf), n_threads=set_threads(None), n_ctx=max(LONG_PROMPTS) + 256,
                          verbose=False)
    tokenizer = load_tokenizer(m.hf_dir)
    return llm, build_prompt_ids(tokenizer, PROMPT), tokenizer


def llama_cpp_once(llm, ids: list[int], tokens: int) -> tuple[float, float]:
    """One greedy generation of `tokens` from a fresh cache: (time to first token s, decode tok/s after it)."""
    llm.reset()
    t = time.perf_counter()
    first, n = None, 0
    for _tok in llm.generate(ids, temp=0, reset=True):
        n += 1
        if first is None:
            first = time.perf_counter()
        if n >= tokens:
            break
    end = time.perf_counter()
    return first - t, (n - 1) / (end - first)


def run_llama_cpp(model_id: str, tokens: int, runs: int, repack: bool, q4_0: bool = False, long: bool = True) -> dict:
    from core.prompting.chat_format import build_prompt_ids

    llm, ids, tokenizer = load_llama_cpp(model_id, repack, q4_0)
    ttfts, rates = zip(*(llama_cpp_once(llm, ids, tokens) for _ in range(runs + 1)), strict=True)
    out = {"ttft_s": statistics.median(ttfts[1:]), "decode_tok_s": statistics.median(rates[1:]),
           "kv_bytes_per_token": None, "prompt_tokens": len(ids), "repack": repack}
    for n in LONG_PROMPTS if long else ():
        long_ids = build_prompt_ids(tokenizer, long_prompt(tokenizer, n))
        times = []
        for _ in range(3):  # the first run warms up
            llm.reset()
            t = time.perf_counter()
            next(iter(llm.generate(long_ids, temp=0, reset=True)))
            times.append(time.perf_counter() - t)
        out[f"ttft_{n}_s"] = statistics.median(times[1:])
    return out


def llama_build() -> dict:
    """Which llama.cpp ran: its version and the instruction sets its build uses (llama_print_system_info)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    return {"version": llama_cpp.__version__, "system_info": info.decode() if isinstance(info, bytes) else str(info)}


def llama_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None
