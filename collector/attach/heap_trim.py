"""Gives the agent's freed heap memory back to the kernel, for weeks of uptime.

CPython passes every allocation over 512 bytes to glibc's malloc (decoded
batches, OTLP payloads, scrape texts), and glibc gives each thread that
allocates at the same time as another a heap of its own (an arena): the
recording thread, the OTLP exporter's, the Prometheus server's. Memory freed
inside an arena stays resident until malloc_trim() returns its free pages.
So the agent caps the arenas at two before its threads start
(mallopt(M_ARENA_MAX)) and trims once a minute (a few milliseconds).
benchmarks/bench_soak.py measures the resident memory with and without it.

Only glibc has these calls; elsewhere (musl) nothing is done. INFERPROBE_HEAP_TRIM=0
turns both off, to tell this from other growth when diagnosing memory.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8   # glibc's malloc.h
ARENAS = 2
TRIM_INTERVAL_S = 60.0


def wanted() -> bool:
    return os.environ.get("INFERPROBE_HEAP_TRIM", "1") != "0"


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def cap_arenas() -> bool:
    """Before the threads start: at most ARENAS malloc heaps. True where glibc took it."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, ARENAS) == 1)


def trim() -> bool:
    """Returns freed pages of every malloc heap to the kernel. True where some were."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


def every_interval(_now: float) -> None:
    """Session.every's form of trim()."""
    trim()
