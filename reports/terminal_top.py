"""`inferprobe top`'s two views of a LiveSnapshot (analyzers/live.py): the
dashboard drawn on a terminal, and the plain line printed once a refresh
when stdout is not one. They draw only: the window computes.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from inferprobe.analyzers.live import LiveSnapshot
from inferprobe.analyzers.units import ms


def plain_line(s: LiveSnapshot, elapsed_s: float) -> str:
    line = (f"t={elapsed_s:.0f}s req/s={s.requests_per_s:.1f} in_flight={s.in_flight} "
            f"requests={s.total_requests} ttft_ms p50={ms(s.ttft_p50_ns)} p99={ms(s.ttft_p99_ns)} "
            f"itl_ms p50={ms(s.itl_p50_ns)} p99={ms(s.itl_p99_ns)} "
            f"e2e_ms p50={ms(s.e2e_p50_ns)} p99={ms(s.e2e_p99_ns)}")
    if s.queue_waiting is not None:
        line += f" queue={_count(s.queue_waiting)} running={_count(s.queue_running)}"
    if s.kv_occupancy is not None:
        line += f" kv={s.kv_occupancy * 100:.0f}%"
    if s.gauge_source is not None:
        line += f" gauges_from={s.gauge_source}"
    if s.locks_traced:
        line += f" mutex_flagged={_share(s.mutex_flagged_share)} judged={s.mutex_judged}"
    return line + f" lost={s.lost_events}"


def _count(v: int | None) -> str:
    """A gauge the source does not publish is -1 (or None): shown as "-"."""
    return "-" if v is None or v < 0 else str(v)


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


def mutex_line(s: LiveSnapshot) -> Text:
    if not s.locks_traced:
        return Text("mutex-flagged: lock waits not traced (top --locks)", style="dim")
    if not s.mutex_judged:
        return Text.assemble(("mutex-flagged ", "dim"), "- (no request ended in the window yet)")
    hot = s.mutex_flagged_share is not None and s.mutex_flagged_share > 0
    return Text.assemble(("mutex-flagged ", "dim"),
                         (_share(s.mutex_flagged_share), "bold red" if hot else "bold"),
                         (f" of {s.mutex_judged} ended requests "
                          f"(mutex.wait.ratio > {s.mutex_threshold:g})", "dim"))


def dashboard(s: LiveSnapshot, pids: list[int], elapsed_s: float) -> Group:
    """Fits 80x24: a title line, one latency table, one gauge table, a key hint."""
    title = Text.assemble(("inferprobe top", "bold"), f"  pid {', '.join(map(str, pids))}  ",
                          f"up {elapsed_s:.0f} s  window {s.window_s:g} s")
    traffic = Table.grid(padding=(0, 3))
    traffic.add_row(Text.assemble(("requests/s ", "dim"), (f"{s.requests_per_s:.1f}", "bold")),
                    Text.assemble(("in flight ", "dim"), (str(s.in_flight), "bold")),
                    Text.assemble(("requests ", "dim"), str(s.total_requests)),
                    Text.assemble(("lost events ", "dim"),
                                  (str(s.lost_events), "bold red" if s.lost_events else "")))
    latency = Table(title="latency over the window (ms)", title_justify="left", width=60)
    for col in ("", "p50", "p99"):
        latency.add_column(col, justify="left" if not col else "right")
    latency.add_row("time to first token", ms(s.ttft_p50_ns), ms(s.ttft_p99_ns))
    latency.add_row("inter-token", ms(s.itl_p50_ns), ms(s.itl_p99_ns))
    latency.add_row("end-to-end", ms(s.e2e_p50_ns), ms(s.e2e_p99_ns))
    server = Table.grid(padding=(0, 3))
    if s.queue_waiting is None and s.kv_occupancy is None:
        server.add_row(Text("queue length and token occupancy: no inferprobe USDT probes in the target "
                            "and no engine /metrics", style="dim"))
    else:
        server.add_row(
            Text.assemble(("queue waiting ", "dim"), _count(s.queue_waiting)),
            Text.assemble(("running ", "dim"), _count(s.queue_running)),
            Text.assemble(("token occupancy ", "dim"),
                          "-" if s.kv_occupancy is None else f"{s.kv_occupancy * 100:.0f} %"),
            Text.assemble(("from ", "dim"), s.gauge_source or "-"),
        )
    return Group(title, Text(""), traffic, Text(""), latency, server, mutex_line(s), Text(""),
                 Text("q or Ctrl-C: detach and quit", style="dim"))
