"""A model of how the kernel counts SSE token events in one write, for tests to compare with."""

from __future__ import annotations

from inferprobe.collector import shared_constants

# How far the kernel scans a long write for SSE "data:" lines: windows of
# SSE_WINDOW bytes at SSE_WINDOW_STEP * k (collector/shared_constants.py, from
# bpf/inferprobe.h), keyed by whether the write is vectored.
SSE_WINDOW, SSE_WINDOW_STEP = shared_constants.SSE_WINDOW_BYTES, shared_constants.SSE_WINDOW_STEP
SSE_SCANNED_BYTES = {False: shared_constants.SSE_SCANNED_BYTES_PLAIN,
                     True: shared_constants.SSE_SCANNED_BYTES_VECTORED}


def sse_events_counted(write: bytes, vectored: bool) -> int:
    """The token events the kernel counts in one write of these bytes: "data:"
    lines starting at a line start (or the write's start) whose "data:" lies
    in the scanned bytes; a "data: [DONE]" seen whole there is the end marker,
    not a token."""
    limit = min(len(write), SSE_SCANNED_BYTES[vectored])
    count = 0
    for p in range(limit - 4):
        if (p == 0 or write[p - 1] == 0x0A) and write.startswith(b"data:", p):
            count += not (write.startswith(b"data: [DONE]", p) and p + 12 <= limit)
    return count
