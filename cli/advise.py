"""`inferprobe advise`: the batch setting that meets a latency target, from a recording.

Flags in, calls out: analyzers/batching.py fits the step-time model and replays
the recording at each setting; reports/ draws the same model as `report` does.
"""

from __future__ import annotations

import json
import re
import sys

import click
from rich.console import Console

from inferprobe.analyzers.batching import Target
from inferprobe.analyzers.report_data import build
from inferprobe.collector.errors import InferprobeError
from inferprobe.collector.model.recording import read_recording

EXAMPLES = """
\b
Examples:
  inferprobe advise run.ipr --ttft-p99 800ms --itl-p99 120ms
  inferprobe advise run.ipr --itl-p99 0.1s --format json
  inferprobe advise run.ipr --ttft-p99 2s --current 4   # the engine ran with -np 4
  inferprobe advise run.ipr --ttft-p99 2s -o advice.html  # the whole report, with the chart
"""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*$")


class Duration(click.ParamType):
    """800ms, 0.8s, or a bare number of milliseconds -> nanoseconds."""

    name = "DURATION"

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            return value
        m = _DURATION.match(str(value))
        if m is None or float(m.group(1)) <= 0:
            self.fail(f"{value!r} is not a latency: write it as 800ms or 0.8s", param, ctx)
        scale = 1e9 if m.group(2) == "s" else 1e6
        return int(float(m.group(1)) * scale)


@click.command(epilog=EXAMPLES)
@click.argument("recording", type=click.Path(dir_okay=False, exists=True))
@click.option("--ttft-p99", type=Duration(), default=None,
              help="Target p99 time to first token (800ms, 1.5s).")
@click.option("--itl-p99", type=Duration(), default=None, help="Target p99 inter-token latency (120ms).")
@click.option("--current", type=click.IntRange(min=1), default=None,
              help="The batch cap the engine ran with, where the recording shows less (fewer clients "
                   "than slots); default: the most requests it held at once.")
@click.option("--format", "fmt", type=click.Choice(["text", "md", "json", "html"]), default=None,
              help="Output format (default: from the -o file's extension, else text).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file instead of standard output.")
def advise(recording, ttft_p99, itl_p99, current, fmt, output) -> None:
    """Name the engine batch setting (llama.cpp -np, the demo's --max-batch-size) that meets a
    p99 TTFT and ITL target at the highest throughput, predicted by replaying this recording's
    requests through a step-time model fitted on its engine steps (docs/advise.md)."""
    from inferprobe.cli.report import _format_for

    if ttft_p99 is None and itl_p99 is None:
        raise click.UsageError("give a target: --ttft-p99, --itl-p99 or both (for example --ttft-p99 800ms)")
    fmt = _format_for(fmt, output)
    data = build(read_recording(recording), target=Target(ttft_p99, itl_p99), current_setting=current)
    advice = data.batching
    if advice is None or advice.model is None:
        why = advice.cannot if advice is not None and advice.cannot else (
            "the recording has no engine step timeline")
        raise InferprobeError(f"{recording}: no batching advice: {why}")
    out = open(output, "w") if output else sys.stdout  # noqa: SIM115
    try:
        if fmt == "json":
            from inferprobe.reports.json_batching import batching_json

            json.dump(batching_json(advice), out, indent=1)
            out.write("\n")
        elif fmt == "md":
            from inferprobe.reports.markdown import section_markdown

            out.write(section_markdown(data, "analyzer-batching"))
        elif fmt == "html":
            from inferprobe.reports.html import render_html

            out.write(render_html(data))
        else:
            from inferprobe.reports.terminal import render_section

            render_section(data, "analyzer-batching", Console(file=out, width=None if out.isatty() else 140))
    finally:
        if output:
            out.close()
