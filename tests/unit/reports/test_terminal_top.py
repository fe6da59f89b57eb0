"""`top`'s views of a live snapshot (reports/terminal_top.py), no root: the plain
line a pipe gets and the dashboard a terminal gets, from the same figures."""

from __future__ import annotations

from rich.console import Console

from inferprobe.analyzers.live import LiveSnapshot
from inferprobe.reports.terminal_top import dashboard, plain_line


def snapshot(**changes) -> LiveSnapshot:
    figures = dict(window_s=10.0, total_requests=42, requests_per_s=3.5, in_flight=2,
                   ttft_p50_ns=12_000_000, ttft_p99_ns=80_500_000, itl_p50_ns=4_000_000,
                   itl_p99_ns=9_000_000, e2e_p50_ns=300_000_000, e2e_p99_ns=1_200_000_000,
                   queue_waiting=None, queue_running=None, kv_occupancy=None, lost_events=0, events=900)
    return LiveSnapshot(**{**figures, **changes})


def test_the_plain_line_states_every_figure_in_ms():
    line = plain_line(snapshot(), elapsed_s=7.2)
    assert line.startswith("t=7s req/s=3.5 in_flight=2 requests=42 ")
    assert "ttft_ms p50=12.00 p99=80.50" in line and "e2e_ms p50=300.00 p99=1200.00" in line
    assert "queue=" not in line and "mutex_flagged" not in line and line.endswith("lost=0")


def test_the_plain_line_adds_the_gauges_and_the_mutex_share_when_known():
    line = plain_line(snapshot(queue_waiting=3, queue_running=8, kv_occupancy=0.25, locks_traced=True,
                               mutex_flagged_share=0.5, mutex_judged=6, lost_events=4), elapsed_s=1)
    assert "queue=3 running=8 kv=25%" in line and "mutex_flagged=50% judged=6" in line
    assert line.endswith("lost=4")


def test_the_dashboard_fits_80_columns_and_says_what_is_not_traced():
    console = Console(width=80, record=True, color_system=None)
    console.print(dashboard(snapshot(), pids=[1234], elapsed_s=5))
    text = console.export_text()
    assert "pid 1234" in text and "12.0" in text and "80.5" in text
    assert "no inferprobe USDT probes in the target" in text
    assert "lock waits not traced (top --locks)" in text
    assert max(len(line) for line in text.splitlines()) <= 80
