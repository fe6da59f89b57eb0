"""`inferprobe report`: read a recording and say what the latency was."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from inferprobe.analyzers.cadence import CadenceSummary, Distribution
from inferprobe.analyzers.decompose import TTFT_PHASES, ttft_phases_ns
from inferprobe.analyzers.locks import DEFAULT_MUTEX_THRESHOLD
from inferprobe.analyzers.report_data import ReportData, build, to_json
from inferprobe.cli.gpu_text import render_gpu
from inferprobe.cli.locks_text import render_locks
from inferprobe.cli.stacks_text import render_stacks
from inferprobe.collector.recording import read_recording
from inferprobe.reports import tables

EXAMPLES = """
\b
Examples:
  inferprobe report run.ipr                      # terminal summary
  inferprobe report run.ipr -o report.html       # one self-contained HTML file
  inferprobe report run.ipr --format md -o report.md
  inferprobe report run.ipr --format json -o r.json
"""


def _rich_table(t: tables.Table) -> Table:
    """One of the report's shared tables (reports/tables.py) for the terminal."""
    out = Table(title=t.caption, title_justify="left")
    for k, col in enumerate(t.columns):
        out.add_column(col, justify="left" if k == 0 else "right")
    for row in t.rows:
        out.add_row(*row)
    return out


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.2f}"


def _dist_row(name: str, d: Distribution, unit_ms: bool = True) -> list[str]:
    fmt = _ms if unit_ms else (lambda v: "-" if v is None else f"{v:g}")
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


def render_text(data: ReportData, console: Console) -> None:
    rec = data.recording
    meta = rec.meta
    targets = ", ".join(f"{t['comm']}({t['pid']})" for t in meta.get("targets", []))
    duration = (rec.final or {}).get("duration_s")
    console.print(f"[bold]inferprobe report[/bold]  {rec.path}")
    render_verdict(data, console)
    console.print(
        f"host {meta.get('host', '?')}  kernel {meta.get('kernel', '?')}  targets {targets}  "
        f"duration {'-' if duration is None else f'{duration:.1f} s'}"
    )
    # The same warnings as the HTML and Markdown reports: a damaged recording,
    # lost or undecodable events, why there is no request.
    for warning in tables.warnings(data):
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    s = data.overall
    oc = s.outcomes
    console.print(
        f"requests {s.requests}  (complete {oc['complete']}, aborted {oc['aborted']}, "
        f"incomplete {oc['incomplete']})  errors (status >= 400) {s.errors}  "
        f"lost events {data.lost_events}"
    )
    otlp = ((rec.final or {}).get("export") or {}).get("otlp")
    if otlp:
        console.print(f"OTLP export while recording: {otlp['exported']} traces delivered, "
                      f"{otlp['dropped']} dropped")
    console.print(_latency_table("All requests", s))
    console.print(_rich_table(tables.endpoint_table(data)))
    if (models := tables.model_table(data)) is not None:
        console.print(_rich_table(models))
    console.print(
        "Times in ms. A token chunk is one write carrying token events (SSE data, NDJSON "
        "lines); a chunk can hold more than one token."
    )
    _render_probe_sets(data, console)
    _render_decomposition(data, console)
    _render_scheduler(data, console)
    _render_network(data, console)
    render_locks(data, console)
    render_gpu(data.gpu, console)
    render_stacks(data, console)


def _render_network(data: ReportData, console: Console) -> None:
    from inferprobe.analyzers.network import findings

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
            _ms(d.p50), _ms(d.p99), _ms(d.max), f"{rtt[-1] / 1000:.2f}" if rtt else "-",
            str(cwnd[-1]) if cwnd else "-", str(c.retransmits),
        )
    console.print(table)
    for f in findings(data.network):
        console.print(f"[bold]{f.kind}[/bold] conn {f.conn_id}: {f.summary}")
        console.print(f"  fix: {f.fix}")


def _render_probe_sets(data: ReportData, console: Console) -> None:
    sets = data.probe_sets
    active = ", ".join(sets.get("active", {})) or "none"
    console.print(f"probe sets active: {active}")
    for name, reason in sets.get("inactive", {}).items():
        console.print(f"probe set {name} off: {reason}")


def _render_decomposition(data: ReportData, console: Console) -> None:
    if not data.decomposition:
        return
    rows = {q: ttft_phases_ns(r) for q, r in data.decomposition.items()}
    names = [p for p in TTFT_PHASES if any(p in phases for phases in rows.values())]
    table = Table(title="Where TTFT went (the p50/p90/p99 request by TTFT)", title_justify="left")
    table.add_column("request", justify="left")
    table.add_column("TTFT", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    for q, r in data.decomposition.items():
        phases = rows[q]
        cells = []
        for name in names:
            v = phases.get(name)
            cells.append("-" if v is None else f"{_ms(v)} ({100 * v / r.ttft_ns:.0f}%)" if r.ttft_ns
                         else _ms(v))
        table.add_row(f"p{q}", _ms(r.ttft_ns), *cells)
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
        f"batch stalls {st.count}: p50 {_ms(st.p50)} p99 {_ms(st.p99)} max {_ms(st.max)} ms"
    )


def render_verdict(data: ReportData, console: Console) -> None:
    if not data.findings:
        return
    console.print("[bold]Verdict[/bold] (ranked by share of latency explained)")
    for i, f in enumerate(data.findings, 1):
        console.print(f"{i}. {f.headline}", highlight=False)
        console.print(f"   -> {f.recommendation}", highlight=False)


def _format_for(fmt: str | None, output: str | None) -> str:
    """--format wins; otherwise the output file's extension; otherwise text."""
    if fmt:
        return fmt
    suffix = (output or "").rsplit(".", 1)[-1].lower() if output and "." in output else ""
    return {"html": "html", "htm": "html", "md": "md", "markdown": "md", "json": "json"}.get(suffix, "text")


@click.command(epilog=EXAMPLES)
@click.argument("recording", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["text", "html", "md", "json"]), default=None,
              help="Output format (default: from the -o file's extension, else text).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file instead of standard output.")
@click.option("--mutex-threshold", type=click.FloatRange(0, 1), default=DEFAULT_MUTEX_THRESHOLD,
              show_default=True,
              help="Flag requests whose mutex.wait.ratio is above this (recordings made with --locks).")
def report(recording, fmt, output, mutex_threshold) -> None:
    """Summarise a recording: requests, TTFT, inter-token and end-to-end latency."""
    fmt = _format_for(fmt, output)
    data = build(read_recording(recording), mutex_threshold=mutex_threshold)
    if data.recording.problem:
        click.echo(f"inferprobe: warning: {recording}: {data.recording.problem}", err=True)
    if fmt == "html":
        text = _render_html_with_progress(data)
    out = open(output, "w") if output else sys.stdout  # noqa: SIM115
    try:
        if fmt == "html":
            out.write(text)
        elif fmt == "md":
            from inferprobe.reports.markdown import render_markdown

            out.write(render_markdown(data))
        elif fmt == "json":
            json.dump(to_json(data), out, indent=1)
            out.write("\n")
        else:
            render_text(data, Console(file=out, width=None if out.isatty() else 120))
    finally:
        if output:
            out.close()


def _render_html_with_progress(data: ReportData) -> str:
    """Charts take a second or more on big recordings: say what is being drawn on a terminal."""
    from inferprobe.reports.html import render_html

    if not sys.stderr.isatty():
        return render_html(data)
    console = Console(stderr=True)
    with console.status("rendering the HTML report") as status:
        return render_html(data, progress=lambda msg: status.update(msg))
