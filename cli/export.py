"""`inferprobe export`: replay a recording into an OTLP tracing backend."""

from __future__ import annotations

import click

from inferprobe.analyzers.report_data import build
from inferprobe.cli.export_options import otlp_options
from inferprobe.collector.model.recording import read_recording
from inferprobe.exporters.clock import WallClock
from inferprobe.exporters.setup import ExportProblem, make_shipper

EXAMPLES = """
\b
Examples:
  inferprobe export run.ipr --otlp                      # env OTEL_EXPORTER_OTLP_* or localhost:4318
  inferprobe export run.ipr --otlp --protocol grpc --endpoint http://collector:4317
  inferprobe export run.ipr --otlp --headers "authorization=Bearer%20TOKEN"
"""


@click.command(epilog=EXAMPLES)
@click.argument("recording", type=click.Path(dir_okay=False))
@click.option("--otlp", is_flag=True, required=True, help="Send one OTLP trace per request (required).")
@otlp_options
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds to wait for the backend to take the last traces.")
def export(recording, otlp, wait_s, **opts) -> None:
    """Replay a recording's requests as OTLP traces, one per request."""
    rec = read_recording(recording)
    # The same requests, tied to the server's USDT view, as `report` shows, with what
    # the analyzers found about each (mutex.wait.ratio, lock and GPU waits).
    model = build(rec)
    requests = model.requests
    clock = WallClock.from_recording(rec.meta, rec.stats)
    shipper, where = make_shipper(rec.meta, clock, opts, live=False)
    # A served request is one trace; an outbound call one trace of its attempts.
    analyses = {id(req): analysis for req, analysis in zip(requests, model.per_request, strict=True)}
    for req in requests:
        if req.role != "client":
            shipper.submit(req, block=True, analysis=analyses[id(req)])
    for call in model.client_calls:
        shipper.submit_call(call, [analyses[id(a.request)] for a in call.attempts])
    stats = shipper.close(wait_s)
    traces = stats.submitted
    calls = f", {len(model.client_calls)} of them outbound calls" if model.client_calls else ""
    click.echo(f"inferprobe: exported {stats.exported} of {traces} traces{calls} to {where}"
               + (f"; {stats.dropped} not delivered" if stats.dropped else ""))
    if rec.problem:
        click.echo(f"inferprobe: warning: recording {rec.problem}; exported what is readable", err=True)
    if stats.dropped:
        raise ExportProblem(f"{stats.dropped} of {traces} traces were not delivered to {where}: "
                            "is the backend up and the endpoint right?")
