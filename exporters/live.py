"""Live export while recording: events -> Request timelines -> OTLP and Prometheus.

The record loop hands every ring buffer chunk to `tee` (which only keeps a
reference) and calls `tick()` once per loop turn, between ring-buffer polls.
tick() decodes the new events, feeds socket events to an incremental
Sessionizer in completion order and USDT events to an incremental server
view, ties each request that ended to the server's view of it
(collector/correlate.py), and hands it to the span shipper (a non-blocking
put) and to the metrics. Finished requests, and server state older than
SERVER_MEMORY_NS, are then dropped so memory stays flat over long runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inferprobe.collector.correlate import correlate
from inferprobe.collector.events import DecodeError, IoRecord, UsdtRecord, decode
from inferprobe.collector.ringbuf_format import iter_ring_records
from inferprobe.collector.server_view import ServerViewBuilder
from inferprobe.collector.sessionizer import Sessionizer
from inferprobe.collector.timeline import Request
from inferprobe.exporters.clock import WallClock, measure_offset
from inferprobe.exporters.metrics import Metrics
from inferprobe.exporters.otlp import SpanShipper

CLOCK_RECHECK_NS = 1_000_000_000
# How long the server's view of a request that ended is kept for its socket
# request to end too (a slow client can still be reading the last tokens).
SERVER_MEMORY_NS = 120 * 1_000_000_000


def _order_key(ev) -> int:
    # as the sessionizer orders a whole recording: I/O by syscall exit
    return ev.exit_ns if isinstance(ev, IoRecord) else ev.ts_ns


@dataclass
class LiveStats:
    finished: int = 0
    undecodable: int = 0
    usdt_events: int = 0
    extra: dict = field(default_factory=dict)


class LiveExport:
    def __init__(self, clock: WallClock, shipper: SpanShipper | None = None, metrics: Metrics | None = None):
        self.clock = clock
        self.shipper = shipper
        self.metrics = metrics
        self.sessionizer = Sessionizer()
        self.server = ServerViewBuilder()
        self._pending: list[bytes] = []
        self._open = 0  # sessionizer.requests[:_open] were seen at the last tick
        self._last_clock_check = time.monotonic_ns()
        self.stats = LiveStats()

    # -- recording thread, per ring buffer chunk ------------------------------------
    def tee(self, sink: Callable[[bytes], None]) -> Callable[[bytes], None]:
        pending = self._pending

        def both(chunk: bytes) -> None:
            sink(chunk)
            pending.append(chunk)

        return both

    # -- recording thread, per loop turn ------------------------------------------
    def tick(self, lost_events: int | None = None) -> None:
        if self._pending:
            chunks = self._pending[:]
            del self._pending[:]  # the list object is shared with tee()
            self._feed([raw for chunk in chunks for raw in iter_ring_records(chunk)])
        self._harvest()
        now = time.monotonic_ns()
        if now - self._last_clock_check >= CLOCK_RECHECK_NS:
            self._last_clock_check = now
            self.clock.add(measure_offset())
        if self.metrics is not None:
            dropped = self.shipper.stats.dropped if self.shipper is not None else 0
            self.metrics.set_totals(lost_events or 0, dropped)

    def _feed(self, raw_events: list[bytes]) -> None:
        decoded = []
        for raw in raw_events:
            try:
                ev = decode(raw)
            except DecodeError:
                self.stats.undecodable += 1
                continue
            if isinstance(ev, UsdtRecord):
                self.stats.usdt_events += 1
                if self.metrics is not None:
                    self.metrics.observe_usdt(ev)
            decoded.append(ev)
        decoded.sort(key=_order_key)
        for ev in decoded:
            if isinstance(ev, UsdtRecord):
                self.server.feed(ev)
            else:
                self.sessionizer.feed(ev)

    def _harvest(self) -> None:
        s = self.sessionizer
        if self.metrics is not None:
            for req in s.requests[self._open:]:
                self.metrics.request_started(req.pid)
        finished = [r for r in s.requests if r.t_end_ns is not None]
        if finished:
            s.requests = [r for r in s.requests if r.t_end_ns is None]
            if not self.server.view.empty:
                correlate(finished, s.connections, self.server.view)
                view = self.server.view
                for req in finished:
                    if req.server is not None:
                        view.requests.pop((req.server.pid, req.server.req_id), None)
                self.server.forget_before(max(r.t_end_ns for r in finished) - SERVER_MEMORY_NS)
            cutoff = max(r.t_end_ns for r in finished) - SERVER_MEMORY_NS
            closed = [cid for cid, c in s.connections.items()
                      if c.t_close_ns is not None and c.t_close_ns < cutoff]
            for cid in closed:
                del s.connections[cid]
            for req in finished:
                self._export(req)
        self._open = len(s.requests)

    def _export(self, req: Request, finished: bool = True) -> None:
        self.stats.finished += 1
        if self.shipper is not None:
            self.shipper.submit(req)
        if self.metrics is not None and finished:
            self.metrics.request_finished(req)

    # -- end of recording ---------------------------------------------------------
    def close(self, lost_events: int = 0, timeout_s: float = 5.0) -> dict:
        """Exports what is left (requests still open go out as incomplete)."""
        self.tick(lost_events)
        leftover = self.sessionizer.finish()
        self.sessionizer.requests = []
        for req in leftover:
            self._export(req, finished=False)
        summary: dict = {"requests_exported_live": self.stats.finished,
                         "clock_steps": self.clock.steps}
        if self.shipper is not None:
            summary["otlp"] = self.shipper.close(timeout_s).as_dict()
        if self.metrics is not None:
            dropped = self.shipper.stats.dropped if self.shipper is not None else 0
            self.metrics.set_totals(lost_events, dropped)
        return summary

    def stop_serving(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
