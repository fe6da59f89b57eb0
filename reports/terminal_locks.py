"""The lock section of the terminal report (recordings made with --locks)."""

from __future__ import annotations

from typing import cast

from rich.console import Console
from rich.table import Table

from inferprobe.analyzers.locks import SpanLocks
from inferprobe.analyzers.report_data import ReportData
from inferprobe.analyzers.units import ms

MAX_FLAGGED_ROWS = 20


def render_locks(data: ReportData, console: Console) -> None:
    locks = data.locks
    if locks is None or not locks.enabled:
        return
    flagged = locks.flagged_requests(data.requests)
    measured = [r for r in data.requests if locks.of(r) is not None]
    share = f"{len(flagged) / len(measured):.0%}" if measured else "-"
    console.print(
        f"[bold]Lock contention[/bold]  mutex.wait.ratio > {locks.threshold:g}: "
        f"{len(flagged)} of {len(measured)} requests ({share})"
    )
    if flagged:
        table = Table(title="Flagged requests", title_justify="left")
        for col in ("request", "tid", "span ms", "ratio", "lock ms", "GIL ms", "handoff ms",
                    "runqueue ms", "top lock"):
            table.add_column(col, justify="left" if col == "request" else "right")
        for r in flagged[:MAX_FLAGGED_ROWS]:
            s = cast(SpanLocks, locks.of(r))  # flagged, so it has a span
            table.add_row(r.endpoint, str(r.tid), ms(s.span_ns), f"{s.ratio:.2f}", ms(s.lock_wait_ns),
                          ms(s.gil_wait_ns), ms(s.handoff_wait_ns), ms(s.runqueue_ns),
                          "-" if s.top_lock is None else f"{s.top_lock:#x}")
        console.print(table)
    if locks.locks:
        table = Table(title="Top contended locks", title_justify="left")
        for col in ("address", "kind", "waits", "total ms", "p99 ms", "waiter", "released by"):
            table.add_column(col, justify="right" if col in ("waits", "total ms", "p99 ms") else "left")
        for lk in locks.locks:
            table.add_row(f"{lk.pid}:{lk.uaddr:#x}", lk.kind.value, str(lk.waits), ms(lk.total_wait_ns),
                          ms(lk.p99_wait_ns), " < ".join(lk.waiter_frames[:4]),
                          " < ".join(lk.waker_frames[:4]) or "-")
        console.print(table)
    kinds = locks.waits_by_kind
    console.print(
        "Futex waits by kind (at least the floor): "
        + ", ".join(f"{k} {v['waits']} ({ms(v['wait_ns'])} ms)" for k, v in kinds.items())
        + ". Handoff = waiting for work (condition variable, semaphore): not contention."
    )
