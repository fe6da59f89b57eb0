"""heap_trim against this process's real glibc: the calls exist and do what they say."""

from __future__ import annotations

import ctypes

import pytest

from inferprobe.collector.attach import heap_trim


def _glibc() -> bool:
    return hasattr(ctypes.CDLL(None), "malloc_trim")


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's; this libc has none")
def test_trim_gives_freed_pages_back_to_the_kernel():
    def rss_kb() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # 64 MB in 64 KB blocks (under glibc's 128 KB mmap threshold: on the heap), every other
    # one freed, so the free pages sit between live blocks where only a trim returns them
    blocks = [libc.malloc(65536) for _ in range(1024)]
    for b in blocks:
        ctypes.memset(b, 1, 65536)
    for b in blocks[::2]:
        libc.free(b)
    before = rss_kb()
    assert heap_trim.trim() is True
    assert rss_kb() < before - 16 * 1024, (before, rss_kb())   # most of the 32 MB freed came back
    for b in blocks[1::2]:
        libc.free(b)


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("INFERPROBE_HEAP_TRIM", "0")
    assert heap_trim.wanted() is False
    monkeypatch.delenv("INFERPROBE_HEAP_TRIM")
    assert heap_trim.wanted() is True
