"""Token cadence: TTFT, inter-token latency and end-to-end latency.

Pure functions over Request timelines; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from inferprobe.collector.model.timeline import Outcome, Request

# percentile returns one of its inputs, so nanosecond ints stay ints.
Observed = TypeVar("Observed", int, float)


def percentile(values: Sequence[Observed], q: float) -> Observed | None:
    """Nearest-rank percentile (q in 0..100): a value that was observed."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Distribution:
    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        vals = list(values)
        return cls(
            count=len(vals),
            p50=percentile(vals, 50),
            p90=percentile(vals, 90),
            p99=percentile(vals, 99),
            max=max(vals) if vals else None,
        )

    def as_dict(self) -> dict:
        return {"count": self.count, "p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max}


@dataclass(frozen=True)
class CadenceSummary:
    requests: int
    ttft_ns: Distribution
    itl_ns: Distribution
    e2e_ns: Distribution
    tokens_per_request: Distribution  # token-carrying writes (SSE chunks, NDJSON lines)
    outcomes: dict[str, int]
    errors: int  # status >= 400
    # Only where a count is known (the server's USDT or the stream's usage fields):
    tpot_ns: Distribution = Distribution.of(())  # time per output token after the first
    output_tokens: Distribution = Distribution.of(())


def summarize(requests: Sequence[Request]) -> CadenceSummary:
    ttft = [r.ttft_ns for r in requests if r.ttft_ns is not None]
    itl = [gap for r in requests for gap in r.itl_ns]
    e2e = [r.e2e_ns for r in requests if r.e2e_ns is not None]
    tokens = [len(r.token_ns) for r in requests if r.streaming]
    outcomes = {o.value: 0 for o in Outcome}
    for r in requests:
        outcomes[r.outcome.value] += 1
    return CadenceSummary(
        requests=len(requests),
        ttft_ns=Distribution.of(ttft),
        itl_ns=Distribution.of(itl),
        e2e_ns=Distribution.of(e2e),
        tokens_per_request=Distribution.of(tokens),
        outcomes=outcomes,
        errors=sum(1 for r in requests if r.is_error),
        tpot_ns=Distribution.of(t for r in requests if (t := r.tpot_ns) is not None),
        output_tokens=Distribution.of(n for r in requests if (n := r.output_token_count) is not None),
    )


def by_model(requests: Sequence[Request]) -> dict[str, list[Request]]:
    """Requests grouped by the "model" their body named (those that named one)."""
    groups: dict[str, list[Request]] = {}
    for r in requests:
        if r.model is not None:
            groups.setdefault(r.model, []).append(r)
    return dict(sorted(groups.items()))


def by_endpoint(requests: Sequence[Request]) -> dict[str, list[Request]]:
    groups: dict[str, list[Request]] = {}
    for r in requests:
        groups.setdefault(r.endpoint, []).append(r)
    return dict(sorted(groups.items()))
