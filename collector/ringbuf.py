"""Draining the kernel's event ring buffer into a sink.

bcc calls our callback once per event. The callback only copies the bytes
(decoding waits for `report`), which keeps the per-event Python cost to a
copy and an append.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from inferprobe.collector.loader import LoadedTracer

# Byte offsets inside an io_event used for a live request count without a
# full decode (checked against the header by tests/collector/test_event_layout.py).
IO_KIND_OFFSET = 60
EVENT_SOCK_READ = 3
HTTP_KIND_REQUEST = 1


class RingBufferReader:
    def __init__(self, tracer: LoadedTracer, sink: Callable[[bytes], None]):
        self._tracer = tracer
        self._sink = sink
        self.events = 0
        self.requests = 0
        tracer.bpf["events"].open_ring_buffer(self._on_event)

    def _on_event(self, _ctx, data, size) -> int:
        raw = ctypes.string_at(data, size)
        self.events += 1
        if raw[0] == EVENT_SOCK_READ and size > IO_KIND_OFFSET and raw[IO_KIND_OFFSET] == HTTP_KIND_REQUEST:
            self.requests += 1
        self._sink(raw)
        return 0

    def poll(self, timeout_ms: int) -> None:
        self._tracer.bpf.ring_buffer_poll(timeout_ms)

    def drain(self) -> None:
        self._tracer.bpf.ring_buffer_consume()
