"""The live view's sliding window, driven with made-up event times."""

from __future__ import annotations

from inferprobe.analyzers.live import LOCK_HISTORY_NS, LiveLocks, LiveWindow
from inferprobe.analyzers.locks import Symbols, WaitClassifier
from inferprobe.collector.model.events import EventType, FutexWaitFlag, FutexWaitRecord

from tests import factories as f

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


def _futex_wait(tid: int, start: int, duration: int, val: int = 2) -> FutexWaitRecord:
    # val 2: glibc's "locked, with waiters" lock word; no frames, so that decides it is a lock
    # wait (any other value, with no frames: unknown, which never counts)
    return FutexWaitRecord(
        type=EventType.FUTEX_WAIT, pid=100, tid=tid, ts_ns=start, duration_ns=duration, uaddr=0x10,
        op=0, val=val, ret=0, flags=FutexWaitFlag(0), ip=0, stack_id=-1, scan=(), waker_tid=0,
        waker_ip=0, waker_stack_id=-1, waker_scan=())


def _request_on_thread(conn: int, tid: int, t0: int, length_ms: int) -> list:
    return f.decoded(f.conn_open(conn, ts=t0 - 1), f.request(conn, ts=t0, tid=tid),
                     f.sse_headers(conn, ts=t0 + MS, tid=tid),
                     f.sse_chunk(conn, done=True, end=True, ts=t0 + length_ms * MS, tid=tid))


def test_mutex_flagged_share_counts_requests_as_they_settle_and_leave_the_window():
    live = LiveWindow(window_s=10, lock_waits=LiveLocks(WaitClassifier(Symbols(None))))
    t0 = 100 * S
    for e in _request_on_thread(1, tid=7, t0=t0, length_ms=100):  # waits 60 of 100 ms: flagged
        live.feed(e)
    for e in _request_on_thread(2, tid=8, t0=t0, length_ms=100):  # waits 10 of 100 ms: not
        live.feed(e)
    live.feed(_futex_wait(7, t0 + 20 * MS, 60 * MS))
    live.feed(_futex_wait(8, t0 + 20 * MS, 10 * MS))
    live.feed(_futex_wait(9, t0 + 20 * MS, 90 * MS))  # a thread serving neither request
    settling = live.snapshot(now_ns=t0 + 200 * MS)  # their last waits may still be in flight
    assert settling.locks_traced and settling.mutex_judged == 0 and settling.mutex_flagged_share is None
    snap = live.snapshot(now_ns=t0 + 2 * S)
    assert snap.mutex_judged == 2 and snap.mutex_flagged_share == 0.5
    later = live.snapshot(now_ns=t0 + 20 * S)
    assert later.mutex_judged == 0 and later.mutex_flagged_share is None
    assert live.locks.retained_waits == 0  # nothing open, nothing in the window: nothing kept


def test_without_lock_tracing_the_snapshot_says_so():
    live = LiveWindow(window_s=10)
    live.feed(_futex_wait(7, S, MS))
    snap = live.snapshot(now_ns=2 * S)
    assert not snap.locks_traced and snap.mutex_flagged_share is None


def test_lock_waits_kept_for_a_request_that_never_ends_are_capped():
    live = LiveWindow(window_s=10, lock_waits=LiveLocks(WaitClassifier(Symbols(None))))
    t0 = 100 * S
    events = f.decoded(f.conn_open(1, ts=t0 - 1), f.request(1, ts=t0, tid=7),
                       f.sse_headers(1, ts=t0 + MS, tid=7))  # an endless stream
    for e in events:
        live.feed(e)
    live.feed(_futex_wait(7, t0 + S, 10 * MS))  # a lock wait: kept while the stream is open
    live.feed(_futex_wait(7, t0 + 2 * S, 10 * MS, val=0))  # not a lock wait: never kept
    live.snapshot(now_ns=t0 + 3 * S)
    assert live.locks.retained_waits == 1
    live.snapshot(now_ns=t0 + LOCK_HISTORY_NS + 2 * S)  # the stream is still open
    assert live.locks.retained_waits == 0
