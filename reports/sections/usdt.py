"""The server-probes (USDT) analyzer section: the server's own view."""

from __future__ import annotations

from collections import Counter

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.collector.model.events import UsdtRecord
from inferprobe.reports.sections.model import (
    AnalyzerSection,
    BarChart,
    Table,
    probe_set_present,
    source_states,
)


def build(inp: AnalysisInput) -> AnalyzerSection | None:
    meta = inp.recording.meta
    if not probe_set_present(meta, "usdt"):
        return None
    usdt = [e for e in inp.events if isinstance(e, UsdtRecord)]
    fired = Counter(e.probe.name.lower() for e in usdt)
    queues = [queue for e in usdt if (queue := e.queue_depth) is not None]
    waiting = [w for w, _ in queues]
    running = [r for _, r in queues]
    kv = [used for e in usdt if (used := e.kv_used) is not None]
    rows = [
        ("probe events", str(len(usdt))),
        ("waiting queue peak", str(max(waiting)) if waiting else "no queue_depth probe fired"),
        ("running (batch) peak", str(max(running)) if running else "-"),
        ("token (KV) occupancy peak", f"{max(kv) * 100:.0f} %" if kv else "no kv_usage probe fired"),
    ]
    charts: tuple[BarChart, ...] = ()
    if fired:
        charts = (BarChart(title="Probe firings", value_label="events (count)",
                           bars=tuple(sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])))),)
    return AnalyzerSection(
        anchor="analyzer-usdt",
        title="Server probes (USDT)",
        summary="Queueing, scheduling, prefill and decode steps as the server reported them through "
                "its inferprobe USDT probes.",
        sources=source_states(meta, ["usdt"]),
        tables=(Table(caption="Server gauges", columns=("measure", "value"), rows=tuple(rows)),),
        charts=charts,
    )
