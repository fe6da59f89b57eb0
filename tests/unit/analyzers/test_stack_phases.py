"""Which phase a thread was in at an instant (analyzers/stack_phases.py), from the
ingest stage's requests and server view; no root needed."""

from __future__ import annotations

from inferprobe.analyzers.stack_phases import PhaseTagger
from inferprobe.collector.ingest.pipeline import ingest
from inferprobe.collector.model.events import UsdtProbe as P

from tests.factories import conn_open, request, sse_chunk, sse_headers, usdt

MS = 1_000_000
T0 = 1_000 * MS
API, ENGINE, OTHER = 101, 102, 103


def _socket_side() -> list[bytes]:
    """Read at T0 (returns 10 ns later), headers at +1 ms, tokens at +5 and +8 ms (the last ends it)."""
    return [conn_open(1, ts=T0 - 1000), request(1, tid=API, ts=T0), sse_headers(1, tid=API, ts=T0 + MS),
            sse_chunk(1, tid=API, ts=T0 + 5 * MS), sse_chunk(1, tid=API, ts=T0 + 8 * MS, end=True)]


def test_without_usdt_prefill_and_decode_are_the_request_span_of_the_process():
    tagger = PhaseTagger(ingest(_socket_side()))
    assert not tagger.uses_usdt
    assert tagger.phase_of(100, API, T0 + 5) == "ingress"  # inside the read of the request line
    assert tagger.phase_of(100, API, T0 + MS + 5) == "network-write"
    assert tagger.phase_of(100, OTHER, T0 + 2 * MS) == "prefill"  # any thread of the process
    assert tagger.phase_of(100, OTHER, T0 + 6 * MS) == "decode"
    assert tagger.phase_of(100, OTHER, T0 + 9 * MS) == "idle"
    assert tagger.phase_of(999, OTHER, T0 + 2 * MS) == "idle"  # another process


def test_with_usdt_phases_follow_the_servers_probes_and_their_threads():
    raws = _socket_side() + [
        usdt(P.REQUEST_QUEUED, 7, 1, tid=API, ts=T0 + 100_000),
        usdt(P.REQUEST_SCHEDULED, 7, 1, tid=ENGINE, ts=T0 + 2 * MS),
        usdt(P.PREFILL_START, 7, 5, tid=ENGINE, ts=T0 + 2 * MS),
        usdt(P.PREFILL_END, 7, 5, tid=ENGINE, ts=T0 + 3 * MS),
        usdt(P.DECODE_STEP_START, 0, 1, 1, tid=ENGINE, ts=T0 + 4 * MS),
        usdt(P.DECODE_STEP_END, 0, 1, 1, tid=ENGINE, ts=T0 + 6 * MS),
        # queued again (preempted) and prefilled again on another thread
        usdt(P.REQUEST_QUEUED, 7, 1, tid=API, ts=T0 + 6 * MS),
        usdt(P.REQUEST_SCHEDULED, 7, 1, tid=ENGINE, ts=T0 + 7 * MS),
        usdt(P.PREFILL_START, 7, 5, tid=OTHER, ts=T0 + 7 * MS),
        usdt(P.PREFILL_END, 7, 5, tid=OTHER, ts=T0 + 7 * MS + 500_000),
    ]
    tagger = PhaseTagger(ingest(raws))
    assert tagger.uses_usdt
    assert tagger.phase_of(100, OTHER, T0 + MS) == "queued"  # process-wide
    assert tagger.phase_of(100, ENGINE, T0 + 2 * MS + 5) == "prefill"  # prefill wins over queued
    assert tagger.phase_of(100, OTHER, T0 + 2 * MS + 5) == "idle"  # prefill is the engine thread's
    assert tagger.phase_of(100, ENGINE, T0 + 5 * MS) == "decode"
    assert tagger.phase_of(100, OTHER, T0 + 5 * MS) == "idle"  # socket spans do not count with USDT
    assert tagger.phase_of(100, API, T0 + 6 * MS + 5) == "queued"  # the second wait in the queue
    assert tagger.phase_of(100, OTHER, T0 + 7 * MS + 5) == "prefill"  # the second prefill
    assert tagger.phase_of(100, ENGINE, T0 + 7 * MS + 5) == "idle"
