"""The shipper's spans on the exporter side: what Phoenix does not return
(resource attributes, span kind), wall-clock times and drop counting."""

from __future__ import annotations

import socket
import threading
import time

from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from inferprobe.collector.model.timeline import Outcome, Request
from inferprobe.exporters.clock import OffsetSample, WallClock
from inferprobe.exporters.otlp import SpanShipper, resource_attributes

MS = 1_000_000
OFFSET = 1_700_000_000 * 1_000_000_000


def _req(conn: int) -> Request:
    t0 = 50 * MS
    return Request(pid=42, tid=42, conn=conn, method="POST", path="/v1/chat/completions", t_ingress_ns=t0,
                   status=200, outcome=Outcome.COMPLETE, t_response_start_ns=t0 + MS,
                   token_ns=[t0 + 10 * MS, t0 + 12 * MS], token_events=[1, 1], t_end_ns=t0 + 13 * MS,
                   streaming=True)


def _clock() -> WallClock:
    clock = WallClock()
    clock.add(OffsetSample(0, OFFSET))
    return clock


def _resource(pid: int) -> dict:
    return resource_attributes("svc-test", pid, "python3")


def test_resource_kind_parentage_and_wall_times():
    memory = InMemorySpanExporter()
    shipper = SpanShipper(memory, _clock(), _resource, batch_delay_s=0.01)
    assert shipper.submit(_req(1))
    stats = shipper.close(5)
    assert (stats.exported, stats.dropped) == (1, 0)
    spans = memory.get_finished_spans()
    root = next(s for s in spans if s.parent is None)
    assert root.kind == SpanKind.SERVER
    want = {"service.name": "svc-test", "process.pid": 42, "process.executable.name": "python3",
            "host.name": socket.gethostname()}
    assert {k: root.resource.attributes.get(k) for k in want} == want
    assert root.start_time == OFFSET + 50 * MS and root.end_time == OFFSET + 63 * MS
    kids = [s for s in spans if s.parent is not None]
    assert kids and all(k.kind == SpanKind.INTERNAL and k.parent.span_id == root.context.span_id
                        and k.context.trace_id == root.context.trace_id for k in kids)


class _Failing(InMemorySpanExporter):
    def export(self, spans):
        return SpanExportResult.FAILURE


class _Stuck(InMemorySpanExporter):
    """A backend that never answers until shut down."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def export(self, spans):
        self.release.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self):
        self.release.set()


def test_failed_exports_are_counted_as_drops():
    shipper = SpanShipper(_Failing(), _clock(), _resource, batch_delay_s=0.01)
    for conn in range(5):
        shipper.submit(_req(conn))
    stats = shipper.close(5)
    assert (stats.exported, stats.dropped, stats.submitted) == (0, 5, 5)


def test_a_stuck_backend_never_blocks_submit_and_overflow_is_counted():
    stuck = _Stuck()
    shipper = SpanShipper(stuck, _clock(), _resource, queue_traces=10, batch_traces=1, batch_delay_s=0)
    t = time.monotonic()
    accepted = sum(shipper.submit(_req(conn)) for conn in range(100))
    assert time.monotonic() - t < 0.5  # submit() never waits for the backend
    assert accepted <= 11  # the queue plus the batch in the worker's hands
    stats = shipper.close(0.2)
    assert stats.exported == 0 and stats.dropped == 100
    assert stats.dropped_queue_full == 100 - accepted
