"""The terminal report: the model (analyzers/report_data.py) drawn with rich.

The same warnings and shared tables as the HTML and Markdown reports
(reports/tables.py), then the sections only the terminal prints this way;
the lock, GPU and flame graph sections have modules of their own.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from inferprobe.analyzers.batching import ANCHOR as BATCHING_ANCHOR
from inferprobe.analyzers.cadence import CadenceSummary, Distribution
from inferprobe.analyzers.client_calls import ANCHOR as CLIENT_CALLS_ANCHOR
from inferprobe.analyzers.decompose import TTFT_PHASES
from inferprobe.analyzers.engine_metrics_ttft import ANCHOR as ENGINE_METRICS_ANCHOR
from inferprobe.analyzers.proxy_hops import ANCHOR as PROXY_HOPS_ANCHOR
from inferprobe.analyzers.report_data import ReportData
from inferprobe.analyzers.units import ms
from inferprobe.reports import tables
from inferprobe.reports.sections.model import AnalyzerSection
from inferprobe.reports.sections.phase_sources import ANCHOR as PHASE_SOURCES_ANCHOR
from inferprobe.reports.sections.registry import sections_of
from inferprobe.reports.terminal_gpu import render_gpu
from inferprobe.reports.terminal_locks import render_locks
from inferprobe.reports.terminal_stacks import render_stacks


def rich_table(t: tables.Table) -> Table:
    """One of the report's shared tables (reports/tables.py) for the terminal."""
    out = Table(title=t.caption, title_justify="left")
    for k, col in enumerate(t.columns):
        out.add_column(col, justify="left" if k == 0 else "right")
    for row in t.rows:
        out.add_row(*row)
    return out


def _dist_row(name: str, d: Distribution, unit_ms: bool = True) -> list[str]:
    fmt = ms if unit_ms else (lambda v: "-" if v is None else f"{v:g}")
    return [name, str(d.count), fmt(d.p50), fmt(d.p90), fmt(d.p99), fmt(d.max)]


