"""The GPU part of the terminal report (reads the model's GpuSummary only)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from inferprobe.analyzers.gpu import GpuSummary
from inferprobe.analyzers.gpu_execution import GpuExecutionSummary
from inferprobe.analyzers.units import ms, us


def render_gpu(g: GpuSummary | None, console: Console) -> None:
    if g is None:
        return
    console.print(f"GPU sources: {g.sources.get('description') or '-'}")
    if g.functions:
        table = Table(title="CUDA calls (outermost on their thread; times in µs)", title_justify="left")
        for col in ("function", "library", "calls", "nested", "errors", "total", "p99", "bytes"):
            table.add_column(col, justify="left" if col in ("function", "library") else "right")
        for f in sorted(g.functions.values(), key=lambda f: -(f.total_ns or 0)):
            p99 = us(f.p99_ns) if f.p99_from != "histogram" else f"<{us(f.p99_ns)}"
            table.add_row(f.name, f.library, str(f.calls), str(f.nested), str(f.errors), us(f.total_ns),
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
    if g.execution is not None:
        render_execution(g.execution, console)
    for finding in g.findings:
        console.print(f"[yellow]GPU finding:[/yellow] {finding.sentence}")


KERNEL_ROWS_SHOWN = 10


def render_execution(x: GpuExecutionSummary, console: Console) -> None:
    """What the GPU ran (CUPTI shim), beside the CPU-side calls above."""
    for pid, text in x.shim.items():
        console.print(f"CUPTI shim in pid {pid}: {text}")
    if not x.records:
        return
    console.print(f"GPU execution: {x.records} kernels, copies and memsets, busy {ms(x.busy_ns)} ms; "
                  f"{x.joined} joined to their launch, {x.without_launch} launched before the shim saw the "
                  f"call, {x.without_clock} without a clock pairing (not placed)")
    if x.kernels:
        table = Table(title="GPU time by kernel (CUPTI; µs)", title_justify="left")
        for col in ("name", "kind", "count", "total", "mean", "max"):
            table.add_column(col, justify="left" if col in ("name", "kind") else "right")
        for k in x.kernels[:KERNEL_ROWS_SHOWN]:
            table.add_row(k.name, k.kind, str(k.count), us(k.total_ns), us(k.mean_ns), us(k.max_ns))
        console.print(table)
    if x.requests:
        table = Table(title="GPU execution per request (ms)", title_justify="left")
        for col in ("request", "by", "busy", "idle", "largest gap", "first launch→GPU", "GPU→first token",
                    "batched with"):
            table.add_column(col, justify="right")
        for r in x.requests:
            table.add_row(str(r.index), r.attributed_by, ms(r.gpu.busy_ns), ms(r.gpu.idle_ns),
                          ms(r.gpu.largest_gap_ns), ms(r.launch_queue_ns),
                          ms(r.last_gpu_end_to_first_token_ns), str(r.concurrent))
        console.print(table)
    shares = [s.gpu_busy_share for s in x.steps if s.gpu_busy_share is not None]
    if shares:
        console.print(f"{len(shares)} steps: the GPU was busy {100 * sum(shares) / len(shares):.0f} % of "
                      "their time on average (the rest: the GPU waiting on the CPU)")
