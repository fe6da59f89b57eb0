"""The engine's own Prometheus metrics, mapped onto the design card's gauges.

`record --engine-metrics` stores every scrape as parsed (collector/
engine_scrape.py); this module decides what the names mean, so a mapping
added later applies to old recordings. The names are those the engines
document (docs/engines.md has the table and where each comes from):

  scheduler_queue_length   vllm:num_requests_waiting, sglang:num_queue_reqs,
                           llamacpp:requests_deferred, tgi_queue_size
  running requests         vllm:num_requests_running, sglang:num_running_reqs,
                           llamacpp:requests_processing, tgi_batch_current_size
  token_occupancy_ratio    vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc
                           before it), sglang:token_usage
  TTFT histogram           vllm:time_to_first_token_seconds,
                           sglang:time_to_first_token_seconds
  per-request phases       vllm:request_{queue,prefill,decode}_time_seconds,
                           tgi_request_{queue,inference}_duration

batch_stall_duration_seconds has no counterpart in any of them (no engine
publishes the gap between two steps): stalls come from USDT or engine uprobes.

An engine can publish one series per model or per engine replica (labels):
counts are summed over them, occupancy takes the highest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

QUEUE = "scheduler_queue_length"
RUNNING = "running_requests"
OCCUPANCY = "token_occupancy_ratio"
GAUGES = (QUEUE, RUNNING, OCCUPANCY)

# sample name -> (engine, gauge)
ENGINE_GAUGES: dict[str, tuple[str, str]] = {
    "vllm:num_requests_waiting": ("vllm", QUEUE),
    "vllm:num_requests_running": ("vllm", RUNNING),
    "vllm:kv_cache_usage_perc": ("vllm", OCCUPANCY),
    "vllm:gpu_cache_usage_perc": ("vllm", OCCUPANCY),
    "sglang:num_queue_reqs": ("sglang", QUEUE),
    "sglang:num_running_reqs": ("sglang", RUNNING),
    "sglang:token_usage": ("sglang", OCCUPANCY),
    "llamacpp:requests_deferred": ("llamacpp", QUEUE),
    "llamacpp:requests_processing": ("llamacpp", RUNNING),
    "tgi_queue_size": ("tgi", QUEUE),
    "tgi_batch_current_size": ("tgi", RUNNING),
}
# histogram family -> engine: the engine's own time to first token
ENGINE_TTFT: dict[str, str] = {
    "vllm:time_to_first_token_seconds": "vllm",
    "sglang:time_to_first_token_seconds": "sglang",
}
# histogram family -> (engine, phase): the engine's own time per request in each phase
# of its TTFT and after, observed as each request ends (vLLM V1's request-level
# histograms; TGI's queue and inference durations). SGLang and llama.cpp publish none.
QUEUE_PHASE, PREFILL_PHASE, DECODE_PHASE, INFERENCE_PHASE = "queue", "prefill", "decode", "inference"
ENGINE_PHASES: dict[str, tuple[str, str]] = {
    "vllm:request_queue_time_seconds": ("vllm", QUEUE_PHASE),
    "vllm:request_prefill_time_seconds": ("vllm", PREFILL_PHASE),
    "vllm:request_decode_time_seconds": ("vllm", DECODE_PHASE),
    "tgi_request_queue_duration": ("tgi", QUEUE_PHASE),
    "tgi_request_inference_duration": ("tgi", INFERENCE_PHASE),
}
ENGINE_PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llamacpp", "tgi_": "tgi"}


@dataclass(frozen=True)
class GaugeSeries:
    gauge: str  # one of GAUGES
    metric: str  # the engine's name it was read from
    points: tuple[tuple[int, float], ...]  # (t_ns, value) per scrape

    @property
    def peak(self) -> float:
        return max(v for _, v in self.points)

    @property
    def last(self) -> float:
        return self.points[-1][1]


@dataclass(frozen=True)
class HistogramDelta:
    """A cumulative histogram's growth between the first and the last scrape:
    the observations made while recording."""

    metric: str
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), +Inf last
    count: float
    sum: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile_bounds(self, q: float) -> tuple[float, float] | None:
        """The bucket [lower, upper] holding the q-quantile; None without observations."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower = 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                return lower, upper
            lower = upper
        return None

    def quantile(self, q: float) -> float | None:
        """Linear within its bucket, as Prometheus' histogram_quantile()."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(upper):
                    return lower
                width = cumulative - below
                return lower + (upper - lower) * ((rank - below) / width if width else 1.0)
            lower, below = upper, cumulative
        return None


@dataclass
class EngineMetricsSummary:
    url: str
    engine: str | None  # "vllm", "sglang", "llamacpp", "tgi"; None when no known name was seen
    scrapes: int
    t_first_ns: int
    t_last_ns: int
    series: dict[str, GaugeSeries] = field(default_factory=dict)  # gauge -> series
    ttft: HistogramDelta | None = None
    phases: dict[str, HistogramDelta] = field(default_factory=dict)  # ENGINE_PHASES' phase -> its growth
    scraper_ports: frozenset[int] = frozenset()  # our own connections to the engine
    scrape_times_ns: tuple[int, ...] = ()  # when each scrape was answered (midpoints)
    stats: dict = field(default_factory=dict)  # the scraper's counters at the stop

    @property
    def path(self) -> str:
        """The scraped path, as the server's request line names it."""
        rest = self.url.split("://", 1)[-1]
        return "/" + rest.split("/", 1)[1] if "/" in rest else "/"

    def peak(self, gauge: str) -> float | None:
        s = self.series.get(gauge)
        return None if s is None else s.peak


