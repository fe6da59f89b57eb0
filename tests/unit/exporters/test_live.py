"""The live exporter's wiring (exporters/live.py): ring buffer chunks in, each
request out once to the span shipper and the metrics; no root, no backend."""

from __future__ import annotations

import struct
from types import SimpleNamespace

from inferprobe.collector.model.events import UsdtProbe as P
from inferprobe.exporters.clock import WallClock
from inferprobe.exporters.live import LiveExport

from tests.factories import conn_open, request, sse_chunk, sse_headers, usdt

MS = 1_000_000


def _chunk(*raws: bytes) -> bytes:
    """Committed ring buffer records, framed as the kernel frames them."""
    out = b""
    for raw in raws:
        out += struct.pack("<II", len(raw), 0) + raw + bytes(-len(raw) % 8)
    return out


class _Shipper:
    def __init__(self) -> None:
        self.submitted: list = []
        self.stats = SimpleNamespace(dropped=0)

    def submit(self, req) -> bool:
        self.submitted.append(req)
        return True

    def close(self, timeout_s: float):
        return SimpleNamespace(as_dict=lambda: {"sent": len(self.submitted)})


class _Metrics:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def request_started(self, pid: int) -> None:
        self.calls.append(("started", pid))

    def request_finished(self, req) -> None:
        self.calls.append(("finished", req.conn))

    def observe_usdt(self, ev) -> None:
        self.calls.append(("usdt", ev.probe))

    def set_totals(self, lost_events: int, otlp_dropped: int) -> None:
        self.calls.append(("totals", lost_events, otlp_dropped))


def test_each_request_goes_out_once_when_it_ends_and_open_ones_at_close():
    t0 = 1_000 * MS
    shipper, metrics = _Shipper(), _Metrics()
    live = LiveExport(WallClock(), shipper=shipper, metrics=metrics)
    written: list[bytes] = []
    sink = live.tee(written.append)
    ended = [conn_open(1, ts=t0 - 1000), request(1, ts=t0), sse_headers(1, ts=t0 + MS),
             sse_chunk(1, ts=t0 + 2 * MS, end=True)]
    still_open = [conn_open(2, ts=t0 - 1000), request(2, ts=t0 + 5 * MS), sse_headers(2, ts=t0 + 6 * MS)]
    sink(_chunk(*ended[:2], usdt(P.QUEUE_DEPTH, 1, 1, ts=t0), b"\x00" * 8))
    sink(_chunk(*ended[2:], *still_open))
    assert len(written) == 2  # the recording gets every chunk as it came
    live.tick(lost_events=3)
    assert [r.conn for r in shipper.submitted] == [1]
    assert ("started", 100) in metrics.calls and ("finished", 1) in metrics.calls
    assert ("usdt", P.QUEUE_DEPTH) in metrics.calls and metrics.calls[-1] == ("totals", 3, 0)
    assert (live.stats.usdt_events, live.stats.undecodable, live.stats.finished) == (1, 1, 1)
    live.tick()  # nothing new: nothing goes out twice
    assert len(shipper.submitted) == 1 and metrics.calls.count(("started", 100)) == 2
    summary = live.close(lost_events=3)
    assert [r.conn for r in shipper.submitted] == [1, 2]
    assert shipper.submitted[1].outcome == "incomplete"
    assert ("finished", 2) not in metrics.calls  # an open request is no finished one
    assert summary["requests_exported_live"] == 2 and summary["otlp"] == {"sent": 2}
