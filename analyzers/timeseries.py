"""Latency and server gauges over time, on one axis: seconds since recording start.

TTFT is one point per request (at its first token); inter-token gaps and
request rate are binned, because a busy minute has tens of thousands of
gaps. The server's own gauges come from its USDT probes when attached:
queue_depth(waiting, running) and kv_usage(used, capacity).

Pure functions over Request timelines and decoded USDT events; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferprobe.analyzers.cadence import percentile
from inferprobe.collector.model.events import UsdtRecord
from inferprobe.collector.model.timeline import Request

TARGET_BINS = 60
NICE_WIDTHS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)


@dataclass(frozen=True)
class Bin:
    t_s: float  # bin start, seconds since t0
    requests: int  # requests whose request line arrived in the bin
    itl_p50_ns: float | None
    itl_p99_ns: float | None


@dataclass(frozen=True)
class TimeSeries:
    t0_ns: int
    span_s: float
    bin_s: float
    ttft_points: tuple[tuple[float, int], ...]  # (s at first token, TTFT ns)
    bins: tuple[Bin, ...]
    queue_waiting: tuple[tuple[float, int], ...]  # (s, waiting) from queue_depth probes
    queue_running: tuple[tuple[float, int], ...]
    kv_occupancy: tuple[tuple[float, float], ...]  # (s, used / capacity)

    @property
    def queue_peak(self) -> int | None:
        return max((w for _, w in self.queue_waiting), default=None)

    @property
    def running_peak(self) -> int | None:
        return max((r for _, r in self.queue_running), default=None)

    @property
    def kv_peak(self) -> float | None:
        return max((k for _, k in self.kv_occupancy), default=None)


def _bin_width(span_s: float) -> float:
    """The smallest round width that gives at most about TARGET_BINS bins."""
    return next((w for w in NICE_WIDTHS_S if span_s / w <= TARGET_BINS), NICE_WIDTHS_S[-1])


def over_time(
    requests: Sequence[Request], usdt: Sequence[UsdtRecord], t0_ns: int | None = None
) -> TimeSeries:
    times = [r.t_ingress_ns for r in requests] + [e.ts_ns for e in usdt]
    if t0_ns is None or (times and min(times) < t0_ns):
        t0_ns = min(times) if times else 0
    ends = [r.t_end_ns or (r.token_ns[-1] if r.token_ns else r.t_ingress_ns) for r in requests]
    span_s = max([0.0] + [(t - t0_ns) / 1e9 for t in ends + [e.ts_ns for e in usdt]])
    width = _bin_width(span_s)
    nbins = int(span_s // width) + 1

    def at(ns: int) -> float:
        return (ns - t0_ns) / 1e9

    counts = [0] * nbins
    gaps: list[list[int]] = [[] for _ in range(nbins)]
    ttft: list[tuple[float, int]] = []
    for r in requests:
        counts[min(nbins - 1, int(at(r.t_ingress_ns) // width))] += 1
        if r.t_first_token_ns is not None and r.ttft_ns is not None:  # one implies the other
            ttft.append((round(at(r.t_first_token_ns), 6), r.ttft_ns))
        for prev, t in zip(r.token_ns, r.token_ns[1:], strict=False):
            gaps[min(nbins - 1, int(at(t) // width))].append(t - prev)
    bins = tuple(
        Bin(t_s=i * width, requests=counts[i], itl_p50_ns=percentile(gaps[i], 50),
            itl_p99_ns=percentile(gaps[i], 99))
        for i in range(nbins)
    )
    waiting, running, kv = [], [], []
    for e in sorted(usdt, key=lambda e: e.ts_ns):
        if (queue := e.queue_depth) is not None:
            waiting.append((round(at(e.ts_ns), 6), queue[0]))
            running.append((round(at(e.ts_ns), 6), queue[1]))
        elif (used := e.kv_used) is not None:
            kv.append((round(at(e.ts_ns), 6), used))
    return TimeSeries(
        t0_ns=t0_ns, span_s=span_s, bin_s=width, ttft_points=tuple(sorted(ttft)), bins=bins,
        queue_waiting=tuple(waiting), queue_running=tuple(running), kv_occupancy=tuple(kv),
    )
