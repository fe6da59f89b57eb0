"""The BPF ring buffer's record framing, shared by the live reader and the
recording reader (which must not need bcc or a kernel).

Each record starts with an 8-byte header: u32 length with a BUSY bit (not
yet committed) and a DISCARD bit, then u32 page offset; records are padded
to 8 bytes (include/uapi/linux/bpf.h, kernel/bpf/ringbuf.c).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

BUSY = 1 << 31
DISCARD = 1 << 30
HEADER_BYTES = 8
LENGTH_MASK = ~(BUSY | DISCARD) & 0xFFFFFFFF
U32 = struct.Struct("<I")


def record_span(header: int) -> int:
    """Bytes from this record's header to the next one's."""
    return (HEADER_BYTES + (header & LENGTH_MASK) + 7) & ~7


def iter_ring_records(chunk: bytes | memoryview) -> Iterator[bytes]:
    """The events in a run of ring buffer records (discarded ones skipped)."""
    view = memoryview(chunk)
    offset, end = 0, len(view)
    while offset + HEADER_BYTES <= end:
        (header,) = U32.unpack_from(view, offset)
        length = header & LENGTH_MASK
        if header & BUSY or offset + HEADER_BYTES + length > end:
            raise ValueError("ring buffer record is uncommitted or runs past the end of its chunk")
        if not header & DISCARD:
            yield bytes(view[offset + HEADER_BYTES : offset + HEADER_BYTES + length])
        offset += record_span(header)
    if offset != end:
        raise ValueError("trailing bytes after the last ring buffer record")


def frame_records(events: list[bytes]) -> bytes:
    """Events in the ring buffer's framing: how events made in user space
    (collector/ingest/h2_header_blocks.py) join the kernel's in a recording and
    the live exporters."""
    out = bytearray()
    for raw in events:
        out += U32.pack(len(raw)) + bytes(4) + raw + bytes(-len(raw) % 8)
    return bytes(out)
