"""The live exporters' long-lived state is bounded or goes with the process it is of:
the clock's offset samples, the OTLP resources, the metrics' per-process steps and labels,
and the sweep that drops exited processes."""

from __future__ import annotations

from inferprobe.collector.model.events import UsdtProbe as P
from inferprobe.exporters import metrics as metrics_mod
from inferprobe.exporters import otlp
from inferprobe.exporters.clock import OffsetSample, WallClock
from inferprobe.exporters.live import LIVE_CLOCK_SAMPLES, LiveExport
from inferprobe.exporters.metrics import Metrics
from inferprobe.exporters.otlp import SpanShipper, resource_attributes

from tests.factories import conn_open, decoded, request, usdt

MS = 1_000_000
S = 1_000_000_000


def test_the_live_clock_keeps_its_latest_samples_only():
    clock = WallClock()
    LiveExport(clock)
    assert clock.keep == LIVE_CLOCK_SAMPLES
    clock.keep = 5
    for k in range(20):
        clock.add(OffsetSample(k * S, 1000 + k))
    assert [s.offset_ns for s in clock.samples] == [1015, 1016, 1017, 1018, 1019]
    assert clock.to_wall_ns(17 * S + 1) == 17 * S + 1 + 1017
    assert clock.to_wall_ns(0) == 1015   # before the oldest kept: the oldest's offset


def test_a_recording_s_clock_keeps_every_sample():
    clock = WallClock()
    for k in range(5000):
        clock.add(OffsetSample(k * S, 7))
    assert len(clock.samples) == 5000


def test_otlp_resources_are_bounded(monkeypatch):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setattr(otlp, "MAX_RESOURCES", 4)
    clock = WallClock()
    clock.add(OffsetSample(0, 0))
    shipper = SpanShipper(InMemorySpanExporter(), clock, lambda pid: resource_attributes("s", pid, "x"),
                          batch_delay_s=0.01)
    try:
        first = shipper._resource(1)
        for pid in range(2, 10):
            shipper._resource(pid)
            shipper._resource(1)   # used again and again: kept
        assert len(shipper._resources) == 4 and shipper._resource(1) is first
        assert list(shipper._resources) == [7, 8, 9, 1]
    finally:
        shipper.close(5)


def test_metrics_forget_an_exited_process_s_steps():
    m = Metrics({100: "srv", 200: "srv"})
    for pid in (100, 200):
        for ev in decoded(usdt(P.DECODE_STEP_START, 1, 1, 1, pid=pid, ts=MS),
                          usdt(P.DECODE_STEP_START, 2, 1, 1, pid=pid, ts=2 * MS),
                          usdt(P.REQUEST_START, 9, 5, 3, pid=pid, ts=2 * MS),
                          usdt(P.TOKEN_EMIT, 9, pid=pid, ts=3 * MS)):
            m.observe_usdt(ev)
    assert m.pids() == {100, 200} and 200 in m._step_before
    m.forget_process(200)
    assert m.pids() == {100} and 200 not in m._step_before and 200 not in m._stalled


def test_the_target_label_is_capped(monkeypatch):
    monkeypatch.setattr(metrics_mod, "MAX_TARGETS", 3)
    m = Metrics({pid: f"proc{pid}" for pid in range(10)})
    assert [m.target(pid) for pid in range(5)] == ["proc0", "proc1", "proc2", "other", "other"]
    assert m.target(1) == "proc1"


class _Metrics:
    def __init__(self) -> None:
        self.forgotten: list[int] = []
        self.finished: list[int] = []

    def pids(self) -> set[int]:
        return {200, 300}

    def forget_process(self, pid: int) -> None:
        self.forgotten.append(pid)

    def request_started(self, pid: int) -> None:
        pass

    def request_finished(self, req) -> None:
        self.finished.append(req.pid)


def test_the_sweep_drops_what_is_kept_of_exited_processes_only():
    alive = {100}
    metrics = _Metrics()
    live = LiveExport(WallClock(), metrics=metrics, alive=lambda pid: pid in alive)
    t0 = 1_000 * MS
    raws = [conn_open(1, pid=100, ts=t0), request(1, pid=100, ts=t0 + 1)]
    for cid in range(2, 52):
        raws += [conn_open(cid, pid=200, fd=cid, ts=t0), request(cid, pid=200, fd=cid, ts=t0 + cid)]
    live._feed(raws)
    live._harvest()
    assert live.forget_exited() == 2   # 200 (connections, metrics) and 300 (metrics)
    assert sorted(metrics.forgotten) == [200, 300]
    assert metrics.finished == [200] * 50   # its requests went out, ended by the exit
    assert live.ingest.pids() == {100} | {200}   # closed connections wait out SERVER_MEMORY_NS
    assert {c.pid for c in live.ingest.sessionizer.connections.values() if c.t_close_ns is None} == {100}
    assert live.stats.processes_exited == 2
