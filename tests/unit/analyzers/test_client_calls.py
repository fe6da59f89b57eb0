"""Grouping outbound attempts into calls, and the sum that explains a call.

Built from Request and Connection values as the sessionizer makes them for a
client (the kernel side of the client role is tested end to end in
tests/integration/e2e/test_client_calls.py)."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from inferprobe.analyzers.client_calls import attempts_by_request, group, slow_calls
from inferprobe.analyzers.request_analysis import per_request
from inferprobe.collector.model.timeline import Connection, Outcome, Request
from inferprobe.exporters.clock import OffsetSample, WallClock
from inferprobe.exporters.metrics import Metrics
from inferprobe.exporters.otlp import SpanShipper, resource_attributes

MS = 1_000_000
S = 1_000 * MS
PEER = "10.0.0.7:443"


def conn(conn_id: int, t_open: int) -> Connection:
    return Connection(conn_id=conn_id, pid=7, fd=5, family="ipv4", peer="10.0.0.7", peer_port=443,
                      t_open_ns=t_open, role="client", t_connect_end_ns=t_open + 30 * MS)


def timed_out(conn_id: int, t0: int, retry_count: int | None = 0, tid: int = 7) -> Request:
    return Request(pid=7, tid=tid, conn=conn_id, method="POST", path="/v1/messages", t_ingress_ns=t0,
                   outcome=Outcome.ABORTED, t_end_ns=t0 + 10 * S, role="client", retry_count=retry_count,
                   peer=PEER, transport="tls")


def streamed(conn_id: int, t0: int, retry_count: int | None = 0, tid: int = 7) -> Request:
    return Request(pid=7, tid=tid, conn=conn_id, method="POST", path="/v1/messages", t_ingress_ns=t0,
                   status=200, outcome=Outcome.COMPLETE, t_response_start_ns=t0 + 1 * S,
                   token_ns=[t0 + 1200 * MS, t0 + 1300 * MS, t0 + 1400 * MS], token_events=[1, 1, 1],
                   t_end_ns=t0 + 1400 * MS, streaming=True, role="client", retry_count=retry_count,
                   peer=PEER, transport="tls")


def the_12_second_call() -> tuple[list[Request], dict[int, Connection]]:
    """An SDK's timeout=10 s, then a retry 0.5 s later on a new connection."""
    c1, c2 = conn(1, 0), conn(2, 10_580 * MS)
    first = timed_out(1, 80 * MS)
    retry = streamed(2, c2.t_connect_end_ns + 50 * MS, retry_count=1)
    return [first, retry], {1: c1, 2: c2}


def test_a_retry_header_groups_the_attempts_and_the_sum_adds_up():
    requests, connections = the_12_second_call()
    (call,) = group(requests, connections)
    first, second = call.attempts
    assert (first.number, second.number) == (1, 2)
    assert (first.grouped_by, second.grouped_by) == ("first attempt", "retry header")
    assert call.duration_ns == requests[1].t_end_ns - 0
    assert call.explain() == (
        "12.06 s = attempt 1: connect 30.0 ms, TLS handshake and request set-up 50.0 ms, 10.00 s waiting for "
        "the first byte, closed by the client (its timeout?); backoff 500.0 ms; attempt 2: connect 30.0 ms, "
        "TLS handshake and request set-up 50.0 ms, first token 1.20 s, streaming 200.0 ms")


def test_a_connection_a_pool_opened_ahead_gives_its_attempt_no_connect_phase():
    """Node's undici connects ahead: the retry goes over a connection opened while the
    first attempt was still waiting, and the next call over one opened during the
    retry. Neither attempt waited for that connect, and no backoff is negative."""
    c1, ahead, later = conn(1, 0), conn(2, 5 * S), conn(3, 11 * S)
    first = timed_out(1, 80 * MS)
    retry = streamed(2, 10_600 * MS, retry_count=1)
    next_call = streamed(3, 13 * S)
    calls = group([first, retry, next_call], {1: c1, 2: ahead, 3: later})
    (a1, a2), (b1,) = (c.attempts for c in calls)
    assert not a1.opened_ahead and a2.opened_ahead and b1.opened_ahead
    assert a2.t_connect_start_ns is None and b1.t_connect_start_ns is None
    assert "backoff 520.0 ms; attempt 2: first token 1.20 s" in calls[0].explain()


