"""The inference engine's scheduler, from its USDT probes.

The design card's three gauges:
  scheduler_queue_length         requests waiting for a batch slot (queue_depth probe)
  token_occupancy_ratio          KV cache used / capacity (kv_usage probe)
  batch_stall_duration_seconds   gaps between two consecutive decode steps of
                                 an engine that had at least one request in
                                 both: time running requests sat waiting for
                                 the next step (prefill of new arrivals,
                                 scheduling work, lock waits)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from inferprobe.analyzers.cadence import Distribution
from inferprobe.collector.ingest.server_view import ServerView
from inferprobe.collector.model.timeline import DecodeStep

MAX_SERIES_POINTS = 500
# A gauge's values: downsampling keeps them as they were, counts stay ints.
Level = TypeVar("Level", int, float)


@dataclass
class Stall:
    pid: int
    t_start_ns: int  # end of the step before
    t_end_ns: int  # start of the step after
    requests: frozenset[int]  # in both steps

    @property
    def duration_ns(self) -> int:
        return self.t_end_ns - self.t_start_ns


@dataclass
class SchedulerSummary:
    queue_length: list[tuple[int, int]] = field(default_factory=list)  # (t_ns, waiting), downsampled
    queue_length_max: int | None = None
    occupancy: list[tuple[int, float]] = field(default_factory=list)  # (t_ns, used/capacity)
    occupancy_max: float | None = None
    stalls: list[Stall] = field(default_factory=list)
    stall_ns: Distribution = field(default_factory=lambda: Distribution.of([]))
    steps: int = 0
    batch_size: Distribution = field(default_factory=lambda: Distribution.of([]))


def downsample_max(
    points: Sequence[tuple[int, Level]], limit: int = MAX_SERIES_POINTS
) -> list[tuple[int, Level]]:
    """At most `limit` points, keeping each time bucket's highest value: for
    a gauge that can raise an alarm, the peak is what must survive."""
    if len(points) <= limit:
        return list(points)
    t0, t1 = points[0][0], points[-1][0]
    width = max(1, (t1 - t0) // limit + 1)
    buckets: dict[int, tuple[int, Level]] = {}
    for t, v in points:
        b = (t - t0) // width
        if b not in buckets or v > buckets[b][1]:
            buckets[b] = (t, v)
    return [buckets[b] for b in sorted(buckets)]


def stall_between(before: DecodeStep, after: DecodeStep) -> Stall | None:
    """The one stall rule, for a recording (find_stalls) and live (exporters/metrics.py): the
    engine sat idle between two consecutive steps of a process that share a request, from the
    end of the first to the start of the second. A gap between steps of different requests
    is a batch draining and refilling, not a stall."""
    shared = before.requests & after.requests
    if shared and before.t_end_ns is not None and after.t_start_ns > before.t_end_ns:
        return Stall(after.pid, before.t_end_ns, after.t_start_ns, frozenset(shared))
    return None


def find_stalls(steps: list[DecodeStep]) -> list[Stall]:
    by_pid: dict[int, list[DecodeStep]] = {}
    for step in steps:
        if step.t_end_ns is not None:
            by_pid.setdefault(step.pid, []).append(step)
    stalls = []
    for ordered in by_pid.values():
        ordered.sort(key=lambda s: s.t_start_ns)
        for before, after in zip(ordered, ordered[1:], strict=False):
            if (stall := stall_between(before, after)) is not None:
                stalls.append(stall)
    return stalls


def stall_ns_by_request(stalls: list[Stall]) -> dict[tuple[int, int], int]:
    """(pid, req_id) -> total time that request sat in a stalled batch."""
    totals: dict[tuple[int, int], int] = {}
    for stall in stalls:
        for req_id in stall.requests:
            key = (stall.pid, req_id)
            totals[key] = totals.get(key, 0) + stall.duration_ns
    return totals


def summarize_scheduler(view: ServerView) -> SchedulerSummary:
    out = SchedulerSummary()
    if view.queue_depth:
        out.queue_length = downsample_max([(t, waiting) for t, waiting, _ in view.queue_depth])
        out.queue_length_max = max(waiting for _, waiting, _ in view.queue_depth)
    if view.kv_usage:
        out.occupancy = downsample_max(view.kv_usage)
        out.occupancy_max = max(share for _, share in view.kv_usage)
    out.stalls = find_stalls(view.steps)
    out.stall_ns = Distribution.of(s.duration_ns for s in out.stalls)
    out.steps = len(view.steps)
    out.batch_size = Distribution.of(s.batch_size for s in view.steps)
    return out
