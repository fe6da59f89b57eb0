"""USDT events -> server timeline, correlation with socket requests, phases.

Pure stages fed with the exact bytes the kernel writes (tests/factories.py).
"""

from __future__ import annotations

from inferprobe.analyzers.decompose import TTFT_PHASES, phases_ns
from inferprobe.analyzers.scheduler import find_stalls, stall_ns_by_request, summarize_scheduler
from inferprobe.collector.ingest.pipeline import ingest
from inferprobe.collector.ingest.server_view import build_server_view
from inferprobe.collector.model.events import UsdtProbe as P

from tests.factories import conn_close, conn_open, decoded, request, sse_chunk, sse_headers, usdt

MS = 1_000_000
API, ENGINE = 101, 102  # thread ids


def _server_side(req_id: int, fd: int, t0: int, prompt: int = 5) -> list[bytes]:
    """A request's probes up to its first token: start at t0+1ms, queued, scheduled
    at +3, prefill +4..+6, first token +6.5 ms."""
    raws = [
        usdt(P.REQUEST_START, req_id, prompt, fd, tid=API, ts=t0 + 1 * MS),
        usdt(P.REQUEST_QUEUED, req_id, 1, tid=API, ts=t0 + 1 * MS + 1000),
        usdt(P.REQUEST_SCHEDULED, req_id, 1, tid=ENGINE, ts=t0 + 3 * MS),
        usdt(P.PREFILL_START, req_id, prompt, tid=ENGINE, ts=t0 + 4 * MS),
        usdt(P.PREFILL_END, req_id, prompt, tid=ENGINE, ts=t0 + 6 * MS),
        usdt(P.TOKEN_EMIT, req_id, 0, tid=ENGINE, ts=t0 + 6 * MS + 500_000),
    ]
    return raws


def _steps(t0: int, n: int, batch: int) -> list[bytes]:
    raws = []
    for k in range(n):
        start = t0 + (10 + 10 * k) * MS
        raws += [usdt(P.DECODE_STEP_START, k, batch, batch, tid=ENGINE, ts=start),
                 usdt(P.DECODE_STEP_END, k, batch, batch, tid=ENGINE, ts=start + 4 * MS)]
    return raws


def _build(raws: list[bytes]):
    got = ingest(raws)
    return got.requests, got.server, got.correlated


def _socket_side(conn: int, fd: int, t0: int, token_times: list[int]) -> list[bytes]:
    raws = [conn_open(conn, fd=fd, ts=t0 - 1000), request(conn, tid=API, ts=t0),
            sse_headers(conn, tid=API, ts=t0 + 2 * MS)]
    for i, t in enumerate(token_times):
        raws.append(sse_chunk(conn, tid=API, ts=t, end=(i == len(token_times) - 1)))
    return raws


def test_two_concurrent_requests_tie_to_their_sockets_by_fd():
    t0 = 1_000 * MS
    raws = _steps(t0, 3, 2)
    # Request 7 on fd 11, request 8 on fd 12; both read before either starts.
    raws += _socket_side(1, 11, t0, [t0 + 7 * MS, t0 + 15 * MS, t0 + 25 * MS, t0 + 35 * MS])
    raws += _socket_side(2, 12, t0 + 100, [t0 + 7 * MS + 10, t0 + 15 * MS + 10, t0 + 25 * MS + 10,
                                           t0 + 35 * MS + 10])
    raws += _server_side(8, 12, t0 + 200)
    raws += _server_side(7, 11, t0)
    for k in range(3):
        for req_id in (7, 8):
            raws.append(usdt(P.TOKEN_EMIT, req_id, k + 1, tid=ENGINE, ts=t0 + (12 + 10 * k) * MS))
    requests, view, matched = _build(raws)
    assert matched == 2
    by_conn = {r.conn: r for r in requests}
    assert by_conn[1].server.req_id == 7 and by_conn[2].server.req_id == 8
    assert {r.correlated_by for r in requests} == {"conn_fd"}
    # Both took part in the three decode steps; the first token came from prefill.
    assert [s.step_id for s in by_conn[1].server.steps] == [0, 1, 2]
    assert view.steps[0].requests == {7, 8}


def test_phases_are_contiguous_and_sum_to_ttft_and_e2e():
    t0 = 1_000 * MS
    raws = _steps(t0, 2, 1)
    raws += _socket_side(1, 11, t0, [t0 + 7 * MS, t0 + 15 * MS, t0 + 25 * MS])
    raws += _server_side(7, 11, t0)
    raws += [usdt(P.TOKEN_EMIT, 7, 1, tid=ENGINE, ts=t0 + 14 * MS),
             usdt(P.TOKEN_EMIT, 7, 2, tid=ENGINE, ts=t0 + 24 * MS)]
    (req,), _view, _ = _build(raws)
    phases = phases_ns(req)
    assert list(phases) == ["ingress", "queue", "schedule", "prefill", "first_token", "network_flush",
                            "decode", "finish"]
    assert phases["ingress"] == 1 * MS + 1000 - 10  # request line read exits at t0+10ns
    assert phases["queue"] == 3 * MS - (1 * MS + 1000)
    assert phases["prefill"] == 2 * MS
    assert phases["network_flush"] == 7 * MS - (6 * MS + 500_000)
    assert sum(v for k, v in phases.items() if k in TTFT_PHASES) == req.ttft_ns
    assert sum(phases.values()) == req.e2e_ns


