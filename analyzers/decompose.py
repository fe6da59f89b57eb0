"""Latency decomposition: where each request's time went, phase by phase.

Phases come from `Request.phases_ns` (phase -> ns, contiguous from ingress to
end, in order) when the server's USDT probes provided them. Without those the
socket view still splits a request at the moments the kernel saw: the request
read, the response's status line, the first token chunk and the end. Those
three socket phases are coarse (queueing and prefill both hide in the first)
and the report says so.

Pure functions over Request timelines; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from inferprobe.collector.timeline import Request

SOCKET_BEFORE_RESPONSE = "request read → response headers"
SOCKET_HEADERS_TO_TOKEN = "response headers → first token"
SOCKET_STREAMING = "first token → end"
SOCKET_PHASES = (SOCKET_BEFORE_RESPONSE, SOCKET_HEADERS_TO_TOKEN, SOCKET_STREAMING)

SOURCE_USDT = "usdt"
SOURCE_SOCKETS = "sockets"


def socket_phases(r: Request) -> list[tuple[str, int]] | None:
    """The split the kernel's socket view gives: read, status line, first token, end."""
    if r.t_response_start_ns is None:
        return None
    phases = [(SOCKET_BEFORE_RESPONSE, r.t_response_start_ns - r.t_ingress_ns)]
    first = r.t_first_token_ns
    if first is not None:
        phases.append((SOCKET_HEADERS_TO_TOKEN, first - r.t_response_start_ns))
        end = r.t_end_ns if r.t_end_ns is not None else r.token_ns[-1]
        if end > first:
            phases.append((SOCKET_STREAMING, end - first))
    return [(name, max(0, ns)) for name, ns in phases]


def request_phases(r: Request) -> tuple[str, list[tuple[str, int]]] | None:
    """(source, [(phase, ns), ...]) in time order, or None if nothing to split."""
    probed = getattr(r, "phases_ns", None)
    if probed:
        return SOURCE_USDT, [(name, int(ns)) for name, ns in probed.items()]
    phases = socket_phases(r)
    return None if phases is None else (SOURCE_SOCKETS, phases)


def clip_phases(phases: Sequence[tuple[str, int]], limit_ns: int) -> list[tuple[str, int]]:
    """The phases that fill the first limit_ns (e.g. TTFT) of a request, cut at the limit."""
    out = []
    used = 0
    for name, ns in phases:
        if used >= limit_ns and out:
            break
        take = min(ns, max(0, limit_ns - used))
        out.append((name, take))
        used += ns
    return out


@dataclass(frozen=True)
class RequestRef:
    """Enough to find a request again in the JSON report or the recording."""

    conn: int
    t_ingress_ns: int
    endpoint: str

    @classmethod
    def of(cls, r: Request) -> RequestRef:
        return cls(conn=r.conn, t_ingress_ns=r.t_ingress_ns, endpoint=r.endpoint)


@dataclass(frozen=True)
class PercentileBreakdown:
    label: str  # "p50", "p90", "p99"
    request: RequestRef  # the request at that nearest-rank percentile of TTFT
    ttft_ns: int
    phases: tuple[tuple[str, int], ...]  # clipped to TTFT; sums to ttft_ns

    def share(self, phase: str) -> float:
        ns = dict(self.phases).get(phase, 0)
        return ns / self.ttft_ns if self.ttft_ns > 0 else 0.0

    def dominant(self) -> tuple[str, int]:
        return max(self.phases, key=lambda p: (p[1], p[0]))


@dataclass(frozen=True)
class WaterfallRow:
    request: RequestRef
    ttft_ns: int
    phases: tuple[tuple[str, int], ...]  # the whole request, ingress to end
    token_offsets_ns: tuple[int, ...]  # each token chunk, relative to ingress
    outcome: str


@dataclass(frozen=True)
class Decomposition:
    source: str | None  # SOURCE_USDT, SOURCE_SOCKETS, or None when no request had phases
    phase_names: tuple[str, ...]  # in time order
    ttft: tuple[PercentileBreakdown, ...]
    waterfall: tuple[WaterfallRow, ...]  # slowest requests by TTFT, slowest first


PERCENTILES = (("p50", 50), ("p90", 90), ("p99", 99))


def decompose(requests: Sequence[Request], slowest: int = 10) -> Decomposition:
    split = []
    for r in requests:
        if r.ttft_ns is None:
            continue
        found = request_phases(r)
        if found is not None:
            split.append((r, found[0], found[1]))
    if not split:
        return Decomposition(source=None, phase_names=(), ttft=(), waterfall=())
    # one source for the whole report: USDT phases where every request has them
    source = SOURCE_USDT if all(s == SOURCE_USDT for _, s, _ in split) else SOURCE_SOCKETS
    if source == SOURCE_SOCKETS:
        # a mixed recording (probes attached mid-run): compare like with like
        split = [(r, SOURCE_SOCKETS, p) for r, _, _ in split if (p := socket_phases(r))]
        if not split:
            return Decomposition(source=None, phase_names=(), ttft=(), waterfall=())
    names: list[str] = []
    for _, _, phases in split:
        for name, _ns in phases:
            if name not in names:
                names.append(name)
    by_ttft = sorted(split, key=lambda x: (x[0].ttft_ns, x[0].conn, x[0].t_ingress_ns))
    breakdowns = []
    for label, q in PERCENTILES:
        rank = max(1, math.ceil(q / 100 * len(by_ttft)))
        r, _, phases = by_ttft[rank - 1]
        breakdowns.append(
            PercentileBreakdown(label=label, request=RequestRef.of(r), ttft_ns=r.ttft_ns,
                                phases=tuple(clip_phases(phases, r.ttft_ns)))
        )
    rows = []
    for r, _, phases in reversed(by_ttft[-slowest:]):
        rows.append(
            WaterfallRow(
                request=RequestRef.of(r), ttft_ns=r.ttft_ns, phases=tuple(phases),
                token_offsets_ns=tuple(t - r.t_ingress_ns for t in r.token_ns),
                outcome=r.outcome.value,
            )
        )
    return Decomposition(source=source, phase_names=tuple(names), ttft=tuple(breakdowns),
                         waterfall=tuple(rows))
