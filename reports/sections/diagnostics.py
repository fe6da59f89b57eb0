"""Report sections of the locks, network and GPU analyzers.

Those analyzers compute their own results (analyzers/locks.py, network.py,
gpu.py) for the JSON and terminal outputs; this module shows the same
results as AnalyzerSections for the HTML/Markdown report (their verdict
findings are analyzers/diagnostic_findings.py's).
"""

from __future__ import annotations

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.diagnostic_findings import (
    ANCHOR_GPU,
    ANCHOR_LOCKS,
    ANCHOR_NETWORK,
    lock_wait_totals,
)
from inferprobe.analyzers.units import ms_text
from inferprobe.reports.sections.model import AnalyzerSection, Table, probe_set_present, source_states

# -- locks -----------------------------------------------------------------------


def locks(inp: AnalysisInput) -> AnalyzerSection | None:
    meta, analysis = inp.recording.meta, inp.locks
    if not probe_set_present(meta, "locks") or analysis is None:
        return None
    totals = lock_wait_totals(analysis, inp.requests)
    rows = tuple(
        (f"{lk.pid}:{lk.uaddr:#x}", lk.kind.value, str(lk.waits), ms_text(lk.total_wait_ns),
         ms_text(lk.p99_wait_ns),
         " < ".join(lk.waiter_frames[:3]) or "-", " < ".join(lk.waker_frames[:3]) or "-")
        for lk in analysis.locks[:10]
    )
    return AnalyzerSection(
        anchor=ANCHOR_LOCKS,
        title="Lock contention",
        summary=(f"mutex.wait.ratio above {analysis.threshold:.2f} in {totals.flagged} of {totals.spans} "
                 f"requests; serving threads spent {ms_text(totals.wait_ns)} of {ms_text(totals.span_ns)} "
                 "request time acquiring locks or the GIL (waits for work on a condition variable are "
                 "handoff, not contention)."),
        sources=source_states(meta, ["locks"]),
        tables=(Table(caption="Most contended locks", columns=(
            "lock", "kind", "waits", "total", "p99", "waiting code", "released by"), rows=rows),)
        if rows else (),
        notes=("Stacks: frame pointers where the code has them, else return addresses found by "
               "scanning the waiting thread's stack (docs/locks.md).",),
    )


# -- network ---------------------------------------------------------------------


def network(inp: AnalysisInput) -> AnalyzerSection | None:
    meta, conns, found = inp.recording.meta, inp.network, inp.network_findings
    if not probe_set_present(meta, "network") or conns is None:
        return None
    rows = []
    for c in conns:
        d = c.write_to_wire()
        rows.append((str(c.conn_id), "?" if c.nodelay is None else ("on" if c.nodelay else "off"),
                     str(len(c.writes)), str(c.coalesced_writes), ms_text(d.p50), ms_text(d.p99)))
    return AnalyzerSection(
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


# -- GPU -------------------------------------------------------------------------


def gpu(inp: AnalysisInput) -> AnalyzerSection | None:
    meta, summary = inp.recording.meta, inp.gpu
    if not probe_set_present(meta, "gpu") or summary is None:
        return None
    rows = tuple((name, str(f.calls), ms_text(f.total_ns), ms_text(f.p99_ns)) for name, f in
                 sorted(summary.functions.items(), key=lambda kv: -(kv[1].total_ns or 0))[:12])
    return AnalyzerSection(
        anchor=ANCHOR_GPU,
        title="GPU (CUDA)",
        summary="CUDA launches, synchronisation waits, copies and allocations of the server's threads.",
        sources=source_states(meta, ["gpu"]),
        tables=(Table(caption="CUDA calls", columns=("function", "calls", "total", "p99"), rows=rows),)
        if rows else (),
        notes=tuple(f.sentence for f in summary.findings),
    )
