"""The client view: the targets' outbound LLM API calls, per peer and the slow ones explained.

An application team asks "why did this call take 12 s?". The answer is in
the sum client_calls.ClientCall.explain() gives; this section shows it for
the calls worth reading (every retried call, then the slowest) and a table
per peer (TTFT, ITL, connect time, connection reuse, retry rate). A retried
call is a finding (analyzers/client_calls.py, retries_finding): its first
attempt is time the caller waited for nothing.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.cadence import percentile
from inferprobe.analyzers.client_calls import ANCHOR, ClientCall, slow_calls
from inferprobe.analyzers.units import duration, ms
from inferprobe.reports.sections.model import AnalyzerSection, Table, source_states


def _ms(values: list[int], q: int) -> str:
    return ms(percentile(values, q), 1)


def peer_rows(calls: list[ClientCall]) -> tuple[tuple[str, ...], ...]:
    by_peer: dict[str, list[ClientCall]] = defaultdict(list)
    for call in calls:
        by_peer[call.peer or "unknown"].append(call)
    rows = []
    for peer, group in sorted(by_peer.items()):
        attempts = [a for c in group for a in c.attempts]
        ttft = [a.request.ttft_ns for a in attempts if a.request.ttft_ns is not None]
        itl = [b - a for at in attempts for a, b in zip(at.request.token_ns, at.request.token_ns[1:],
                                                            strict=False)]
        connects = [a.t_connect_end_ns - a.t_connect_start_ns for a in attempts
                    if a.t_connect_start_ns is not None and a.t_connect_end_ns is not None]
        reused = sum(1 for a in attempts if a.reused)
        retried = sum(1 for c in group if len(c.attempts) > 1)
        rows.append((peer, str(len(group)), str(len(attempts)), f"{100 * retried / len(group):.0f} %",
                     f"{reused}/{len(attempts)}", _ms(connects, 50), _ms(ttft, 50), _ms(ttft, 99),
                     _ms(itl, 50), _ms([c.duration_ns for c in group], 50)))
    return tuple(rows)


def build(inp: AnalysisInput) -> AnalyzerSection | None:
    calls = list(inp.client_calls)
    if not calls:
        return None
    shown = slow_calls(calls)
    section = AnalyzerSection(
        anchor=ANCHOR,
        title="Outbound calls (client view)",
        summary=(f"{len(calls)} calls made by the targets, in {sum(len(c.attempts) for c in calls)} "
                 f"attempts; median call {duration(int(statistics.median(c.duration_ns for c in calls)))}."),
        sources=source_states(inp.recording.meta, ["sockets", "tls"]),
        tables=(
            Table(caption="Per peer (ms)",
                  columns=("peer", "calls", "attempts", "retried", "reused conns", "connect p50", "TTFT p50",
                           "TTFT p99", "ITL p50", "call p50"),
                  rows=peer_rows(calls)),
            Table(caption="Slow calls, as a sum of where their time went",
                  columns=("call", "peer", "attempts", "explanation"),
                  rows=tuple((str(c.id), c.peer or "unknown", str(len(c.attempts)), c.explain())
                             for c in shown)),
        ),
        notes=(
            "Client times are the kernel's: a request's first byte written, a response's bytes when a read "
            "returned them. A read may carry several token events (the application read slower than they "
            "came); TTFT and ITL are per read.",
            "Attempts are grouped by the SDKs' x-stainless-retry-count header where the request carries it, "
            "else by the same thread, method, path and peer right after a failed attempt.",
        ),
    )
    return section