def _engine_of(names: Sequence[str]) -> str | None:
    for name in names:
        for prefix, engine in ENGINE_PREFIXES.items():
            if name.startswith(prefix):
                return engine
    return None


def gauge_values(samples: Sequence[Sequence]) -> dict[str, tuple[str, float]]:
    """One scrape's samples -> gauge -> (engine metric name, value)."""
    found: dict[str, tuple[str, list[float]]] = {}
    for name, _labels, value in samples:
        mapped = ENGINE_GAUGES.get(name)
        if mapped is None or math.isnan(value):
            continue
        gauge = mapped[1]
        if gauge in found and found[gauge][0] != name:
            continue  # an engine that publishes both the old and the new name: the first wins
        found.setdefault(gauge, (name, []))[1].append(value)
    return {g: (name, max(vals) if g == OCCUPANCY else sum(vals)) for g, (name, vals) in found.items()}


def _histogram(samples: Sequence[Sequence], family: str) -> tuple[dict[float, float], float, float] | None:
    buckets: dict[float, float] = {}
    count = total = 0.0
    seen = False
    for name, labels, value in samples:
        if name == f"{family}_bucket":
            le = float(labels.get("le", "nan"))
            if not math.isnan(le):
                buckets[le] = buckets.get(le, 0.0) + value  # summed over models/replicas
                seen = True
        elif name == f"{family}_count":
            count += value
        elif name == f"{family}_sum":
            total += value
    return (buckets, count, total) if seen else None


def histogram_delta(first: Sequence[Sequence], last: Sequence[Sequence],
                    family: str) -> HistogramDelta | None:
    """A histogram family's growth over the recording (last scrape - first); None if not published."""
    end = _histogram(last, family)
    if end is None:
        return None
    start = _histogram(first, family) or ({}, 0.0, 0.0)
    buckets = tuple((le, end[0][le] - start[0].get(le, 0.0)) for le in sorted(end[0]))
    return HistogramDelta(family, buckets, end[1] - start[1], end[2] - start[2])


def ttft_delta(first: Sequence[Sequence], last: Sequence[Sequence]) -> HistogramDelta | None:
    """The engine's TTFT histogram over the recording (last scrape - first)."""
    for family in ENGINE_TTFT:
        if (delta := histogram_delta(first, last, family)) is not None:
            return delta
    return None


def phase_deltas(first: Sequence[Sequence], last: Sequence[Sequence]) -> dict[str, HistogramDelta]:
    """The engine's own per-request phase histograms that grew while recording, by phase."""
    out = {}
    for family, (_engine, phase) in ENGINE_PHASES.items():
        delta = histogram_delta(first, last, family)
        if delta is not None and delta.count > 0 and phase not in out:
            out[phase] = delta
    return out


def summarize(scrapes: Sequence[dict], final_stats: dict | None = None) -> EngineMetricsSummary | None:
    """None when the recording holds no scrape."""
    good = sorted((s for s in scrapes if s.get("samples") is not None), key=lambda s: s["t_ns"])
    if not good:
        return None
    points: dict[str, tuple[str, list[tuple[int, float]]]] = {}
    ports: set[int] = set()
    names: list[str] = []
    for scrape in good:
        ports.update(scrape.get("local_ports") or ())
        for gauge, (metric, value) in gauge_values(scrape["samples"]).items():
            points.setdefault(gauge, (metric, []))[1].append((scrape["t_ns"], value))
            names.append(metric)
    if not names:
        names = [s[0] for s in good[-1]["samples"]]
    return EngineMetricsSummary(
        url=good[0].get("url", "?"), engine=_engine_of(names), scrapes=len(good),
        t_first_ns=good[0]["t_ns"], t_last_ns=good[-1]["t_ns"],
        series={g: GaugeSeries(g, metric, tuple(pts)) for g, (metric, pts) in points.items()},
        ttft=ttft_delta(good[0]["samples"], good[-1]["samples"]) if len(good) > 1 else None,
        phases=phase_deltas(good[0]["samples"], good[-1]["samples"]) if len(good) > 1 else {},
        scraper_ports=frozenset(ports), scrape_times_ns=tuple(s["t_ns"] for s in good),
        stats=dict(final_stats or {}))
