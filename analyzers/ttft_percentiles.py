"""The request at each TTFT percentile (p50, p90, p99): the rows of the
latency decomposition in every output, chosen once and by one rule.

Nearest rank, like every percentile here; among requests with that same
TTFT, the one read first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferprobe.analyzers.cadence import percentile
from inferprobe.analyzers.decompose import ttft_phases_ns
from inferprobe.collector.model.timeline import Request

DECOMPOSITION_PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class AtTtftPercentile:
    request: Request
    ttft_phases_ns: dict[str, int]  # analyzers/decompose.py's phases before the first token


def requests_at_ttft_percentiles(requests: Sequence[Request]) -> dict[int, Request]:
    """Percentile -> the request whose TTFT is the one at that percentile; requests in ingress order."""
    with_ttft = sorted(((r.ttft_ns, r) for r in requests if r.ttft_ns is not None), key=lambda tr: tr[0])
    if not with_ttft:
        return {}
    out = {}
    for q in DECOMPOSITION_PERCENTILES:
        target = percentile([ttft for ttft, _ in with_ttft], q)
        out[q] = next(r for ttft, r in with_ttft if ttft == target)
    return out


def decomposition(at: dict[int, Request]) -> dict[int, AtTtftPercentile]:
    return {q: AtTtftPercentile(r, ttft_phases_ns(r)) for q, r in at.items()}
