"""Pure stages of the report: finding ranking, phase split, time bins."""

from __future__ import annotations

import pytest

from inferprobe.analyzers.breakdown import break_down
from inferprobe.analyzers.findings import Finding, FindingList
from inferprobe.analyzers.timeseries import over_time
from inferprobe.collector.model.events import EventType, UsdtProbe, UsdtRecord
from inferprobe.collector.model.timeline import Outcome, Request

MS = 1_000_000


def _finding(kind: str, share: float) -> Finding:
    return Finding(kind=kind, share=share, of="p99 TTFT", sentence=f"{kind} explains it.",
                   recommendation="Fix it.", evidence="decomposition", source="test")


def test_findings_rank_by_share_then_kind():
    found = FindingList([_finding("b", 0.2), _finding("a", 0.2), _finding("c", 0.7)])
    assert [f.kind for f in found.ranked()] == ["c", "a", "b"]


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_finding_share_is_a_fraction(share):
    with pytest.raises(ValueError):
        _finding("x", share)


def _request(t0: int, headers_after: int, first_after: int, gaps: list[int], conn: int = 1) -> Request:
    tokens = [t0 + first_after]
    for g in gaps:
        tokens.append(tokens[-1] + g)
    return Request(pid=1, tid=1, conn=conn, method="POST", path="/v1", t_ingress_ns=t0, status=200,
                   outcome=Outcome.COMPLETE, t_response_start_ns=t0 + headers_after, token_ns=tokens,
                   t_end_ns=tokens[-1] + 10, streaming=True)


def test_socket_decomposition_splits_ttft_at_the_response_headers():
    reqs = [_request(i * 100 * MS, headers_after=(i + 1) * MS, first_after=(i + 1) * 3 * MS,
                     gaps=[2 * MS], conn=i) for i in range(100)]
    d = break_down(reqs)
    p99 = next(b for b in d.ttft if b.label == "p99")
    assert p99.request.conn == 98  # nearest rank 99 of 100
    assert p99.ttft_ns == 99 * 3 * MS
    assert dict(p99.phases) == {"response_headers": 99 * MS, "first_token": 2 * 99 * MS}
    assert p99.dominant()[0] == "first_token"
    assert [w.request.conn for w in d.waterfall][:2] == [99, 98]


def test_time_series_bins_and_server_gauges():
    reqs = [_request(i * 500 * MS, MS, 2 * MS, [MS, 3 * MS]) for i in range(10)]
    usdt = [UsdtRecord(EventType.USDT, 1, 1, 1000 * MS, UsdtProbe.QUEUE_DEPTH, (7, 4)),
            UsdtRecord(EventType.USDT, 1, 1, 2000 * MS, UsdtProbe.KV_USAGE, (30, 120))]
    s = over_time(reqs, usdt, t0_ns=0)
    assert sum(b.requests for b in s.bins) == 10
    assert s.queue_peak == 7 and s.running_peak == 4
    assert s.kv_peak == pytest.approx(0.25)
    assert len(s.ttft_points) == 10


def test_a_finding_another_probe_set_would_explain_names_its_flag():
    """Decode stalls are explained by the lock and off-CPU sets: a recording
    without them says which flags to add; one with them points at their sections."""
    from inferprobe.analyzers.verdict import itl_stall_finding

    stalled = [_request(i * 1000 * MS, MS, 5 * MS, [2 * MS] * 8 + [40 * MS]) for i in range(4)]
    bare = itl_stall_finding(stalled, active={"sockets": "", "usdt": ""})
    assert bare is not None and "record again with --locks --offcpu" in bare.recommendation
    half = itl_stall_finding(stalled, active={"sockets": "", "locks": ""})
    assert "record again with --offcpu" in half.recommendation and "--locks" not in half.recommendation
    full = itl_stall_finding(stalled, active={"sockets": "", "locks": "", "offcpu": ""})
    assert "record again" not in full.recommendation and "off-CPU sections" in full.recommendation


def _breakdown(p50: dict[str, int], p99: dict[str, int]):
    from inferprobe.analyzers.breakdown import SOURCE_USDT, Breakdown, PercentileBreakdown, RequestRef

    def row(label, phases):
        return PercentileBreakdown(label=label, request=RequestRef(1, 0, "POST /v1"),
                                   ttft_ns=sum(phases.values()), phases=tuple(phases.items()))

    return Breakdown(source=SOURCE_USDT, phase_names=tuple(p99), ttft=(row("p50", p50), row("p99", p99)),
                     waterfall=())


def _series(waiting: int, running: int):
    from inferprobe.analyzers.timeseries import TimeSeries

    return TimeSeries(t0_ns=0, span_s=1, bin_s=1, ttft_points=(), bins=(), queue_waiting=((0.5, waiting),),
                      queue_running=((0.5, running),), kv_occupancy=())


def test_verdict_agrees_with_the_p50_row_and_says_what_queue_means_at_an_empty_queue():
    """The demo read '53 % of p99 TTFT is the schedule phase; the waiting queue peaks at 0'
    beside a p50 request that was 59 % 'queue'."""
    from inferprobe.analyzers.verdict import ttft_phase_finding

    decomp = _breakdown(p50={"ingress": 1 * MS, "queue": 59 * MS, "schedule": 30 * MS, "prefill": 10 * MS},
                        p99={"ingress": 1 * MS, "queue": 30 * MS, "schedule": 53 * MS, "prefill": 16 * MS})
    f = ttft_phase_finding(decomp, _series(waiting=0, running=8))
    assert "is the schedule phase (from request_scheduled to its prefill_start)" in f.sentence
    assert "(at p50, 59 % is queue)" in f.sentence
    assert "no request waited for a batch slot (the engine's waiting-queue gauge stayed at 0" in f.sentence
    # queue dominant with an empty waiting queue: admission, not batch size
    queued = _breakdown(p50={"queue": 60 * MS, "prefill": 40 * MS},
                        p99={"queue": 70 * MS, "prefill": 30 * MS})
    f = ttft_phase_finding(queued, _series(waiting=0, running=8))
    assert "(from request_queued to request_scheduled)" in f.sentence and "(at p50" not in f.sentence
    assert "not for a batch slot" in f.recommendation and "raising the batch size" in f.recommendation
    busy = ttft_phase_finding(queued, _series(waiting=12, running=8))
    assert "peaked at 12, at most 8 running" in busy.sentence
    assert busy.recommendation.startswith("Requests wait for a batch slot: raise the maximum batch size")
