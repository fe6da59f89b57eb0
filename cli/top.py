"""`inferprobe top`: a live terminal view of a running server's latency.

Attaches exactly like `record` (same loader, same ring buffer), but instead
of writing a file feeds the events to analyzers/live.py's sliding window and
redraws once a second. `q` or Ctrl-C detach and exit; when stdout is not a
terminal it prints one plain line per refresh instead.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty

import click
from rich.console import Console
from rich.live import Live

from inferprobe.analyzers.live import LiveLocks, LiveWindow
from inferprobe.analyzers.locks import DEFAULT_MUTEX_THRESHOLD, WaitClassifier
from inferprobe.cli.engine_options import engine_metrics_options, engine_metrics_source
from inferprobe.cli.options import apply_btf, btf_option, pid_option
from inferprobe.collector.attach.engine_scrape import Scraper
from inferprobe.collector.ingest.pipeline import decode_all
from inferprobe.collector.model.ringbuf_format import iter_ring_records
from inferprobe.reports.terminal_top import dashboard, plain_line

EXAMPLES = """
\b
Examples:
  sudo inferprobe top -p 1234               # q or Ctrl-C to leave
  sudo inferprobe top -p 1234 --window 30   # percentiles over the last 30 s
  sudo inferprobe top -p 1234 --locks       # and the share of requests flagged for lock waits
  sudo inferprobe top -p 1234 | tee top.log # plain lines when not on a terminal
"""


class _Keys:
    """Single keypresses from a terminal stdin (cbreak mode), restored on exit."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        self._saved: list | None = None  # termios attributes to restore

    def __enter__(self) -> _Keys:
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *_exc) -> None:
        if self.fd is not None and self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def quit_pressed(self) -> bool:
        if self.fd is None:
            return False
        while select.select([self.fd], [], [], 0)[0]:
            if os.read(self.fd, 1) in (b"q", b"Q"):
                return True
        return False


@click.command(epilog=EXAMPLES)
@pid_option
@click.option("--window", type=click.FloatRange(1, 3600), default=10.0, show_default=True,
              help="Seconds of history the rates and percentiles cover.")
@click.option("--interval", type=click.FloatRange(0.2, 60), default=1.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--no-usdt", is_flag=True, help="Do not attach the server's inferprobe USDT probes.")
@click.option("--locks", is_flag=True,
              help="Also trace futex waits and show the share of requests whose mutex.wait.ratio "
              "is above --mutex-threshold (the cost is record --locks': docs/locks.md).")
@click.option("--mutex-threshold", type=click.FloatRange(0, 1), default=DEFAULT_MUTEX_THRESHOLD,
              show_default=True, help="With --locks: the mutex.wait.ratio above which a request is flagged.")
@engine_metrics_options
@btf_option
def top(pids, window, interval, no_usdt, locks, mutex_threshold, engine_metrics_url, no_engine_metrics,
        btf) -> None:
    """Live view of a running server: requests/s, in-flight, TTFT/ITL/E2E percentiles.

    Attaches like `record` (no change to the server) and shows the last
    --window seconds, refreshed every --interval. q or Ctrl-C detach.
    """
    from inferprobe.collector.attach.live_symbols import LiveSymbols
    from inferprobe.collector.attach.loader import load_tracer
    from inferprobe.collector.attach.session import TARGETS_EXITED, Session

    apply_btf(btf)
    pids = list(dict.fromkeys(pids))
    sets = ("sockets",) + (() if no_usdt else ("usdt",)) + (("locks",) if locks else ())
    engine = engine_metrics_source(pids, engine_metrics_url, no_engine_metrics)
    tracer = load_tracer(pids, sets=sets, ringbuf_pages=1024)
    lock_waits = None
    if "locks" in tracer.active:
        lock_waits = LiveLocks(WaitClassifier(LiveSymbols(tracer.table("lock_stacks"))), mutex_threshold)
    elif locks:
        click.echo(f"inferprobe: lock waits not traced: {tracer.inactive.get('locks')}", err=True)
    model = LiveWindow(window_s=window, lock_waits=lock_waits)

    def sink(chunk: bytes) -> None:
        decoded, _undecodable = decode_all(iter_ring_records(chunk))
        for ev in decoded:
            model.feed(ev)

    session = None
    scraper = None
    try:
        if engine is not None:
            scraper = Scraper(engine[0])
            scraper.start()
        session = Session(tracer, sink, watch_pids=pids)
        on_tty = sys.stdout.isatty()
        if not on_tty:
            click.echo(f"inferprobe: attached to {', '.join(map(str, tracer.pids))}")

        with _Keys() as keys, contextlib.ExitStack() as stack:
            live = None
            if on_tty:
                live = stack.enter_context(Live(console=Console(), auto_refresh=False, screen=False,
                                                transient=False))

            def each_poll(_now: float) -> None:
                if scraper is not None:
                    for scrape in scraper.take():
                        model.feed_engine(scrape)
                if keys.quit_pressed():
                    session.stop("quit")

            def draw(_now: float) -> None:
                snap = model.snapshot(time.monotonic_ns(), tracer.counters()["events_lost"])
                if live is not None:
                    live.update(dashboard(snap, pids, session.elapsed()), refresh=True)
                else:
                    click.echo(plain_line(snap, session.elapsed()))

            draw(session.started)   # the first frame at once, then every --interval
            session.every(interval, draw)
            if session.run(each_poll) == TARGETS_EXITED:
                click.echo("inferprobe: the target processes exited", err=True)
    finally:
        if scraper is not None:
            scraper.stop()
        tracer.hand_over_on_exit()   # nothing is kept: the prompt need not wait for the detach
        if session is not None:
            session.close()
        else:
            tracer.close()
