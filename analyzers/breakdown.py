"""What the report draws from the phase decomposition: the TTFT split of the
requests at p50/p90/p99, the inter-token gaps at p50/p90/p99 split by ITL
phase (analyzers/itl_phases.py; USDT only) and a waterfall of the slowest
requests.

The phases themselves come from analyzers/decompose.py (`phases_ns`): the
server's USDT boundaries when it has probes, the socket boundaries
(response headers, first token, decode, finish) otherwise.

Pure functions over Request timelines; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from inferprobe.analyzers.decompose import PHASES, phases_ns
from inferprobe.analyzers.itl_phases import ITL_PHASES, gaps_at_percentiles
from inferprobe.analyzers.ttft_percentiles import DECOMPOSITION_PERCENTILES, requests_at_ttft_percentiles
from inferprobe.collector.model.timeline import Request

SOURCE_USDT = "usdt"
SOURCE_SOCKETS = "sockets"
SOURCE_ENGINE_IPC = "engine_ipc"  # read between the engine's processes (collector/ingest/engine_ipc_view.py)
# socket-only phase names (analyzers/decompose.py), in words for sentences
SOCKET_PHASE_WORDS = {
    "response_headers": "passes between reading the request and writing the response headers, "
                        "where the server queues and prefills",
    "first_token": "passes between the response headers and the first token, "
                   "where the server queues and prefills after answering",
}


def request_phases(r: Request) -> tuple[str, list[tuple[str, int]]] | None:
    """(source, [(phase, ns), ...]) in time order, or None if nothing to split."""
    phases = list(phases_ns(r).items())
    if not phases:
        return None
    if r.server is None:
        return SOURCE_SOCKETS, phases
    return (SOURCE_ENGINE_IPC if r.correlated_by == SOURCE_ENGINE_IPC else SOURCE_USDT), phases


def clip_phases(phases: Sequence[tuple[str, int]], limit_ns: int) -> list[tuple[str, int]]:
    """The phases that fill the first limit_ns (e.g. TTFT) of a request, cut at the limit."""
    out: list[tuple[str, int]] = []
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
    request: RequestRef  # the request at that percentile of TTFT (analyzers/ttft_percentiles.py)
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
class ItlBreakdown:
    """The one inter-token gap at a percentile of all split gaps (a real gap, not an average:
    its phases sum exactly to itl_ns and show what that tail gap was made of)."""

    label: str
    itl_ns: int
    phases: tuple[tuple[str, int], ...]  # ITL_PHASES order; sums to itl_ns

    def share(self, phase: str) -> float:
        return dict(self.phases).get(phase, 0) / self.itl_ns if self.itl_ns > 0 else 0.0


@dataclass(frozen=True)
class Breakdown:
    source: str | None  # SOURCE_USDT, SOURCE_SOCKETS, "mixed", or None when no request had phases
    phase_names: tuple[str, ...]  # in time order
    ttft: tuple[PercentileBreakdown, ...]
    waterfall: tuple[WaterfallRow, ...]  # slowest requests by TTFT, slowest first
    itl: tuple[ItlBreakdown, ...] = ()  # empty without USDT probes: ITL cannot be split


PERCENTILES = tuple((f"p{q}", q) for q in DECOMPOSITION_PERCENTILES)


def break_down(requests: Sequence[Request], at_ttft: Mapping[int, Request] | None = None,
               slowest: int = 10) -> Breakdown:
    """at_ttft: the request at each TTFT percentile, as the report model chose them
    (analyzers/ttft_percentiles.py; chosen here by the same rule when not given)."""
    if at_ttft is None:
        at_ttft = requests_at_ttft_percentiles(requests)
    split = []
    for r in requests:
        if r.ttft_ns is None:
            continue
        found = request_phases(r)
        if found is not None:
            split.append((r, found[0], found[1]))
    if not split:
        return Breakdown(source=None, phase_names=(), ttft=(), waterfall=())
    # a mixed recording (probes attached mid-run, uncorrelated requests) says so
    sources = {s for _, s, _ in split}
    source = sources.pop() if len(sources) == 1 else "mixed"
    seen = {name for _, _, phases in split for name, _ns in phases}
    names = [p for p in PHASES if p in seen]
    by_ttft = sorted(split, key=lambda x: (x[0].ttft_ns, x[0].conn, x[0].t_ingress_ns))
    # split, and so phases_of, holds only requests with a TTFT: the casts below say so
    phases_of = {id(r): phases for r, _, phases in split}
    breakdowns = []
    for label, q in PERCENTILES:
        chosen = at_ttft.get(q)
        if chosen is None or id(chosen) not in phases_of:
            continue
        ttft_ns = cast(int, chosen.ttft_ns)
        breakdowns.append(
            PercentileBreakdown(label=label, request=RequestRef.of(chosen), ttft_ns=ttft_ns,
                                phases=tuple(clip_phases(phases_of[id(chosen)], ttft_ns)))
        )
    rows = []
    for r, _, phases in reversed(by_ttft[-slowest:]):
        rows.append(
            WaterfallRow(
                request=RequestRef.of(r), ttft_ns=cast(int, r.ttft_ns), phases=tuple(phases),
                token_offsets_ns=tuple(t - r.t_ingress_ns for t in r.token_ns),
                outcome=r.outcome.value,
            )
        )
    return Breakdown(source=source, phase_names=tuple(names), ttft=tuple(breakdowns),
                     waterfall=tuple(rows), itl=itl_breakdown(requests))


def itl_breakdown(requests: Sequence[Request]) -> tuple[ItlBreakdown, ...]:
    at = gaps_at_percentiles(requests, [q for _, q in PERCENTILES])
    return tuple(ItlBreakdown(label=label, itl_ns=at[q][0],
                              phases=tuple((p, at[q][1][p]) for p in ITL_PHASES))
                 for label, q in PERCENTILES if q in at)
