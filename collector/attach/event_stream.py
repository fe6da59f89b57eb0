"""Everything a loaded tracer sends to user space, as one stream of ring-framed chunks.

The kernel's events come through the `events` ring, read in bulk
(collector/attach/ringbuf.py). HTTP/2 header blocks come through a ring of their
own and are decoded at once into h2_headers_events that hold only the
listed fields (collector/ingest/h2_header_blocks.py). Both reach the same sink in
the ring's framing, so `record`, `top` and `agent` write and export them
alike and nobody has to remember the second ring.
"""

from __future__ import annotations

from collections.abc import Callable

from inferprobe.collector.attach.ringbuf import RingBufferReader
from inferprobe.collector.ingest.h2_header_blocks import HeaderPieceDecoder


class EventStream:
    def __init__(self, tracer, sink: Callable[[bytes], None]) -> None:
        self._ring = RingBufferReader(tracer, sink)
        self._header_pieces: HeaderPieceDecoder | None = None
        self._pieces_ring: RingBufferReader | None = None
        if tracer.has_map(b"h2_header_pieces"):
            self._header_pieces = HeaderPieceDecoder(sink)
            self._pieces_ring = RingBufferReader(tracer, self._header_pieces.feed, ring="h2_header_pieces")

    @property
    def events(self) -> int:
        """Kernel events received so far."""
        return self._ring.events

    @property
    def h2_header_tables(self) -> int:
        """HTTP/2 connections whose HPACK tables are held now (bounded; closed ones are dropped)."""
        return self._header_pieces.blocks.connections if self._header_pieces is not None else 0

    @property
    def h2_requests(self) -> int:
        """HTTP/2 requests whose header block was decoded so far: the kernel's request count
        (COUNTER_REQUESTS) is of HTTP/1 request lines, since an HTTP/2 request is known as
        one only once HPACK is decoded here."""
        return self._header_pieces.blocks.requests if self._header_pieces is not None else 0

    def poll(self, timeout_ms: int) -> int:
        """Waits up to timeout_ms for events, then takes everything committed."""
        received = self._ring.poll(timeout_ms)
        if self._pieces_ring is not None:
            self._pieces_ring.drain()
        return received

    def drain(self) -> int:
        received = self._ring.drain()
        if self._pieces_ring is not None:
            self._pieces_ring.drain()
        return received

    def close(self) -> None:
        if self._pieces_ring is not None:
            self._pieces_ring.drain()
            self._pieces_ring.close()
        self._ring.close()
