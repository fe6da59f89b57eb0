"""`inferprobe agent`: `record --all` for days, with live export and a ring on disk.

One loop: poll the ring buffer, hand chunks to the current ring segment and
to the live export (OTLP, Prometheus), and every BUDGET_INTERVAL_S measure
what tracing costs and move the connection sampling ratio (collector/
cpu_budget.py). SIGHUP closes the current segment and opens a new one (log
rotation: a moved or deleted file is not written to again); SIGTERM or
SIGINT drains, closes the segment, flushes the exporters and detaches.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import click

from inferprobe.cli.export_options import otlp_options
from inferprobe.cli.host_wide_options import host_wide_filters, host_wide_options, listening_now
from inferprobe.cli.options import apply_btf, btf_option, duration_option
from inferprobe.collector.attach import attach_failures, cpu_budget, heap_trim
from inferprobe.collector.model import segment_ring
from inferprobe.collector.processes import host_wide

EXAMPLES = """
\b
Examples:
  sudo inferprobe agent --prometheus 0.0.0.0:9464 --otlp --otlp-endpoint http://collector:4318/v1/traces
  sudo inferprobe agent --keep 1h --max-cpu 2% --port 8000 --ring /var/lib/inferprobe/ring
  inferprobe report --last 5m --ring /var/lib/inferprobe/ring