def _latency_table(title: str, s: CadenceSummary) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("metric", "count", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    table.add_row(*_dist_row("TTFT (ms)", s.ttft_ns))
    table.add_row(*_dist_row("inter-token (ms)", s.itl_ns))
    table.add_row(*_dist_row("end-to-end (ms)", s.e2e_ns))
    table.add_row(*_dist_row("token chunks/request", s.tokens_per_request, unit_ms=False))
    return table


def render_text(data: ReportData, console: Console,
                sections: Sequence[AnalyzerSection] | None = None) -> None:
    """The report in the terminal; `sections`, the analyzer sections, are built from data unless
    given."""
    sections = sections_of(data) if sections is None else sections
    rec = data.recording
    meta = rec.meta
    targets = ", ".join(f"{t.comm}({t.pid})" for t in meta.targets)
    duration = (rec.final or {}).get("duration_s")
    console.print(f"[bold]inferprobe report[/bold]  {rec.path}")
    render_verdict(data, console)
    console.print(
        f"host {meta.host or '?'}  kernel {meta.kernel or '?'}  targets {targets}  "
        f"duration {'-' if duration is None else f'{duration:.1f} s'}"
    )
    # The same warnings as the HTML and Markdown reports: a damaged recording,
    # lost or undecodable events, why there is no request.
    for warning in tables.warnings(data):
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    for note in tables.notes(data):
        console.print(f"note: {note}", highlight=False)
    s = data.overall
    oc = s.outcomes
    outbound = sum(1 for r in data.requests if r.role == "client")
    served_too = outbound < len(data.requests)  # else the calls are the requests counted
    calls = f"  outbound calls {outbound} (not counted above)" if outbound and served_too else ""
    console.print(
        f"requests {s.requests}  (complete {oc['complete']}, aborted {oc['aborted']}, "
        f"incomplete {oc['incomplete']})  errors (status >= 400) {s.errors}  "
        f"lost events {data.lost_events}{calls}"
    )
    otlp = ((rec.final or {}).get("export") or {}).get("otlp")
    if otlp:
        console.print(f"OTLP export while recording: {otlp['exported']} traces delivered, "
                      f"{otlp['dropped']} dropped")
    console.print(_latency_table("All requests", s))
    console.print(rich_table(tables.endpoint_table(data)))
    if (models := tables.model_table(data)) is not None:
        console.print(rich_table(models))
    if (cgroups := tables.cgroup_table(data)) is not None:
        console.print(rich_table(cgroups))
    console.print(
        "Times in ms. A token chunk is one write carrying token events (SSE data, NDJSON "
        "lines); a chunk can hold more than one token."
    )
    _render_probe_sets(data, console)
    _render_decomposition(data, console)
    _render_scheduler(data, console)
    # The outbound calls, a proxy's hops, where the phases came from, the engine's own
    # /metrics and batching (reports/sections/).
    _render_sections(sections, console, (CLIENT_CALLS_ANCHOR, PROXY_HOPS_ANCHOR, PHASE_SOURCES_ANCHOR,
                                         ENGINE_METRICS_ANCHOR, BATCHING_ANCHOR))
    _render_network(data, console)
    render_locks(data, console)
    render_gpu(data.gpu, console)
    render_stacks(sections, console)


def _render_network(data: ReportData, console: Console) -> None:
    if not data.network:
        return
    table = Table(title="Network: write -> wire per connection", title_justify="left")
    for col in ("conn", "nodelay", "writes", "segments", "coalesced", "after ACK", "p50 ms",
                "p99 ms", "max ms", "rtt ms", "cwnd", "retrans"):
        table.add_column(col, justify="right")
    for c in data.network:
        d = c.write_to_wire()
        rtt = c.tcp_info_series("rtt_us")
        cwnd = c.tcp_info_series("cwnd")
        table.add_row(
            str(c.conn_id), "?" if c.nodelay is None else ("on" if c.nodelay else "off"),
            str(len(c.writes)), str(c.segments), str(c.coalesced_writes), str(c.ack_released_writes),
            ms(d.p50), ms(d.p99), ms(d.max), f"{rtt[-1] / 1000:.2f}" if rtt else "-",
            str(cwnd[-1]) if cwnd else "-", str(c.retransmits),
        )
    console.print(table)
    for f in data.network_findings:
        console.print(f"[bold]{f.kind}[/bold] conn {f.conn_id}: {f.sentence}")
        console.print(f"  fix: {f.recommendation}")


def _render_probe_sets(data: ReportData, console: Console) -> None:
    sets = data.probe_sets
    active = ", ".join(sets.get("active", {})) or "none"
    console.print(f"probe sets active: {active}")
    for name, reason in sets.get("inactive", {}).items():
        console.print(f"probe set {name} off: {reason}")


def _render_decomposition(data: ReportData, console: Console) -> None:
    if not data.decomposition:
        return
    rows = {q: row.ttft_phases_ns for q, row in data.decomposition.items()}
    names = [p for p in TTFT_PHASES if any(p in phases for phases in rows.values())]
    table = Table(title="Where TTFT went (the p50/p90/p99 request by TTFT)", title_justify="left")
    table.add_column("request", justify="left")
    table.add_column("TTFT", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    for q, row in data.decomposition.items():
        r, phases = row.request, rows[q]
        cells = []
        for name in names:
            v = phases.get(name)
            cells.append("-" if v is None else f"{ms(v)} ({100 * v / r.ttft_ns:.0f}%)" if r.ttft_ns
                         else ms(v))
        table.add_row(f"p{q}", ms(r.ttft_ns), *cells)
    console.print(table)


def _render_scheduler(data: ReportData, console: Console) -> None:
    if data.server.empty:
        return
    sched = data.scheduler
    console.print(
        f"server probes: {len(data.server.requests)} requests announced, {data.correlated} tied to "
        f"their socket request; {sched.steps} decode steps, batch size p50 "
        f"{sched.batch_size.p50 if sched.batch_size.p50 is not None else '-'} "
        f"max {sched.batch_size.max if sched.batch_size.max is not None else '-'}"
    )
    if sched.queue_length_max is not None:
        console.print(f"scheduler_queue_length max {sched.queue_length_max}")
    if sched.occupancy_max is not None:
        console.print(f"token_occupancy_ratio max {sched.occupancy_max:.2f}")
    st = sched.stall_ns
    console.print(
        f"batch stalls {st.count}: p50 {ms(st.p50)} p99 {ms(st.p99)} max {ms(st.max)} ms"
    )


def _render_sections(sections: Sequence[AnalyzerSection], console: Console, anchors: tuple[str, ...]) -> None:
    """Analyzer sections the terminal prints as every output draws them: a title and
    summary, their tables, their notes."""
    for sec in sections:
        if sec.anchor in anchors:
            console.print(f"[bold]{sec.title}[/bold]: {sec.summary}")
            for t in sec.tables:
                console.print(rich_table(t))
            for note in sec.notes:
                console.print(note)


def render_section(data: ReportData, anchor: str, console: Console) -> None:
    """One analyzer section alone (`inferprobe advise`)."""
    _render_sections(sections_of(data), console, (anchor,))


def render_verdict(data: ReportData, console: Console) -> None:
    if not data.findings:
        return
    console.print("[bold]Verdict[/bold] (ranked by share of latency explained)")
    for i, f in enumerate(data.findings, 1):
        console.print(f"{i}. {f.headline}", highlight=False)
        console.print(f"   -> {f.recommendation}", highlight=False)
