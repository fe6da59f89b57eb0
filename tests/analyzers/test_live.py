"""The live view's sliding window, driven with made-up event times."""

from __future__ import annotations

from inferprobe.analyzers.live import LiveWindow

import factories as f

MS = 1_000_000
S = 1_000_000_000


def _stream(conn: int, t0: int, first_ms: int, gaps_ms: list[int], end: bool = True) -> list[bytes]:
    # the request read completes at t0 + 10 ns (factories: exit = entry + 10)
    events = [f.conn_open(conn, ts=t0 - 1), f.request(conn, ts=t0), f.sse_headers(conn, ts=t0 + MS)]
    t = t0 + 10 + first_ms * MS
    events.append(f.sse_chunk(conn, ts=t))
    for g in gaps_ms:
        t += g * MS
        events.append(f.sse_chunk(conn, ts=t))
    if end:
        events.append(f.sse_chunk(conn, done=True, end=True, ts=t + 1))
    return events


def test_window_rates_percentiles_and_in_flight():
    live = LiveWindow(window_s=10)
    for i in range(20):
        for e in f.decoded(*_stream(i + 1, 100 * S + i * S // 2, first_ms=5 + i, gaps_ms=[2, 4])):
            live.feed(e)
    for e in f.decoded(*_stream(99, 109 * S, first_ms=1, gaps_ms=[], end=False)):
        live.feed(e)
    snap = live.snapshot(now_ns=110 * S)
    assert snap.total_requests == 21
    assert snap.in_flight == 1  # the open stream
    assert snap.requests_per_s == 2.1  # 21 arrivals in the 10 s window
    assert snap.ttft_p50_ns == 14 * MS  # first tokens at 5..24 ms and 1 ms: rank 11 of 21
    assert snap.itl_p50_ns == 2 * MS and snap.itl_p99_ns == 4 * MS
    # 15 s later every measurement has left the window; the open one stays in flight
    later = live.snapshot(now_ns=125 * S)
    assert later.requests_per_s == 0 and later.ttft_p50_ns is None
    assert later.in_flight == 1 and later.total_requests == 21
