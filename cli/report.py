"""`inferprobe report`: read a recording and say what the latency was.

Flags in, calls out: analyzers/report_data.py builds the report model, and
reports/ draws it (terminal, HTML, Markdown, JSON).
"""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console

from inferprobe.analyzers.report_data import ReportData, build
from inferprobe.collector.model.connection_tallies import ConnectionTallies, summary_line
from inferprobe.collector.model.recording import read_recording
from inferprobe.collector.shared_constants import MUTEX_WAIT_THRESHOLD
from inferprobe.reports.json_report import to_json
from inferprobe.reports.terminal import render_text

EXAMPLES = """
\b
Examples:
  inferprobe report run.ipr                      # terminal summary
  inferprobe report run.ipr -o report.html       # one self-contained HTML file
  inferprobe report run.ipr --format md -o report.md
  inferprobe report run.ipr --format json -o r.json
  inferprobe report --last 5m                    # from the agent's ring (--ring DIR)
"""


def _format_for(fmt: str | None, output: str | None) -> str:
    """--format wins; otherwise the output file's extension; otherwise text."""
    if fmt:
        return fmt
    suffix = (output or "").rsplit(".", 1)[-1].lower() if output and "." in output else ""
    return {"html": "html", "htm": "html", "md": "md", "markdown": "md", "json": "json"}.get(suffix, "text")


@click.command(epilog=EXAMPLES)
@click.argument("recording", type=click.Path(dir_okay=False), required=False)
@click.option("--last", default=None, metavar="SPAN",
              help="Instead of a recording: the agent's ring segments of the last SPAN (90s, 5m, 1h).")
@click.option("--ring", "ring_dir", type=click.Path(file_okay=False), default="/var/lib/inferprobe/ring",
              show_default=True, envvar="INFERPROBE_RING", help="With --last: the agent's ring directory.")
@click.option("--format", "fmt", type=click.Choice(["text", "html", "md", "json"]), default=None,
              help="Output format (default: from the -o file's extension, else text).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file instead of standard output.")
@click.option("--mutex-threshold", type=click.FloatRange(0, 1), default=MUTEX_WAIT_THRESHOLD,
              show_default=True,
              help="Flag requests whose mutex.wait.ratio is above this (recordings made with --locks).")
def report(recording, last, ring_dir, fmt, output, mutex_threshold) -> None:
    """Summarise a recording: requests, TTFT, inter-token and end-to-end latency."""
    fmt = _format_for(fmt, output)
    data = build(_recording(recording, last, ring_dir), mutex_threshold=mutex_threshold)
    if (note := sampling_note(data.recording.final)) is not None:
        click.echo(f"inferprobe: {note}", err=True)
    if data.recording.problem:
        click.echo(f"inferprobe: warning: {recording or ring_dir}: {data.recording.problem}", err=True)
    if earlier := data.recording.meta.earlier_runs:
        click.echo(f"inferprobe: note: the window also covers {len(earlier)} earlier agent run(s) "
                   f"({', '.join(earlier)}: the agent restarted), not in this report: "
                   f"`inferprobe report FILE` reads each of their segments in {ring_dir}", err=True)
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


def _recording(path: str | None, last: str | None, ring_dir: str):
    if (path is None) == (last is None):
        raise click.UsageError("give a recording file or --last SPAN (the agent's ring), one of the two")
    if path is not None:
        return read_recording(path)
    from pathlib import Path

    from inferprobe.collector.model.segment_ring import parse_span, read_window

    try:
        span = parse_span(last or "")
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--last") from None
    return read_window(Path(ring_dir), span)


def sampling_note(final: dict | None) -> str | None:
    """The agent's connection sampling, when it followed fewer than all connections, and the
    kernel's exact tallies of all of them (report json: recording.final.tallies)."""
    sampling = (final or {}).get("sampling") or {}
    accepted, followed = sampling.get("conns_accepted", 0), sampling.get("conns_followed", 0)
    if not accepted or followed >= accepted:
        return None
    note = (f"sampled: {followed} of {accepted} connections ({followed / accepted:.1%}) followed in full "
            f"under the CPU budget; request counts and latencies are of those")
    raw = (final or {}).get("tallies")
    if raw and (line := summary_line(ConnectionTallies.from_dict(raw))) is not None:
        note += f"; {line}" + (" since the agent started" if raw.get("since") == "agent start" else "")
    return note


def _render_html_with_progress(data: ReportData) -> str:
    """Charts take a second or more on big recordings: say what is being drawn on a terminal."""
    from inferprobe.reports.html import render_html

    if not sys.stderr.isatty():
        return render_html(data)
    console = Console(stderr=True)
    with console.status("rendering the HTML report") as status:
        return render_html(data, progress=lambda msg: status.update(msg))
