"""Spans join the caller's trace: a request's traceparent makes its root a child
of the caller's span; container.id and k8s.pod.uid go on the root."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferprobe.collector.model.process_identity import ContainerInfo, ProcessIdentity
from inferprobe.collector.model.timeline import Outcome, Request
from inferprobe.exporters.clock import OffsetSample, WallClock
from inferprobe.exporters.otlp import SpanShipper, resource_attributes

MS = 1_000_000
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
CID = "ab" * 32
UID = "8d2f6e4a-1b3c-4d5e-9f60-7a8b9c0d1e2f"


def _spans(req: Request) -> list:
    clock = WallClock()
    clock.add(OffsetSample(0, 1_700_000_000 * 1_000_000_000))
    memory = InMemorySpanExporter()
    shipper = SpanShipper(memory, clock, lambda pid: resource_attributes("svc", pid, "x"), batch_delay_s=0.01)
    shipper.submit(req)
    assert shipper.close(5).exported == 1
    return list(memory.get_finished_spans())


def _req(**kw) -> Request:
    t0 = 50 * MS
    return Request(pid=42, tid=42, conn=1, method="POST", path="/v1/completions", t_ingress_ns=t0, status=200,
                   outcome=Outcome.COMPLETE, t_response_start_ns=t0 + MS, t_end_ns=t0 + 5 * MS, **kw)


def test_a_request_with_a_traceparent_is_a_child_of_the_callers_span():
    spans = _spans(_req(trace_id=TRACE, parent_span_id=PARENT, trace_flags=1, tracestate="rojo=1",
                        process=ProcessIdentity(42, 7, "/kubepods/besteffort/pod" + UID + "/" + CID,
                                                ContainerInfo(CID, None, UID, "besteffort"))))
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE}
    (root,) = [s for s in spans if s.parent is not None and s.parent.is_remote]
    assert format(root.parent.span_id, "016x") == PARENT
    assert all(s.parent.span_id == root.context.span_id for s in spans if s is not root)
    assert root.context.trace_state.get("rojo") == "1"
    assert root.attributes["container.id"] == CID and root.attributes["k8s.pod.uid"] == UID
    assert root.attributes["inferprobe.ns_pid"] == 7


def test_without_one_the_request_has_a_trace_of_its_own():
    spans = _spans(_req())
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 1 and format(roots[0].context.trace_id, "032x") != TRACE
    assert "container.id" not in roots[0].attributes
