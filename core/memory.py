"""Giving freed memory back to the operating system, measuring what the process holds, and refusing a request
whose buffers would not fit in what is free.

glibc keeps freed heap memory for reuse instead of returning it: after peft wraps the quantized model (about
0.5 GB of temporaries for the 0.5B) or after a long prefill, the process keeps that memory in its RSS even
though nothing uses it. `release_free_memory()` asks the allocator to return it (`malloc_trim`); it is a no-op
where there is no glibc (macOS, Windows, musl).

Loading checks that the weights and one row of KV cache fit (core.storage.model_store `check_fits`); a request
that decodes several rows at once (parallel answers, a batch of prompts) holds one copy of the KV cache per row,
so it asks `check_rows_fit` first, with what core.decode.cache.planned_bytes says a row will take.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys

_libc = None
FREE_SHARE = 0.9
"""Share of the memory free now that one request's new buffers may take (the rest: activations, other programs)."""


class RequestTooLarge(ValueError):
    """A request would allocate more memory than this machine has free (said before anything is allocated)."""


def _glibc():
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _libc = lib if hasattr(lib, "malloc_trim") else False
            except OSError:
                _libc = False
    return _libc or None


def release_free_memory(collect: bool = True) -> bool:
    """Return the allocator's free pages to the OS (after a garbage collection unless `collect` is False: a full
    collection holds the GIL for a while, which a window streaming answers would feel). True when it trimmed."""
    if collect:
        gc.collect()
    lib = _glibc()
    if lib is None:
        return False
    return bool(lib.malloc_trim(0))


def settle_heap() -> None:
    """After loading a model: collect what loading left behind, give it back to the OS, and move every surviving
    object into the garbage collector's permanent generation (`gc.freeze`). A loaded engine is ~420k Python
    objects; without this, each full collection walks them all (~0.2 s on a 2-core EPYC), on whichever thread
    triggers it — often the GUI thread, which then stalls. Objects of an earlier engine are unfrozen first, so a
    model switch does not keep the old one's cycles alive."""
    gc.unfreeze()
    release_free_memory()
    gc.freeze()


def rss_mb() -> float:
    """Resident memory of this process in MiB."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def available_bytes() -> int:
    """Memory the operating system could give this process now, in bytes."""
    import psutil

    return psutil.virtual_memory().available


def check_rows_fit(rows: int, row_bytes: int, what: str, tokens: int) -> None:
    """Refuse `rows` rows of `row_bytes` each (`what`: "parallel answers", …; `tokens`: a row's longest) when
    they would take more than FREE_SHARE of the memory free now, saying how many would fit."""
    free = available_bytes()
    fit = int(free * FREE_SHARE) // max(1, row_bytes)
    if fit >= rows:
        return
    mib = 2**20
    advice = (f"ask for {fit} at most, or for fewer tokens (a smaller thinking budget, a shorter conversation)"
              if fit else "close other programs or start a new, shorter conversation")
    raise RequestTooLarge(f"{rows} {what} of up to {tokens} tokens need about {rows * row_bytes / mib:,.0f} MiB "
                          f"for their KV cache (one copy each) and {free / mib:,.0f} MiB of memory is free: {advice}.")
