"""Report sections and verdict findings for the locks, network and GPU analyzers.

Those analyzers compute their own results (analyzers/locks.py, network.py,
gpu.py) for the JSON and terminal outputs; this module turns the same
results into AnalyzerSections for the HTML/Markdown report and into ranked
Findings for the verdict, so every output tells one story from one set of
numbers. A finding's share is always a share of request time the analyzer
measured directly; none is estimated.
"""

from __future__ import annotations

import dataclasses

from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.sections import (
    AnalysisInput,
    AnalyzerResult,
    AnalyzerSection,
    Table,
    probe_set_present,
    source_states,
)
from inferprobe.analyzers.units import ms_text

ANCHOR_LOCKS = "analyzer-locks"
ANCHOR_NETWORK = "analyzer-network"
ANCHOR_GPU = "analyzer-gpu"


# -- locks -----------------------------------------------------------------------


def locks(inp: AnalysisInput) -> AnalyzerResult | None:
    meta, analysis = inp.recording.meta, inp.locks
    if not probe_set_present(meta, "locks") or analysis is None:
        return None
    all_spans = [(r, analysis.of(r)) for r in inp.requests]
    spans = [(r, s) for r, s in all_spans if s is not None and s.span_ns > 0]
    flagged = [r for r, s in spans if s.ratio > analysis.threshold]
    total_span = sum(s.span_ns for _, s in spans)
    total_wait = sum(s.lock_wait_ns for _, s in spans)
    rows = tuple(
        (f"{lk.pid}:{lk.uaddr:#x}", lk.kind.value, str(lk.waits), ms_text(lk.total_wait_ns),
         ms_text(lk.p99_wait_ns),
         " < ".join(lk.waiter_frames[:3]) or "-", " < ".join(lk.waker_frames[:3]) or "-")
        for lk in analysis.locks[:10]
    )
    section = AnalyzerSection(
        anchor=ANCHOR_LOCKS,
        title="Lock contention",
        summary=(f"mutex.wait.ratio above {analysis.threshold:.2f} in {len(flagged)} of {len(spans)} "
                 f"requests; serving threads spent {ms_text(total_wait)} of {ms_text(total_span)} request "
                 "time acquiring locks or the GIL (waits for work on a condition variable are handoff, "
                 "not contention)."),
        sources=source_states(meta, ["locks"]),
        tables=(Table(caption="Most contended locks", columns=(
            "lock", "kind", "waits", "total", "p99", "waiting code", "released by"), rows=rows),)
        if rows else (),
        notes=("Stacks: frame pointers where the code has them, else return addresses found by "
               "scanning the waiting thread's stack (docs/locks.md).",),
    )
    findings = []
    if flagged and total_span:
        top = analysis.locks[0] if analysis.locks else None
        where = (f"; the most contended lock is {top.pid}:{top.uaddr:#x} "
                 f"({top.kind.value}, waiting in {' < '.join(top.waiter_frames[:2]) or 'unknown code'})"
                 if top else "")
        findings.append(Finding(
            kind="locks.mutex_wait",
            share=min(1.0, total_wait / total_span),
            of="request time",
            sentence=(f"mutex.wait.ratio > {analysis.threshold:.2f} in "
                      f"{100 * len(flagged) / len(spans):.0f} % of requests{where}"),
            recommendation=("shorten what is done under that lock (or split it) in the code shown as "
                            "its releaser; for GIL waits, move CPU work off the serving threads"),
            evidence=ANCHOR_LOCKS,
            source="locks",
        ))
    return AnalyzerResult(section=section, findings=tuple(findings))


# -- network ---------------------------------------------------------------------


def network(inp: AnalysisInput) -> AnalyzerResult | None:
    meta, conns, found = inp.recording.meta, inp.network, inp.network_findings
    if not probe_set_present(meta, "network") or conns is None:
        return None
    rows = []
    for c in conns:
        d = c.write_to_wire()
        rows.append((str(c.conn_id), "?" if c.nodelay is None else ("on" if c.nodelay else "off"),
                     str(len(c.writes)), str(c.coalesced_writes), ms_text(d.p50), ms_text(d.p99)))
    section = AnalyzerSection(
        anchor=ANCHOR_NETWORK,
        title="Network: write to wire",
        summary=("Per connection, the delay from each write() of the server to the moment its last "
                 "byte left the host, and writes that shared a segment (coalesced)."),
        sources=source_states(meta, ["network"]),
        tables=(Table(caption="Connections", columns=(
            "conn", "TCP_NODELAY", "writes", "coalesced", "write->wire p50", "write->wire p99"),
            rows=tuple(rows)),) if rows else (),
        notes=tuple(f"{f.kind} on connection {f.conn_id}: {f.sentence}; fix: {f.recommendation}"
                    for f in found),
    )
    streaming = {r.conn: r for r in inp.requests if r.token_ns}
    findings = []
    for f in found:
        c = next(c for c in conns if c.conn_id == f.conn_id)
        delay = sum(w.delay_ns or 0 for w in c.matched)
        reqs = [r for r in inp.requests if r.conn == c.conn_id and r.token_ns]
        stream_ns = sum(r.token_ns[-1] - r.token_ns[0] for r in reqs)
        if c.conn_id not in streaming or not stream_ns:
            continue
        ranked = f.ranked_as(f"network.{f.kind}", min(1.0, delay / stream_ns), "streaming time",
                             ANCHOR_NETWORK)
        findings.append(dataclasses.replace(ranked, sentence=f"connection {f.conn_id}: {f.sentence}"))
    return AnalyzerResult(section=section, findings=tuple(findings))


# -- GPU -------------------------------------------------------------------------


def gpu(inp: AnalysisInput) -> AnalyzerResult | None:
    meta, summary = inp.recording.meta, inp.gpu
    if not probe_set_present(meta, "gpu") or summary is None:
        return None
    rows = tuple((name, str(f.calls), ms_text(f.total_ns), ms_text(f.p99_ns)) for name, f in
                 sorted(summary.functions.items(), key=lambda kv: -(kv[1].total_ns or 0))[:12])
    section = AnalyzerSection(
        anchor=ANCHOR_GPU,
        title="GPU (CUDA)",
        summary="CUDA launches, synchronisation waits, copies and allocations of the server's threads.",
        sources=source_states(meta, ["gpu"]),
        tables=(Table(caption="CUDA calls", columns=("function", "calls", "total", "p99"), rows=rows),)
        if rows else (),
        notes=tuple(f.sentence for f in summary.findings),
    )
    findings = []
    share = summary.step_wait_share
    for f in summary.findings:
        if f.kind == "sync_bound" and share is not None:
            findings.append(f.ranked_as("gpu.sync_bound", min(1.0, share), "decode step time", ANCHOR_GPU,
                                        recommendation="the CPU waits for the GPU: batch more requests "
                                                       "per step or use a faster GPU"))
    return AnalyzerResult(section=section, findings=tuple(findings))