def test_retry_advice_names_an_answered_status_and_a_timeout_apart():
    from inferprobe.analyzers.client_calls import retry_advice
    requests, connections = the_12_second_call()
    (timed,) = group(requests, connections)
    assert "the SDK's timeout" in retry_advice([timed]) and "turned" not in retry_advice([timed])
    first, retry = requests
    first.outcome, first.status, first.t_response_start_ns = Outcome.COMPLETE, 429, first.t_ingress_ns + MS
    (throttled,) = group(requests, connections)
    advice = retry_advice([throttled])
    assert "1 answered 429 (throttled: a rate limit or quota)" in advice and "timeout" not in advice


def test_without_the_header_a_quick_repeat_after_a_failure_is_a_retry():
    requests, connections = the_12_second_call()
    for r in requests:
        r.retry_count = None
    (call,) = group(requests, connections)
    assert [a.grouped_by for a in call.attempts] == ["first attempt", "after a failed attempt"]


def test_other_threads_and_successful_predecessors_start_calls_of_their_own():
    c = conn(1, 0)
    ok = streamed(1, 40 * MS, retry_count=None)
    again = streamed(1, ok.t_end_ns + MS, retry_count=None)  # after a success: a new call
    elsewhere = timed_out(1, again.t_end_ns + MS, retry_count=None)
    other_thread = streamed(1, elsewhere.t_end_ns + MS, retry_count=None, tid=8)
    calls = group([ok, again, elsewhere, other_thread], {1: c})
    assert [len(call.attempts) for call in calls] == [1, 1, 1, 1]
    assert [a.reused for call in calls for a in call.attempts] == [False, True, True, True]
    # a call on a reused connection has no connect in its sum
    assert "connect" not in calls[1].explain()


def test_slow_calls_lists_retried_calls_first():
    requests, connections = the_12_second_call()
    quick = streamed(2, requests[1].t_end_ns + S, retry_count=0)
    calls = group([*requests, quick], connections)
    assert [len(c.attempts) for c in slow_calls(calls, limit=1)] == [2]


def test_exports_one_client_trace_per_call_and_client_histograms():
    requests, connections = the_12_second_call()
    calls = group(requests, connections)
    analyses = per_request(requests, None, None, attempts_by_request(calls))
    clock = WallClock()
    clock.add(OffsetSample(0, 1_700_000_000 * S))
    memory = InMemorySpanExporter()
    shipper = SpanShipper(memory, clock, lambda pid: resource_attributes("app", pid, "python3"),
                          batch_delay_s=0.01)
    shipper.submit_call(calls[0], analyses)
    assert shipper.close(5).exported == 1
    spans = memory.get_finished_spans()
    root = next(s for s in spans if s.parent is None)
    attempts = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
    assert root.kind == SpanKind.CLIENT and root.attributes["inferprobe.attempts"] == 2
    assert root.attributes["server.address"] == "10.0.0.7" and root.attributes["server.port"] == 443
    assert [s.kind for s in attempts] == [SpanKind.CLIENT, SpanKind.CLIENT]
    assert sorted(s.attributes["inferprobe.attempt"] for s in attempts) == [1, 2]
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}

    m = Metrics({7: "app"})
    for r in requests:
        m.request_started(r.pid)
        m.request_finished(r)
    labels = {"server_address": PEER, "endpoint": "POST /v1/messages", "model": "", "target": "app"}
    assert m.registry.get_sample_value("gen_ai_client_operation_duration_seconds_count",
                                       {**labels, "status_class": "aborted"}) == 1
    assert m.registry.get_sample_value("gen_ai_client_operation_time_to_first_chunk_seconds_sum",
                                       {**labels, "status_class": "2xx"}) == 1.2
    assert m.registry.get_sample_value("gen_ai_client_operation_time_per_output_chunk_seconds_count",
                                       {**labels, "status_class": "2xx"}) == 2
    # no server-side histogram for what the process called
    assert m.registry.get_sample_value("gen_ai_server_time_to_first_token_seconds_count",
                                       {"endpoint": "POST /v1/messages", "model": "", "status_class": "2xx",
                                        "target": "app"}) is None
