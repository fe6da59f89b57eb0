"""`inferprobe flamegraph`: draw the stacks a recording holds."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from inferprobe.analyzers import stack_fold as fold
from inferprobe.collector.errors import InferprobeError
from inferprobe.collector.model.recording import read_recording

EXAMPLES = """
\b
Examples:
  inferprobe flamegraph run.ipr -o cpu.svg                       # on-CPU, interactive SVG
  inferprobe flamegraph run.ipr --kind offcpu -o wait.svg        # where threads waited
  inferprobe flamegraph run.ipr --phase prefill -o prefill.svg   # needs record --phases
  inferprobe flamegraph run.ipr --format folded -o cpu.folded    # for flamegraph.pl, inferno
  inferprobe flamegraph run.ipr --format speedscope -o cpu.json  # open in speedscope.app
  inferprobe flamegraph new.ipr --diff old.ipr -o diff.svg       # red grew, blue shrank
"""

PHASES = ("ingress", "queued", "prefill", "decode", "network-write", "idle")


class UsageProblem(InferprobeError):
    exit_code = 2


@click.command(epilog=EXAMPLES)
@click.argument("recording", type=click.Path(dir_okay=False))
@click.option("--kind", type=click.Choice(["cpu", "offcpu"]), default="cpu", show_default=True,
              help="On-CPU samples (record --profile) or off-CPU waits (record --offcpu).")
@click.option("--phase", type=click.Choice(PHASES), default=None,
              help="Only samples taken while the thread was in this request phase (record --phases).")
@click.option("--format", "fmt", type=click.Choice(["svg", "folded", "speedscope"]), default="svg",
              show_default=True, help="Output format.")
@click.option("--group", type=click.Choice(fold.GROUP_CHOICES), default="process", show_default=True,
              help="Root frames: one per process, per process and thread, or none.")
@click.option("--diff", "baseline", type=click.Path(dir_okay=False), default=None,
              help="A second recording to compare with: frames are coloured by the change in "
              "their share of all samples (red grew, blue shrank). SVG only.")
@click.option("--width", type=click.IntRange(400, 10000), default=1200, show_default=True,
              help="SVG width in pixels.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default="-",
              show_default=True, help="File to write ('-' for standard output).")
def flamegraph(recording, kind, phase, fmt, group, baseline, width, output) -> None:
    """Draw a flame graph of the stacks in a recording.

    Frames are named when recording stops (ELF symbols, kallsyms, CPython
    perf maps); what could not be named shows as `[unknown] lib+0xoffset`,
    and stacks cut short by code without frame pointers start with
    `[truncated]`. Widths are samples (on-CPU) or microseconds off the CPU.
    """
    from inferprobe.analyzers.stack_profile import load

    profile = load(read_recording(recording), kind, phase=phase, group=group)
    if fmt == "folded":
        text = fold.to_text(profile.stacks)
    elif fmt == "speedscope":
        from inferprobe.flamegraphs import speedscope

        text = speedscope.dumps(profile.stacks, profile.title, profile.unit)
    else:
        from inferprobe.flamegraphs import svg

        base = None
        if baseline is not None:
            base = load(read_recording(baseline), kind, phase=phase, group=group).stacks
        text = svg.render(profile.stacks, profile.title + (" vs baseline" if base else ""),
                          profile.subtitle, profile.unit, width=width,
                          root_levels=profile.root_levels, baseline=base)
    if baseline is not None and fmt != "svg":
        raise UsageProblem("--diff draws an SVG; leave out --format or use --format svg")
    for note in profile.notes:
        click.echo(f"inferprobe: note: {note}", err=True)
    if output == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(output).write_text(text)
        except OSError as err:
            raise UsageProblem(f"cannot write {output}: {err.strerror}") from None
        click.echo(f"inferprobe: wrote {output} ({profile.total:,} {profile.unit})", err=True)