"""

BUDGET_INTERVAL_S = 2.0
# The ring segment's buffered events reach the file this often: what a kill -9
# loses is this, plus a poll, plus the kernel-to-agent hand-over (< 1 s in all).
RING_FLUSH_S = 0.5
DEFAULT_RING = "/var/lib/inferprobe/ring"


def _span(_ctx, param, value):
    try:
        return segment_ring.parse_span(value)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint=f"--{param.name}") from None


def _share(_ctx, param, value):
    if value is None:
        return None
    try:
        return cpu_budget.parse_share(value)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--max-cpu") from None


LOAD_ATTEMPTS = 3


def _load(load_tracer, filters, pages: int):
    """The tracer on the servers listening now.

    A uprobe attach that fails for one server costs that server those probes
    only (the probe sets record it in the tracer's attach failures, which the
    loop below says and counts). A server that exits between the scan and the
    load is not one to wait for: the agent scans again."""
    from inferprobe.collector.errors import TargetProblem

    sets: tuple[str, ...] = ("sockets", "tls", "usdt", "host_wide")
    if not host_wide.in_host_pid_namespace():
        sets = ("sockets", "host_wide")
        click.echo("inferprobe: note: not in the host's pid namespace (run the pod with hostPID): "
                   "USDT and TLS uprobes are off, sockets are traced")
    for attempt in range(1, LOAD_ATTEMPTS + 1):
        try:
            return load_tracer(listening_now(filters), sets=sets, ringbuf_pages=pages,
                               options={"host_wide": {"filters": filters}, "tls": "auto"})
        except TargetProblem as err:   # a server listening at the scan exited before the load
            if attempt == LOAD_ATTEMPTS:
                raise
            click.echo(f"inferprobe: {err}; scanning again", err=True)
    raise AssertionError("unreachable")


def _remove_stale_uprobe_events() -> None:
    """The tracefs uprobe events of a tracer killed before it could detach (an agent's
    OOM kill): gone before the load, which re-adopts the same servers."""
    from inferprobe.collector.attach.tracefs_uprobes import remove_stale_events

    removed = remove_stale_events()
    if removed:
        click.echo(f"inferprobe: removed {len(removed)} uprobe event(s) that a tracer gone without "
                   f"detaching left in tracefs ({removed[0].split('/')[0]}, ...)")


def _say_attach_failures(tracer, agent_metrics) -> None:
    """Each failed attach once in the log; their counts by probe set in the metrics."""
    failures = tracer.ctx.attach_failures
    for line in attach_failures.unsaid_lines(failures):
        click.echo(f"inferprobe: {line}")
    if agent_metrics is not None:
        agent_metrics.set_attach_failures(failures.by_set)


@click.command(epilog=EXAMPLES)
@host_wide_options
@click.option("--ring", "ring_dir", type=click.Path(file_okay=False), default=DEFAULT_RING,
              show_default=True, envvar="INFERPROBE_RING",
              help="Directory of the ring of recent recordings (env INFERPROBE_RING).")
@click.option("--keep", default="15m", show_default=True, callback=_span,
              help="How much recent recording the ring keeps (90s, 15m, 2h, 1d).")
@click.option("--segment", default="1m", show_default=True, callback=_span,
              help="Length of one ring segment file; the oldest are deleted whole.")
@click.option("--max-cpu", default=None, callback=_share, metavar="SHARE",
              help="CPU budget for tracing (BPF programs + agent), e.g. 2% (100% = one CPU). Above it, "
              "a sample of new connections is followed in full; the ratio is in the metrics and reports.")
@click.option("--otlp", is_flag=True, help="Export each request as an OTLP trace.")
@otlp_options
@click.option("--prometheus", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics, e.g. 0.0.0.0:9464 in a pod.")
@click.option("--ringbuf-mb", type=click.IntRange(1, 512), default=8, show_default=True,
              help="Kernel ring buffer size (rounded down to a power of two).")
@duration_option
@btf_option
def agent(all_hosts, ports, comm, cgroup, ring_dir, keep, segment, max_cpu, otlp, prometheus, ringbuf_mb,
          duration, btf, **otlp_opts) -> None:
    """Trace every HTTP server on the host, continuously (the DaemonSet's command).

    The always-on form of `record --all` (--all is implied; --port, --comm
    and --cgroup narrow it): exports live over OTLP and Prometheus, keeps
    the last --keep of recordings in --ring for `inferprobe report --last`,
    and holds tracing under --max-cpu by sampling connections.
    """
    from inferprobe.collector.attach.loader import load_tracer
    from inferprobe.collector.attach.probe_sets.host_wide import host_wide_set
    from inferprobe.collector.attach.session import MAP_COUNT_INTERVAL_S, Session, own_rss_kb, recording_meta
    from inferprobe.collector.model.connection_tallies import read_tallies
    from inferprobe.exporters.agent_metrics import AgentMetrics
    from inferprobe.exporters.setup import bind_prometheus, start_live_export
    from inferprobe.exporters.tally_metrics import TallyCollector

    filters = host_wide_filters((), True, ports, comm, cgroup)
    assert filters is not None   # --all is implied
    if segment > keep:
        raise click.BadParameter("a segment cannot be longer than what the ring keeps",
                                 param_hint="--segment")
    apply_btf(btf)
    trim_heap = heap_trim.wanted()
    if trim_heap:
        heap_trim.cap_arenas()   # before the exporter's and the metrics server's threads start
    metrics = bind_prometheus(prometheus)
    agent_metrics = AgentMetrics(metrics) if metrics is not None else None
    tally_metrics = TallyCollector(metrics.registry) if metrics is not None else None
    pages = 1 << ((ringbuf_mb * 256).bit_length() - 1)
    _remove_stale_uprobe_events()
    tracer = _load(load_tracer, filters, pages)
    host = host_wide_set(tracer)
    budget = cpu_budget.CpuBudget(max_cpu)
    ring = session = live = None
    last_sample: dict = {}
    try:
        stats_on = budget.start()
        meta = recording_meta(tracer, sys.argv)
        meta["host_wide"] = {"filters": filters.as_dict()}
        meta["agent"] = {"max_cpu_share": max_cpu, "keep_s": keep, "segment_s": segment,
                         "bpf_stats": stats_on}
        started = time.monotonic()

        def closing_stats() -> dict:
            counters = session.counters() if session is not None else tracer.counters()
            reader = session.reader if session is not None else None
            return {"duration_s": time.monotonic() - started, "lost_events": counters["events_lost"],
                    "events_received": reader.events if reader else 0, "rss_kb": own_rss_kb(),
                    "h2_header_tables": reader.h2_header_tables if reader else 0,
                    "sampling": {**last_sample, **host.counters(tracer.bpf)},
                    "attach_failures": tracer.ctx.attach_failures.as_dict(),
                    "tallies": read_tallies(tracer.bpf).as_dict(), **counters}

        ring = segment_ring.SegmentRing(Path(ring_dir), meta, keep, segment, closing_stats)
        live = start_live_export(meta, metrics, otlp, otlp_opts)

        def to_ring(chunk: bytes) -> None:
            ring.writer.add_ring_chunk(chunk)   # the current segment, whichever it is now

        sink = to_ring if live is None else live.tee(to_ring)
        session = Session(tracer, tracer.tap(sink), duration_s=duration)
        reopen_asked = False

        def reopen(_signum: int) -> None:
            nonlocal reopen_asked
            reopen_asked = True

        session.on_signal(signal.SIGHUP, reopen)
        click.echo(f"inferprobe: attached host-wide ({len(tracer.pids)} process(es) serving now), "
                   f"ring {ring_dir} keeping {keep:g} s, CPU budget "
                   f"{'none' if max_cpu is None else f'{max_cpu:.2%} of a CPU'}"
                   f"{'' if stats_on else ' (BPF run-time statistics refused: agent CPU only)'}")
        _say_attach_failures(tracer, agent_metrics)
        sys.stdout.flush()
        lost = 0

        def each_poll(_now: float) -> None:
            nonlocal reopen_asked
            if live is not None:
                live.tick(lost)
            if reopen_asked or ring.due():
                reopen_asked = False
                ring.rotate(tracer.snapshots())

        def hold_budget(_now: float) -> None:
            nonlocal last_sample
            last_sample = budget.sample().as_dict()
            if max_cpu is not None and last_sample["follow_ratio"] != host.follow_ratio:
                host.set_follow_ratio(tracer.bpf, last_sample["follow_ratio"])
            if tally_metrics is not None:
                tally_metrics.set(read_tallies(tracer.bpf))
            if agent_metrics is not None:
                agent_metrics.update(last_sample, host.counters(tracer.bpf), len(host.target_names()),
                                     ring.bytes_on_disk(), max_cpu)

        next_map_count = started

        def each_second(now: float) -> None:
            nonlocal lost, next_map_count
            for note in tracer.refresh():
                click.echo(f"inferprobe: {note}")
            _say_attach_failures(tracer, agent_metrics)
            sys.stdout.flush()
            if live is not None and live.metrics is not None:
                live.metrics.set_targets(host.target_names())
            stats = closing_stats()
            lost = stats["lost_events"]
            if now >= next_map_count:   # a walk of the keys: every few seconds, as record does
                next_map_count = now + MAP_COUNT_INTERVAL_S
                stats["map_entries"] = tracer.map_entries()
            ring.writer.flush(stats={"t": now - started, **stats})

        session.every(BUDGET_INTERVAL_S, hold_budget)
        session.every(1.0, each_second)
        session.every(RING_FLUSH_S, lambda _now: ring.writer.flush())
        if trim_heap:
            session.every(heap_trim.TRIM_INTERVAL_S, heap_trim.every_interval)
        end_reason = session.run(each_poll)
        final = {**closing_stats(), "end_reason": end_reason, "map_entries": tracer.map_entries()}
        if live is not None:
            final["export"] = live.close(final["lost_events"])
        ring.close(final, tracer.snapshots())
        click.echo(f"inferprobe: agent stopped ({end_reason}): {final['requests']} requests, "
                   f"{final['events_received']} events, {final['lost_events']} lost, "
                   f"{final['attach_failures']['total']} failed attaches, ring {ring_dir}")
    finally:
        budget.close()
        if session is not None:
            session.close()
        else:
            tracer.close()
        if metrics is not None:
            metrics.close()
        if ring is not None and not ring.writer.closed:
            ring.writer.flush()
