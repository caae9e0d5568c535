"""Giving freed memory back to the operating system, and measuring what the process holds.

glibc keeps freed heap memory for reuse instead of returning it: after peft wraps the quantized model (about
0.5 GB of temporaries for the 0.5B) or after a long prefill, the process keeps that memory in its RSS even
though nothing uses it. `release_free_memory()` asks the allocator to return it (`malloc_trim`); it is a no-op
where there is no glibc (macOS, Windows, musl).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys

_libc = None


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
