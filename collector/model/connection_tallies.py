"""The kernel's tallies of every connection the host-wide targets accept (bpf/host_wide.bpf.c).

Under the agent's CPU budget only a sample of connections is followed in
full; these are the exact totals and latency distributions of all of them,
sampled or not, kept in per-CPU arrays and read here as one snapshot. They
count turns (a request read, then the response writes until the next
request read or close), not parsed requests: on HTTP/1.x the two are the
same. Histograms are log2 of nanoseconds, as the kernel buckets them:
bucket k holds values in [2^(k-1), 2^k), bucket 0 the value 0.

Snapshots are cumulative since attach; `minus` gives a window's share
(`report --last` over the agent's ring).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

BUCKETS = 64
HISTOGRAMS = ("turn", "first_write", "write_gap")   # enum tally_histogram's order
COUNTERS = ("connections", "turns", "unanswered", "writes")   # enum tally_counter's order


@dataclass(frozen=True)
class Log2Histogram:
    counts: tuple[int, ...]   # BUCKETS entries
    sum_ns: int

    @property
    def count(self) -> int:
        return sum(self.counts)

    @staticmethod
    def upper_ns(bucket: int) -> int:
        """Every value in the bucket is below this."""
        return 1 << bucket

    def cumulative(self, up_to_bucket: int) -> int:
        """How many values are below upper_ns(up_to_bucket)."""
        return sum(self.counts[: up_to_bucket + 1])

    def quantile_bounds_ns(self, q: float) -> tuple[int, int] | None:
        """The bucket the q-quantile falls in, as [low, high) ns; None when empty."""
        total = self.count
        if not total:
            return None
        rank, seen = q * total, 0
        for bucket, n in enumerate(self.counts):
            seen += n
            if n and seen >= rank:
                return (0 if bucket == 0 else 1 << (bucket - 1)), 1 << bucket
        return None

    def minus(self, earlier: Log2Histogram) -> Log2Histogram:
        return Log2Histogram(tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True)),
                             self.sum_ns - earlier.sum_ns)

    def as_dict(self) -> dict:
        # Sparse: most of the 64 buckets are empty.
        return {"buckets": {str(k): n for k, n in enumerate(self.counts) if n}, "sum_ns": self.sum_ns}

    @classmethod
    def from_dict(cls, raw: dict) -> Log2Histogram:
        counts = [0] * BUCKETS
        for key, n in (raw.get("buckets") or {}).items():
            counts[int(key)] = int(n)
        return cls(tuple(counts), int(raw.get("sum_ns", 0)))


EMPTY = Log2Histogram((0,) * BUCKETS, 0)


@dataclass(frozen=True)
class ConnectionTallies:
    counters: dict[str, int]
    histograms: dict[str, Log2Histogram]

    def minus(self, earlier: ConnectionTallies) -> ConnectionTallies:
        return ConnectionTallies({k: v - earlier.counters.get(k, 0) for k, v in self.counters.items()},
                                 {k: h.minus(earlier.histograms.get(k, EMPTY))
                                  for k, h in self.histograms.items()})

    def as_dict(self) -> dict:
        return {**self.counters, "histograms": {k: h.as_dict() for k, h in self.histograms.items()}}

    @classmethod
    def from_dict(cls, raw: dict) -> ConnectionTallies:
        histograms = raw.get("histograms") or {}
        return cls({k: int(raw.get(k, 0)) for k in COUNTERS},
                   {k: Log2Histogram.from_dict(histograms.get(k) or {}) for k in HISTOGRAMS})


def _per_cpu_sums(table, n: int) -> list[int]:
    return [int(sum(table[ctypes.c_int(i)])) for i in range(n)]


def read_tallies(bpf) -> ConnectionTallies:
    """One snapshot of the kernel's tallies (each per-CPU slot summed over the CPUs)."""
    counters = _per_cpu_sums(bpf[b"tally_counters"], len(COUNTERS))
    buckets = _per_cpu_sums(bpf[b"tally_buckets"], len(HISTOGRAMS) * BUCKETS)
    sums = _per_cpu_sums(bpf[b"tally_sums_ns"], len(HISTOGRAMS))
    return ConnectionTallies(
        dict(zip(COUNTERS, counters, strict=True)),
        {name: Log2Histogram(tuple(buckets[i * BUCKETS:(i + 1) * BUCKETS]), sums[i])
         for i, name in enumerate(HISTOGRAMS)})


def summary_line(tallies: ConnectionTallies) -> str | None:
    """One sentence for a report or a log: totals and the median turn, None before any turn."""
    turns = tallies.counters.get("turns", 0)
    bounds = tallies.histograms["turn"].quantile_bounds_ns(0.5)
    if not turns or bounds is None:
        return None
    low, high = (b / 1e6 for b in bounds)
    return (f"all connections, counted in the kernel: {tallies.counters['connections']} connections, "
            f"{turns} answered request/response turns ({tallies.counters['unanswered']} unanswered), "
            f"the median turn {low:.3g}-{high:.3g} ms")
