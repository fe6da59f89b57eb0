"""Live export while recording: events -> Request timelines -> OTLP and Prometheus.

The record loop hands every ring buffer chunk to `tee` (which only keeps a
reference) and calls `tick()` once per loop turn, between ring-buffer polls.
tick() hands the new events to the ingest stage (collector/ingest/pipeline.py's
LiveIngest: decode, sessionize in effect order (50 ms late), the server's view, each
request that ended tied to it, memory kept flat) and each request that ended
to the span shipper (a non-blocking put) and to the metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inferprobe.collector.ingest.pipeline import LiveIngest
from inferprobe.collector.model.events import EngineIpcRecord, LlamaStepRecord, UsdtRecord
from inferprobe.collector.model.ringbuf_format import iter_ring_records
from inferprobe.collector.model.timeline import Request
from inferprobe.collector.processes.containers import ProcessIdentities
from inferprobe.collector.processes.targets import alive as process_alive
from inferprobe.exporters.clock import WallClock, measure_offset
from inferprobe.exporters.metrics import Metrics
from inferprobe.exporters.otlp import SpanShipper

CLOCK_RECHECK_NS = 1_000_000_000
# How often the per-process state of processes that exited is looked for and dropped (no
# event says a process exited: its sockets close with it, without a close() to see).
PROCESS_SWEEP_NS = 10 * 1_000_000_000
# Offset samples the live clock keeps (one a second: an hour); older times use the oldest kept.
LIVE_CLOCK_SAMPLES = 3600


@dataclass
class LiveStats:
    finished: int = 0
    undecodable: int = 0
    usdt_events: int = 0
    processes_exited: int = 0  # processes whose state was dropped at their exit (forget_exited)
    extra: dict = field(default_factory=dict)


class LiveExport:
    def __init__(self, clock: WallClock, shipper: SpanShipper | None = None, metrics: Metrics | None = None,
                 identities: ProcessIdentities | None = None, alive: Callable[[int], bool] = process_alive):
        self.clock = clock
        if clock.keep is None:
            clock.keep = LIVE_CLOCK_SAMPLES  # bounded: one re-check a second for weeks otherwise
        # Where each request's process runs (container.id, k8s.pod.uid, the container_id label)
        self.identities = identities if identities is not None else ProcessIdentities()
        self.shipper = shipper
        self.metrics = metrics
        self.ingest = LiveIngest()
        self._pending: list[bytes] = []  # bounded: emptied at every tick
        self._last_clock_check = time.monotonic_ns()
        self._alive = alive
        self._last_sweep = time.monotonic_ns()
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
        if now - self._last_sweep >= PROCESS_SWEEP_NS:
            self._last_sweep = now
            self.forget_exited()
        if now - self._last_clock_check >= CLOCK_RECHECK_NS:
            self._last_clock_check = now
            self.clock.add(measure_offset())
        if self.metrics is not None:
            dropped = self.shipper.stats.dropped if self.shipper is not None else 0
            self.metrics.set_totals(lost_events or 0, dropped)

    def forget_exited(self) -> int:
        """Drops the per-process state of the processes that exited (their connections end
        as at a close; their requests go out at the next harvest). Returns how many processes."""
        known = self.ingest.pids() | (self.metrics.pids() if self.metrics is not None else set())
        gone = {pid for pid in known if not self._alive(pid)}
        if gone:
            self.stats.processes_exited += len(gone)
            self.ingest.forget_processes(gone)
            if self.metrics is not None:
                for pid in gone:
                    self.metrics.forget_process(pid)
            self._harvest()
        return len(gone)

    def observe_engine(self, scrape: dict) -> None:
        """One scrape of the engine's /metrics, beside the wire's numbers."""
        if self.metrics is not None:
            self.metrics.observe_engine(scrape["samples"])

    def _feed(self, raw_events: list[bytes]) -> None:
        for ev in self.ingest.feed(raw_events):
            if isinstance(ev, UsdtRecord):
                self.stats.usdt_events += 1
                if self.metrics is not None:
                    self.metrics.observe_usdt(ev)
            elif isinstance(ev, LlamaStepRecord) and self.metrics is not None:
                self.metrics.observe_llama(ev)
            elif isinstance(ev, EngineIpcRecord) and self.metrics is not None:
                self.metrics.observe_engine_ipc(ev)
        self.stats.undecodable = self.ingest.undecodable

    def _harvest(self) -> None:
        started, ended = self.ingest.harvest()
        if self.metrics is not None:
            for req in started:
                self.metrics.request_started(req.pid)
        for req in ended:
            self._export(req)

    def _export(self, req: Request, finished: bool = True) -> None:
        self.stats.finished += 1
        if req.process is None:
            req.process = self.identities.get(req.pid)
        if self.shipper is not None:
            self.shipper.submit(req)
        if self.metrics is not None and finished:
            self.metrics.request_finished(req)

    # -- end of recording ---------------------------------------------------------
    def close(self, lost_events: int = 0, timeout_s: float = 5.0) -> dict:
        """Exports what is left (requests still open go out as incomplete)."""
        self.tick(lost_events)
        for req in self.ingest.finish():
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
