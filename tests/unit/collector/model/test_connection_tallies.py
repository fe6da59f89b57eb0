"""Snapshots of the kernel's connection tallies: log2 buckets, windows, the report line, Prometheus."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from inferprobe.collector.model.connection_tallies import (
    BUCKETS,
    ConnectionTallies,
    Log2Histogram,
    summary_line,
)
from inferprobe.exporters.tally_metrics import TallyCollector, histogram_buckets


def _histogram(values_ns: list[int]) -> Log2Histogram:
    """As bpf_log2l buckets them: v -> floor(log2 v) + 1, 0 -> 1 (bcc's helper), capped at 63."""
    counts = [0] * BUCKETS
    for v in values_ns:
        counts[min(BUCKETS - 1, v.bit_length() if v else 1)] += 1
    return Log2Histogram(tuple(counts), sum(values_ns))


def _tallies(turn_ns: list[int], gaps_ns: list[int] = ()) -> ConnectionTallies:
    return ConnectionTallies({"connections": len(turn_ns), "turns": len(turn_ns), "unanswered": 1,
                              "writes": len(turn_ns) + len(gaps_ns)},
                             {"turn": _histogram(turn_ns), "first_write": _histogram([1000] * len(turn_ns)),
                              "write_gap": _histogram(list(gaps_ns))})


def test_each_value_is_below_its_buckets_upper_edge_and_not_below_the_lower():
    for v in (1, 2, 3, 1023, 1024, 25_000_000, 3_000_000_000):
        h = _histogram([v])
        bucket = h.counts.index(1)
        assert Log2Histogram.upper_ns(bucket) > v >= Log2Histogram.upper_ns(bucket) // 2


def test_quantile_bounds_hold_the_true_quantile():
    values = [100_000 * (i + 1) for i in range(100)]   # 0.1 .. 10 ms
    low, high = _histogram(values).quantile_bounds_ns(0.5)
    assert low <= sorted(values)[49] < high
    assert _histogram([]).quantile_bounds_ns(0.5) is None


def test_a_window_is_the_difference_and_survives_json():
    earlier, later = _tallies([2_000_000] * 3), _tallies([2_000_000] * 3 + [40_000_000] * 2, [25_000_000])
    window = later.minus(earlier)
    assert window.counters["turns"] == 2 and window.histograms["turn"].count == 2
    assert window.histograms["turn"].sum_ns == 80_000_000
    assert ConnectionTallies.from_dict(window.as_dict()) == window


def test_the_report_line_names_the_median_turns_bucket():
    line = summary_line(_tallies([30_000_000] * 9 + [900_000_000]))
    assert "10 connections" in line and "10 answered" in line and "1 unanswered" in line
    assert "16.8-33.6 ms" in line   # 30 ms lies in [2^24, 2^25) ns
    assert summary_line(_tallies([])) is None


def test_prometheus_buckets_are_cumulative_at_the_kernels_edges():
    tallies = _tallies([500, 3_000_000, 3_000_000, 70_000_000_000_000])   # one below 1 us, one above 275 s
    buckets = histogram_buckets(tallies.histograms["turn"])
    counts = [n for _, n in buckets]
    assert counts == sorted(counts) and buckets[-1] == ("+Inf", 4.0)
    assert buckets[0] == (repr(1024 / 1e9), 1.0)          # the 500 ns turn
    assert dict(buckets)[repr((1 << 22) / 1e9)] == 3.0     # 3 ms < 2^22 ns = 4.19 ms
    assert buckets[-2][1] == 3.0                           # the 70 000 s one only in +Inf
    registry = CollectorRegistry()
    collector = TallyCollector(registry)
    assert b"inferprobe_kernel" not in generate_latest(registry)   # nothing before the first snapshot
    collector.set(tallies)
    text = generate_latest(registry).decode()
    assert 'inferprobe_kernel_requests_total{answered="true"} 4.0' in text
    assert 'inferprobe_kernel_requests_total{answered="false"} 1.0' in text
    assert "inferprobe_kernel_request_duration_seconds_count 4.0" in text
    assert "inferprobe_kernel_connections_total 4.0" in text
