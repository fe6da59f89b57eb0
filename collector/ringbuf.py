"""Draining the kernel's event ring buffer, in bulk.

bcc's consumer calls a Python function once per event (about a microsecond
each with the copy), which caps a recorder far below what a busy host
produces. This reader maps the BPF ring buffer into our address space, the
way libbpf's consumer does, and hands over whole runs of committed records
as one bytes object: per event, Python only steps over an 8-byte header to
find where the committed run ends. The run goes to the recording as it is
(collector/recording.py, RINGBUF record) and is split into events when a
report reads it.

Kernel ABI (include/uapi/linux/bpf.h, kernel/bpf/ringbuf.c): page 0 holds
the consumer position (we write it), page 1 the producer position, and the
data area of max_entries bytes follows, mapped twice in a row so a record
that wraps is still contiguous. Each record starts with an 8-byte header:
u32 length with BUSY (not yet committed) and DISCARD bits, u32 page offset;
records are 8-byte aligned. Positions only grow; offset = position & mask.

x86-64 and arm64 order plain loads and stores enough for this single
consumer: the producer position is read before the headers it covers, and
our consumer position is written after we copied the records.
"""

from __future__ import annotations

import mmap
import select
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from inferprobe.collector.ringbuf_format import BUSY, HEADER_BYTES, LENGTH_MASK, U32

if TYPE_CHECKING:
    from inferprobe.collector.loader import LoadedTracer

PAGE = mmap.PAGESIZE
_U64 = struct.Struct("<Q")


class RingBufferReader:
    """Single consumer of the tracer's `events` ring buffer.

    sink(chunk) receives committed records as one bytes object in the ring's
    own framing (iter_ring_records splits it).
    """

    def __init__(self, tracer: LoadedTracer, sink: Callable[[bytes], None]):
        table = tracer.bpf[b"events"]
        self._fd = table.map_fd
        self._size = tracer.ringbuf_pages * PAGE
        self._mask = self._size - 1
        self._sink = sink
        self._consumer = mmap.mmap(self._fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._producer = mmap.mmap(self._fd, PAGE + 2 * self._size, mmap.MAP_SHARED, mmap.PROT_READ,
                                   offset=PAGE)
        self._data = memoryview(self._producer)[PAGE:]
        self._epoll = select.epoll()
        self._epoll.register(self._fd, select.EPOLLIN)
        self.events = 0
        self.bytes = 0

    def poll(self, timeout_ms: int) -> int:
        """Waits up to timeout_ms for data, then consumes all committed records."""
        if self._consume() == 0:
            self._epoll.poll(timeout_ms / 1000)
            return self._consume()
        return 0

    def drain(self) -> int:
        return self._consume()

    def _consume(self) -> int:
        (cons,) = _U64.unpack_from(self._consumer, 0)
        (prod,) = _U64.unpack_from(self._producer, 0)
        if prod == cons:
            return 0
        data, mask, unpack = self._data, self._mask, U32.unpack_from
        pos, events = cons, 0
        # The hot loop of the recorder: record_span() and the BUSY test are
        # inlined here because a function call per event costs as much as
        # the rest of the loop.
        while pos < prod:
            header = unpack(data, pos & mask)[0]
            if header & BUSY:
                break  # reserved but not yet committed: take it next time
            pos += ((header & LENGTH_MASK) + HEADER_BYTES + 7) & ~7
            events += 1
        if pos == cons:
            return 0
        start = cons & mask
        # The double mapping makes [start, start + n) contiguous even across the wrap.
        self._sink(bytes(data[start : start + (pos - cons)]))
        _U64.pack_into(self._consumer, 0, pos)
        self.events += events
        self.bytes += pos - cons
        return events

    def close(self) -> None:
        self._epoll.close()
        self._data.release()
        self._producer.close()
        self._consumer.close()
