"""The GPU part of the terminal report (reads the model's GpuSummary only)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from inferprobe.analyzers.gpu import GpuSummary
from inferprobe.analyzers.units import ms


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e3:.1f}"


def render_gpu(g: GpuSummary | None, console: Console) -> None:
    if g is None:
        return
    console.print(f"GPU sources: {g.sources.get('description') or '-'}")
    if g.functions:
        table = Table(title="CUDA calls (outermost on their thread; times in µs)", title_justify="left")
        for col in ("function", "library", "calls", "nested", "errors", "total", "p99", "bytes"):
            table.add_column(col, justify="left" if col in ("function", "library") else "right")
        for f in sorted(g.functions.values(), key=lambda f: -(f.total_ns or 0)):
            p99 = _us(f.p99_ns) if f.p99_from != "histogram" else f"<{_us(f.p99_ns)}"
            table.add_row(f.name, f.library, str(f.calls), str(f.nested), str(f.errors), _us(f.total_ns),
                          p99, str(f.bytes) if f.category in ("copy", "memory") else "")
        console.print(table)
    for p in g.processes:
        rate = "-" if p.launches_per_s is None else f"{p.launches_per_s:.0f}"
        share = "-" if p.wait_share is None else f"{100 * p.wait_share:.1f} %"
        console.print(f"pid {p.pid}: {p.launches} launches ({p.graph_launches} graph), {rate}/s; "
                      f"GPU wait {ms(p.wait_ns)} ms, {share} of wall time on thread {p.wait_tid}; "
                      f"{p.allocations['count']} allocations, {p.allocations['during_requests']} "
                      "while requests were in flight")
    if g.steps:
        label = "decode steps" if g.steps_from == "decode_steps" else "GPU cycles"
        console.print(f"{len(g.steps)} {label}: {100 * (g.step_wait_share or 0):.0f} % of their time "
                      "waiting on the GPU")
    if g.requests:
        console.print(f"{len(g.requests)} requests with GPU work attributed to them")
    for finding in g.findings:
        console.print(f"[yellow]GPU finding:[/yellow] {finding.sentence}")
