"""Verdict findings of the locks, network and GPU analyzers.

Those analyzers compute their own results (analyzers/locks.py, network.py,
gpu.py); the report's sections (reports/sections/diagnostics.py) show the
same results, and these findings rank them in the verdict, so every output
tells one story from one set of numbers. A finding's share is always a
share of request time the analyzer measured directly; none is estimated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.gpu import GpuSummary
from inferprobe.analyzers.locks import LockAnalysis
from inferprobe.analyzers.network import ConnectionNetwork
from inferprobe.collector.model.timeline import Request

# The report's sections, the findings' evidence.
ANCHOR_LOCKS = "analyzer-locks"
ANCHOR_NETWORK = "analyzer-network"
ANCHOR_GPU = "analyzer-gpu"


@dataclass(frozen=True)
class LockWaitTotals:
    """The requests' lock waits against their spans, and those over the threshold."""

    spans: int  # requests with a span to weigh
    flagged: int  # of them, those whose mutex.wait.ratio is over the threshold
    span_ns: int
    wait_ns: int


def lock_wait_totals(analysis: LockAnalysis, requests: Sequence[Request]) -> LockWaitTotals:
    spans = [s for r in requests if (s := analysis.of(r)) is not None and s.span_ns > 0]
    return LockWaitTotals(len(spans), sum(1 for s in spans if s.ratio > analysis.threshold),
                          sum(s.span_ns for s in spans), sum(s.lock_wait_ns for s in spans))


def lock_finding(analysis: LockAnalysis, requests: Sequence[Request]) -> Finding | None:
    totals = lock_wait_totals(analysis, requests)
    if not totals.flagged or not totals.span_ns:
        return None
    top = analysis.locks[0] if analysis.locks else None
    where = (f"; the most contended lock is {top.pid}:{top.uaddr:#x} "
             f"({top.kind.value}, waiting in {' < '.join(top.waiter_frames[:2]) or 'unknown code'})"
             if top else "")
    return Finding(
        kind="locks.mutex_wait",
        share=min(1.0, totals.wait_ns / totals.span_ns),
        of="request time",
        sentence=(f"mutex.wait.ratio > {analysis.threshold:.2f} in "
                  f"{100 * totals.flagged / totals.spans:.0f} % of requests{where}"),
        recommendation=("shorten what is done under that lock (or split it) in the code shown as "
                        "its releaser; for GIL waits, move CPU work off the serving threads"),
        evidence=ANCHOR_LOCKS,
        source="locks",
    )


def network_findings(conns: Sequence[ConnectionNetwork], found: Sequence[Finding],
                     requests: Sequence[Request]) -> list[Finding]:
    """The network analyzer's per-connection findings, ranked by their share of that
    connection's streaming time."""
    streaming = {r.conn: r for r in requests if r.token_ns}
    findings = []
    for f in found:
        c = next(c for c in conns if c.conn_id == f.conn_id)
        delay = sum(w.delay_ns or 0 for w in c.matched)
        reqs = [r for r in requests if r.conn == c.conn_id and r.token_ns]
        stream_ns = sum(r.token_ns[-1] - r.token_ns[0] for r in reqs)
        if c.conn_id not in streaming or not stream_ns:
            continue
        ranked = f.ranked_as(f"network.{f.kind}", min(1.0, delay / stream_ns), "streaming time",
                             ANCHOR_NETWORK)
        findings.append(dataclasses.replace(ranked, sentence=f"connection {f.conn_id}: {f.sentence}"))
    return findings


def gpu_findings(summary: GpuSummary) -> list[Finding]:
    share = summary.step_wait_share
    return [f.ranked_as("gpu.sync_bound", min(1.0, share), "decode step time", ANCHOR_GPU,
                        recommendation="the CPU waits for the GPU: batch more requests per step or use a "
                                       "faster GPU")
            for f in summary.findings if f.kind == "sync_bound" and share is not None]
