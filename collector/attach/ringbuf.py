"""Draining the kernel's event ring buffer, in bulk.

bcc's consumer calls a Python function once per event (about a microsecond
each with the copy), which caps a recorder far below what a busy host
produces. This reader maps the BPF ring buffer into our address space, the
way libbpf's consumer does, and hands over whole runs of committed records
as one bytes object: per event, Python only steps over an 8-byte header to
find where the committed run ends. The run goes to the recording as it is
(collector/model/recording.py, RINGBUF record) and is split into events when a
report reads it.

Kernel ABI (include/uapi/linux/bpf.h, kernel/bpf/ringbuf.c): page 0 holds
the consumer position (we write it), page 1 the producer position, and the
data area of max_entries bytes follows, mapped twice in a row so a record
that wraps is still contiguous. Each record starts with an 8-byte header:
u32 length with BUSY (not yet committed) and DISCARD bits, u32 page offset;
records are 8-byte aligned. Positions only grow; offset = position & mask.

Positions and headers are read and written as whole machine words through
memoryview casts ('Q', 'I'): struct's little-endian codecs move one byte at
a time, and a torn consumer position read by the kernel looks like a full
ring (measured here: a few events "lost" per minute with the ring nearly
empty). x86-64 orders plain loads and stores enough for this single
consumer: the producer position is read before the headers it covers, and
our consumer position is written after we copied the records.

Wake-ups: the programs write without waking us and each CPU forces a
wake-up only every ringbuf_wakeup_bytes (bpf/common.bpf.h), so poll()'s
timeout is what bounds the delay at low rates: callers poll every 100 ms.
"""

from __future__ import annotations

import mmap
import select
from collections.abc import Callable
from typing import TYPE_CHECKING

from inferprobe.collector.model.ringbuf_format import BUSY, HEADER_BYTES, LENGTH_MASK

if TYPE_CHECKING:
    from inferprobe.collector.attach.loader import LoadedTracer

PAGE = mmap.PAGESIZE


class RingBufferReader:
    """Single consumer of one of the tracer's ring buffers: `events` unless told.

    sink(chunk) receives committed records as one bytes object in the ring's
    own framing (iter_ring_records splits it).
    """

    def __init__(self, tracer: LoadedTracer, sink: Callable[[bytes], None], ring: str = "events"):
        table = tracer.table(ring)
        self._fd = table.map_fd
        self._size = table.max_entries   # a ring's max_entries is its size in bytes
        self._mask = self._size - 1
        self._sink = sink
        self._consumer = mmap.mmap(self._fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._producer = mmap.mmap(self._fd, PAGE + 2 * self._size, mmap.MAP_SHARED, mmap.PROT_READ,
                                   offset=PAGE)
        self._data = memoryview(self._producer)[PAGE:]
        # Word-sized views: one load or store per position and header (see above).
        self._consumer_pos = memoryview(self._consumer).cast("Q")
        self._producer_pos = memoryview(self._producer)[:8].cast("Q")
        self._headers = self._data.cast("I")
        self._epoll = select.epoll()
        self._epoll.register(self._fd, select.EPOLLIN)
        self.events = 0
        self.bytes = 0

    def poll(self, timeout_ms: int) -> int:
        """Waits up to timeout_ms for data, then consumes all committed records."""
        consumed = self._consume()
        if consumed == 0:
            self._epoll.poll(timeout_ms / 1000)
            return self._consume()
        return consumed

    def drain(self) -> int:
        return self._consume()

    def _consume(self) -> int:
        cons = self._consumer_pos[0]
        prod = self._producer_pos[0]
        if prod == cons:
            return 0
        data, mask, headers = self._data, self._mask, self._headers
        pos, events = cons, 0
        # The hot loop of the recorder: record_span() and the BUSY test are
        # inlined here because a function call per event costs as much as
        # the rest of the loop.
        while pos < prod:
            header = headers[(pos & mask) >> 2]
            if header & BUSY:
                break  # reserved but not yet committed: take it next time
            pos += ((header & LENGTH_MASK) + HEADER_BYTES + 7) & ~7
            events += 1
        if pos == cons:
            return 0
        start = cons & mask
        # The double mapping makes [start, start + n) contiguous even across the wrap.
        self._sink(bytes(data[start : start + (pos - cons)]))
        self._consumer_pos[0] = pos
        self.events += events
        self.bytes += pos - cons
        return events

    def close(self) -> None:
        self._epoll.close()
        for view in (self._headers, self._consumer_pos, self._producer_pos):
            view.release()
        self._data.release()
        self._producer.close()
        self._consumer.close()
