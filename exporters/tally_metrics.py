"""The kernel's connection tallies as Prometheus metrics (collector/model/connection_tallies.py).

These count every connection the host-wide targets accepted, whether the
agent followed it in full or not, so they stay exact when the CPU budget
samples: the request metrics beside them are of the followed sample
(inferprobe_connection_sample_ratio says how large). A custom collector,
since prometheus_client's Histogram cannot be set from bucket counts kept
elsewhere; the bucket edges are the kernel's log2 ones (2^k ns) from about
1 us to about 275 s, so each exported count is exact, not interpolated.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from inferprobe.collector.model.connection_tallies import ConnectionTallies, Log2Histogram

FIRST_BUCKET, LAST_BUCKET = 10, 38   # 2^10 ns = 1.024 us ... 2^38 ns = 274.9 s

HISTOGRAM_METRICS = {
    "turn": ("inferprobe_kernel_request_duration_seconds",
             "Every accepted connection, sampled or not (kernel tallies): from a request's first read to its "
             "response's last write; on HTTP/1.x one request, elsewhere one request/response turn."),
    "first_write": ("inferprobe_kernel_time_to_first_write_seconds",
                    "Every accepted connection (kernel tallies): from a request's first read to its "
                    "response's first write."),
    "write_gap": ("inferprobe_kernel_response_write_gap_seconds",
                  "Every accepted connection (kernel tallies): between consecutive writes of one response "
                  "(a streamed response's chunk gaps)."),
}


def histogram_buckets(histogram: Log2Histogram) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs at the kernel's own edges, then +Inf."""
    edges = range(FIRST_BUCKET, LAST_BUCKET + 1)
    out = [(repr((1 << k) / 1e9), float(histogram.cumulative(k))) for k in edges]
    out.append(("+Inf", float(histogram.count)))
    return out


class TallyCollector(Collector):
    def __init__(self, registry: CollectorRegistry):
        self.latest: ConnectionTallies | None = None
        registry.register(self)

    def set(self, tallies: ConnectionTallies) -> None:
        self.latest = tallies

    def collect(self) -> Iterator:
        tallies = self.latest
        if tallies is None:
            return
        counters = tallies.counters
        yield CounterMetricFamily("inferprobe_kernel_connections",
                                  "Connections the host-wide targets accepted, every one (kernel tallies).",
                                  value=counters["connections"])
        turns = CounterMetricFamily("inferprobe_kernel_requests",
                                    "Request/response turns on those connections (kernel tallies); "
                                    "answered=false: closed before any response write.", labels=["answered"])
        turns.add_metric(["true"], counters["turns"])
        turns.add_metric(["false"], counters["unanswered"])
        yield turns
        yield CounterMetricFamily("inferprobe_kernel_response_writes",
                                  "Response writes on those connections (kernel tallies).",
                                  value=counters["writes"])
        for key, (name, doc) in HISTOGRAM_METRICS.items():
            histogram = tallies.histograms[key]
            yield HistogramMetricFamily(name, doc, buckets=histogram_buckets(histogram),
                                        sum_value=histogram.sum_ns / 1e9)
