"""W3C traceparent / tracestate: what is valid, and how the records reach their requests."""

import pytest

from inferprobe.collector.ingest.sessionizer import sessionize
from inferprobe.collector.ingest.trace_context import TraceParent, clean_tracestate, parse_traceparent
from inferprobe.collector.model import events as ev

from tests.factories import conn_close, decoded, request, sse_chunk, sse_headers

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"


NO_FLAGS = ev.TraceContextFlag(0)


def trace_record(conn_id: int, exit_ns: int, traceparent: str | None = VALID, tracestate: str | None = None,
                 flags: ev.TraceContextFlag = NO_FLAGS) -> bytes:
    e = ev.TraceContextEvent()
    e.hdr.type = ev.EventType.TRACE_CONTEXT
    e.hdr.pid = e.hdr.tid = 100
    e.hdr.ts_ns = exit_ns - 10
    e.exit_ns = exit_ns
    e.conn_id = conn_id
    if traceparent is not None:
        flags |= ev.TraceContextFlag.TRACEPARENT
        e.traceparent = traceparent.encode("latin-1")
        e.traceparent_len = len(traceparent)
    if tracestate is not None:
        flags |= ev.TraceContextFlag.TRACESTATE
        e.tracestate = tracestate.encode("latin-1")
        e.tracestate_len = len(tracestate)
    e.flags = flags
    return bytes(e)


def test_a_valid_traceparent_gives_the_callers_ids_and_flags():
    assert parse_traceparent(" " + VALID) == TraceParent(TRACE, PARENT, 1)
    assert parse_traceparent(f"00-{TRACE}-{PARENT}-00").sampled is False


@pytest.mark.parametrize("value", [
    f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
    f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
    f"ff-{TRACE}-{PARENT}-01",  # version ff is forbidden
    f"00-{TRACE.upper()}-{PARENT}-01",  # upper-case hex
    f"00-{TRACE[:-1]}-{PARENT}-01",  # short trace id
    f"00-{TRACE}-{PARENT}-01-extra",  # version 00 has exactly four fields
    f"00-{TRACE}-{PARENT}",  # no flags
    "garbage",
    "",
])
def test_invalid_traceparents_are_refused(value):
    assert parse_traceparent(value) is None


def test_a_later_version_may_carry_more_fields():
    assert parse_traceparent(f"01-{TRACE}-{PARENT}-03-whatever") == TraceParent(TRACE, PARENT, 3)


def test_tracestate_passes_through_and_a_cut_one_keeps_whole_members():
    sent = " congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"
    assert clean_tracestate(sent) == "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    assert clean_tracestate("congo=t61rcWkgMzE,rojo=00f0", cut=True) == "congo=t61rcWkgMzE"
    assert clean_tracestate("one-member-cut=abc", cut=True) is None
    assert clean_tracestate("not a list member") is None


def test_the_record_reaches_its_request_in_either_order():
    # request(...) reads exit at ts + 10; the record names that exit
    before = sessionize(decoded(trace_record(1, 110, tracestate="a=1"), request(1, ts=100)))
    after = sessionize(decoded(request(2, ts=100), trace_record(2, 110)))
    for s in (before, after):
        (r,) = s.requests
        assert (r.trace_id, r.parent_span_id, r.trace_flags) == (TRACE, PARENT, 1)
    assert before.requests[0].tracestate == "a=1"


def test_a_record_of_a_later_read_goes_to_the_request_being_read():
    from tests.factories import io
    s = sessionize(decoded(request(1, ts=100), io(1, read=True, nbytes=300, ts=150),
                           trace_record(1, 160, flags=ev.TraceContextFlag.LATER_IO)))
    (r,) = s.requests
    assert r.trace_id == TRACE


def test_keep_alive_requests_each_get_their_own_context():
    other = f"00-{'1' * 32}-{'2' * 16}-00"
    s = sessionize(decoded(
        request(1, ts=100), trace_record(1, 110), sse_headers(1, ts=200), sse_chunk(1, end=True, ts=300),
        request(1, ts=1000), sse_headers(1, ts=1100), sse_chunk(1, end=True, ts=1200),
        request(1, ts=2000), trace_record(1, 2010, other), conn_close(1, ts=3000)))
    first, second, third = s.requests
    assert first.trace_id == TRACE and second.trace_id is None and third.trace_id == "1" * 32


def test_an_invalid_or_cut_traceparent_is_ignored_and_counted():
    s = sessionize(decoded(
        request(1, ts=100), trace_record(1, 110, f"00-{'0' * 32}-{PARENT}-01"),
        request(2, ts=100), trace_record(2, 110, VALID[:30], flags=ev.TraceContextFlag.TRACEPARENT_CUT)))
    assert all(r.trace_id is None for r in s.requests)
    assert s.stats.trace_context_invalid == 2


def test_records_whose_io_never_came_are_bounded():
    from inferprobe.collector.ingest.trace_context import MAX_WAITING, TraceContextJoiner
    from inferprobe.collector.model.timeline import SessionStats

    joiner = TraceContextJoiner(SessionStats())
    for k in range(MAX_WAITING + 10):
        joiner.feed(ev.decode(trace_record(k, 1000 + k)))
    assert len(joiner._waiting) == MAX_WAITING