def test_socket_only_requests_still_decompose():
    t0 = 1_000 * MS
    (req,), view, matched = _build(_socket_side(1, 11, t0, [t0 + 7 * MS, t0 + 9 * MS]))
    assert view.empty and matched == 0 and req.server is None
    phases = phases_ns(req)
    assert list(phases) == ["response_headers", "first_token", "decode", "finish"]
    assert sum(phases.values()) == req.e2e_ns


def test_without_fd_a_single_open_request_matches_by_time_but_two_do_not():
    t0 = 1_000 * MS
    one = _socket_side(1, 11, t0, [t0 + 7 * MS]) + [
        usdt(P.REQUEST_START, 7, 5, -1, tid=ENGINE, ts=t0 + 1 * MS)]
    (req,), _, matched = _build(one)
    assert matched == 1 and req.correlated_by == "time"

    two = (_socket_side(1, 11, t0, [t0 + 7 * MS]) + _socket_side(2, 12, t0 + 50, [t0 + 8 * MS])
           + [usdt(P.REQUEST_START, 7, 5, -1, tid=ENGINE, ts=t0 + 1 * MS)])
    requests, _, matched = _build(two)
    assert matched == 0 and all(r.server is None for r in requests)


def test_without_fd_the_reading_thread_disambiguates():
    t0 = 1_000 * MS
    a = _socket_side(1, 11, t0, [t0 + 7 * MS])
    b = [conn_open(2, fd=12, ts=t0), request(2, tid=555, ts=t0 + 50),
         sse_headers(2, tid=555, ts=t0 + 2 * MS), sse_chunk(2, tid=555, ts=t0 + 8 * MS, end=True)]
    raws = a + b + [usdt(P.REQUEST_START, 9, 5, -1, tid=555, ts=t0 + 1 * MS)]
    requests, _, matched = _build(raws)
    assert matched == 1
    assert {r.conn: r.server.req_id if r.server else None for r in requests} == {1: None, 2: 9}


def test_batch_stalls_are_gaps_between_steps_sharing_requests():
    t0 = 1_000 * MS
    raws = _steps(t0, 3, 1)  # steps at 10-14, 20-24, 30-34 ms
    raws += _server_side(7, 11, t0)
    # Tokens of request 7 in steps 0 and 1 only; step 2 serves nobody we know.
    raws += [usdt(P.TOKEN_EMIT, 7, 1, tid=ENGINE, ts=t0 + 13 * MS),
             usdt(P.TOKEN_EMIT, 7, 2, tid=ENGINE, ts=t0 + 23 * MS)]
    view = build_server_view(e for e in decoded(*raws) if e.type == 5)
    stalls = find_stalls(view.steps)
    assert [(s.duration_ns, set(s.requests)) for s in stalls] == [(6 * MS, {7})]
    assert stall_ns_by_request(stalls) == {(100, 7): 6 * MS}


def test_scheduler_gauges_keep_their_peaks_when_downsampled():
    raws = []
    t = 1_000 * MS
    for i in range(2000):
        waiting = 57 if i == 1234 else i % 5
        raws.append(usdt(P.QUEUE_DEPTH, waiting, 4, tid=ENGINE, ts=t + i * MS))
        raws.append(usdt(P.KV_USAGE, 900 if i == 77 else 100, 1000, tid=ENGINE, ts=t + i * MS + 1))
    summary = summarize_scheduler(build_server_view(decoded(*raws)))
    assert summary.queue_length_max == 57 and summary.occupancy_max == 0.9
    assert len(summary.queue_length) <= 500
    assert max(v for _, v in summary.queue_length) == 57
    assert max(v for _, v in summary.occupancy) == 0.9


def test_pipelined_requests_on_one_connection_tie_in_order():
    t0 = 1_000 * MS
    # Two requests read back to back on fd 11 before the server starts either.
    raws = [conn_open(1, fd=11, ts=t0 - 1000), request(1, tid=API, ts=t0), request(1, tid=API, ts=t0 + 100),
            sse_headers(1, tid=API, ts=t0 + 2 * MS), sse_chunk(1, tid=API, ts=t0 + 3 * MS, end=True),
            sse_headers(1, tid=API, ts=t0 + 4 * MS), sse_chunk(1, tid=API, ts=t0 + 5 * MS, end=True),
            usdt(P.REQUEST_START, 7, 5, 11, tid=API, ts=t0 + 1 * MS),
            usdt(P.REQUEST_START, 8, 5, 11, tid=API, ts=t0 + 3 * MS + 500_000)]
    requests, _, matched = _build(raws)
    assert matched == 2
    assert [r.server.req_id for r in requests] == [7, 8]


def test_a_reused_fd_ties_to_the_connection_open_at_the_time():
    t0 = 1_000 * MS
    first = _socket_side(1, 11, t0, [t0 + 3 * MS]) + [conn_close(1, ts=t0 + 4 * MS)]
    second = _socket_side(2, 11, t0 + 10 * MS, [t0 + 13 * MS])
    raws = first + second + [usdt(P.REQUEST_START, 9, 5, 11, tid=API, ts=t0 + 11 * MS)]
    requests, _, matched = _build(raws)
    assert matched == 1
    assert {r.conn: (r.server.req_id if r.server else None) for r in requests} == {1: None, 2: 9}
