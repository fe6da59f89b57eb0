"""The client view: the targets' outbound LLM API calls, per peer and the slow ones explained.

An application team asks "why did this call take 12 s?". The answer is in
the sum client_calls.ClientCall.explain() gives; this section shows it for
the calls worth reading (every retried call, then the slowest), a table per
peer (TTFT, ITL, connect time, connection reuse, retry rate), and makes a
retried call a finding: its first attempt is time the caller waited for
nothing.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from inferprobe.analyzers.cadence import percentile
from inferprobe.analyzers.client_calls import TURNED_AWAY, ClientCall, slow_calls
from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.sections import AnalysisInput, AnalyzerResult, AnalyzerSection, Table, source_states
from inferprobe.analyzers.units import duration, ms

ANCHOR = "analyzer-client-calls"


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


def retry_advice(retried: list[ClientCall]) -> str:
    """Advice for what the failed attempts were: timed out waiting, or answered with a status."""
    failed = [a for c in retried for a in c.attempts[:-1]]
    timed_out = sum(1 for a in failed if a.timed_out)
    statuses: dict[int, int] = defaultdict(int)
    for a in failed:
        if a.request.status is not None and a.request.status >= 400:
            statuses[a.request.status] += 1
    advice = []
    if statuses:
        said = ", ".join(f"{n} answered {status}"
                         + (f" ({TURNED_AWAY[status]})" if status in TURNED_AWAY else "")
                         for status, n in sorted(statuses.items()))
        advice.append(f"The peer turned attempts away ({said}) and the SDK retried after its backoff: the "
                      "cure is on the peer's side (its rate limit or quota, its capacity, or spreading the "
                      "load), and the backoff is the SDK's (and the retry-after the peer sent).")
    if timed_out:
        advice.append(f"{timed_out} attempt(s) were closed by the client while waiting for the first byte: "
                      "the SDK's timeout. Compare it with the server's TTFT under load (a timeout below the "
                      "p99 TTFT retries the slowest requests), and check the peer's queue.")
    if not advice:
        advice.append("The failed attempts broke off mid-answer: look at the peer and the network.")
    return " ".join(advice)


def analyze(inp: AnalysisInput) -> AnalyzerResult | None:
    calls = list(inp.client_calls)
    if not calls:
        return None
    shown = slow_calls(calls)
    retried = [c for c in calls if len(c.attempts) > 1]
    findings = []
    if retried:
        lost = sum(c.attempts[-1].t_start_ns - c.t_start_ns for c in retried)
        total = sum(c.duration_ns for c in calls)
        worst = max(retried, key=lambda c: c.duration_ns)
        findings.append(Finding(
            kind="client.retries",
            sentence=(f"{len(retried)} of {len(calls)} outbound calls were retried: their failed attempts "
                      f"and backoff took {duration(lost)}, {100 * lost / total:.0f} % of all call time "
                      f"(worst: {worst.explain()})."),
            source="client_calls",
            recommendation=retry_advice(retried),
            share=min(1.0, lost / total) if total else None,
            of="outbound call time",
            evidence=ANCHOR,
            value=float(len(retried)),
        ))
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
    return AnalyzerResult(section=section, findings=tuple(findings))
