"""Inter-token gaps split by phase (analyzers/itl_phases.py), from the kernel's event bytes."""

from __future__ import annotations

import random

from inferprobe.analyzers.breakdown import itl_breakdown
from inferprobe.analyzers.itl_phases import ITL_PHASES, gap_phases_ns, itl_phases_ns, split_gap
from inferprobe.collector.ingest.correlate import correlate
from inferprobe.collector.ingest.server_view import build_server_view
from inferprobe.collector.ingest.sessionizer import sessionize
from inferprobe.collector.model.events import UsdtProbe as P
from inferprobe.reports.json_report import itl_split_json

from tests.factories import conn_open, decoded, request, sse_chunk, sse_headers, usdt

MS = 1_000_000
API, ENGINE = 101, 102
T0 = 1000 * MS


def _recorded(with_usdt: bool = True, late_emit: bool = False):
    """One streamed request: prefill +4..+6 ms, first token emitted +6.5 and written +7;
    decode steps k at +10+10k .. +14+10k, each token emitted 0.5 ms after its step ended
    and written 0.5 ms after that. With late_emit, the last write carries a token that was
    emitted before the previous write (a server that buffers)."""
    emits = [6.5, 14.5, 24.5, 34.5]
    writes = [7, 15, 25, 35]
    if late_emit:
        writes.append(40)
    raws = [conn_open(1, fd=9, ts=T0 - 1000), request(1, tid=API, ts=T0),
            sse_headers(1, tid=API, ts=T0 + 2 * MS)]
    raws += [sse_chunk(1, tid=API, ts=T0 + int(w * MS), end=(i == len(writes) - 1))
             for i, w in enumerate(writes)]
    if with_usdt:
        raws += [usdt(P.REQUEST_START, 7, 5, 9, tid=API, ts=T0 + 1 * MS),
                 usdt(P.REQUEST_SCHEDULED, 7, 1, tid=ENGINE, ts=T0 + 3 * MS),
                 usdt(P.PREFILL_START, 7, 5, tid=ENGINE, ts=T0 + 4 * MS),
                 usdt(P.PREFILL_END, 7, 5, tid=ENGINE, ts=T0 + 6 * MS)]
        for k in range(3):
            start = T0 + (10 + 10 * k) * MS
            raws += [usdt(P.DECODE_STEP_START, k, 1, 1, tid=ENGINE, ts=start),
                     usdt(P.DECODE_STEP_END, k, 1, 1, tid=ENGINE, ts=start + 4 * MS)]
        raws += [usdt(P.TOKEN_EMIT, 7, i, tid=ENGINE, ts=T0 + int(e * MS)) for i, e in enumerate(emits)]
    events = decoded(*raws)
    session = sessionize(e for e in events if e.type != 5)
    view = build_server_view(e for e in events if e.type == 5)
    requests = sorted(session.requests, key=lambda r: r.t_ingress_ns)
    correlate(requests, session.connections, view)
    return requests


def test_each_gap_splits_into_decode_stall_other_flush():
    (r,) = _recorded()
    assert r.server is not None and len(r.server.steps) == 3
    gaps = gap_phases_ns(r)
    # every gap: waits 3 ms (first) or 5 ms for its step, 4 ms in it, 0.5 ms to the emit, 0.5 ms to the write
    assert gaps == [{"decode": 4 * MS, "stall": 3 * MS, "flush": MS // 2, "other": MS // 2}] + [
        {"decode": 4 * MS, "stall": 5 * MS, "flush": MS // 2, "other": MS // 2}] * 2
    assert [sum(g.values()) for g in gaps] == r.itl_ns
    total = itl_phases_ns(r)
    assert sum(total.values()) == r.token_ns[-1] - r.token_ns[0]
    assert total["stall"] == 13 * MS


def test_token_emitted_before_the_previous_write_makes_the_gap_flush():
    (r,) = _recorded(late_emit=True)
    last = gap_phases_ns(r)[-1]
    assert last == {"decode": 0, "stall": 0, "flush": 5 * MS, "other": 0}


def test_socket_only_cannot_split():
    (r,) = _recorded(with_usdt=False)
    assert r.server is None and len(r.itl_ns) == 3
    assert gap_phases_ns(r) is None and itl_phases_ns(r) is None
    assert itl_breakdown([r]) == () and itl_split_json(itl_breakdown([r])) is None


def test_percentile_gaps_in_report_and_json():
    (r,) = _recorded()
    bars = itl_breakdown([r])
    assert [b.label for b in bars] == ["p50", "p90", "p99"]
    assert [b.itl_ns for b in bars] == [10 * MS] * 3  # gaps 8, 10, 10 ms: nearest rank
    for b in bars:
        assert [n for n, _ in b.phases] == list(ITL_PHASES)
        assert sum(ns for _, ns in b.phases) == b.itl_ns
    js = itl_split_json(bars)
    assert js["p50"]["itl_ns"] == 10 * MS and sum(js["p99"]["phases_ns"].values()) == 10 * MS


def test_phases_sum_to_the_gap_for_any_arrangement():
    """Overlapping, unfinished and out-of-window steps, emits anywhere: never negative, exact sum."""
    rng = random.Random(5)
    for _ in range(2000):
        a = rng.randrange(0, 100)
        b = a + rng.randrange(0, 100)
        emits = sorted(rng.randrange(0, 250) for _ in range(rng.randrange(0, 4)))
        steps = []
        for _ in range(rng.randrange(0, 5)):
            s = rng.randrange(-20, 250)
            steps.append((s, None if rng.random() < 0.2 else s + rng.randrange(0, 60)))
        split = split_gap(a, b, emits, steps)
        assert set(split) == set(ITL_PHASES)
        assert all(v >= 0 for v in split.values()), (a, b, emits, steps, split)
        assert sum(split.values()) == b - a
