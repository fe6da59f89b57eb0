"""`inferprobe record`: attach to running servers and write a recording."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from inferprobe.cli.engine_options import engine_metrics_options, engine_metrics_source
from inferprobe.cli.export_options import live_export_options
from inferprobe.cli.host_wide_options import host_wide_filters, host_wide_options, listening_now
from inferprobe.cli.options import (
    apply_btf,
    btf_option,
    duration_option,
    optional_pid_option,
)
from inferprobe.cli.stack_options import STACK_FLAGS, stack_options, stack_set_options, stack_sets
from inferprobe.collector.attach import attach_failures
from inferprobe.collector.attach.engine_scrape import Scraper
from inferprobe.collector.errors import TargetProblem
from inferprobe.collector.model.recording import RecordingWriter
from inferprobe.collector.model.recording_meta import RecordingMeta
from inferprobe.collector.processes import targets as target_procs
from inferprobe.collector.processes.containers import ProcessIdentities, any_in_container
from inferprobe.collector.shared_constants import OPT_IN_FLAGS

EXAMPLES = """
\b
Examples:
  sudo inferprobe record -p 1234 -d 30 -o run.ipr    # 30 s of pid 1234
  sudo inferprobe record -p 1234 -p 5678 -o run.ipr  # until Ctrl-C
  sudo inferprobe record -p 1234 -d 30 --profile --offcpu -o run.ipr
  sudo inferprobe record --all -d 60 -o host.ipr     # every HTTP server on the host
  sudo inferprobe record --all --port 8000 --cgroup /kubepods.slice -o pods.ipr
  inferprobe flamegraph run.ipr --kind cpu -o cpu.svg
  inferprobe report run.ipr
"""


def _no_listener_note(meta: RecordingMeta) -> str | None:
    """One line for a target that serves nothing (yet): a batch job, a client, or the wrong pid."""
    hint = meta.serving_ancestor
    pids = ", ".join(str(t.pid) for t in meta.targets)
    if meta.listening:
        if hint and (hint.shared or hint.listens_too):
            whose = (f"only shares its listening socket with PID {hint.pid}, its {hint.relation}"
                     if hint.shared else
                     f"has a listening {hint.relation}, PID {hint.pid} ({', '.join(hint.its_listening)})")
            return (f"pid {pids} {whose}: if it accepts nothing (an engine's worker, such as vLLM's "
                    f"EngineCore), the process that serves HTTP is PID {hint.pid} (record -p {hint.pid})")
        return None
    note = (f"pid {pids} holds no listening socket: its outbound HTTP calls are recorded (client role), "
            "requests it serves appear once it listens; its threads' locks, stacks, GPU calls and "
            "off-CPU time are recorded as usual")
    if hint:
        note += f" (the listening process is PID {hint.pid}, the {hint.relation} of the one you gave)"
    return note


def _startup_line(startup_s: dict[str, float]) -> str:
    """How long attaching took and the stage that takes most: the kernel's verifier."""
    total = sum(startup_s.values())
    if not startup_s:
        return "start-up not timed"
    return f"ready in {total:.1f} s, {startup_s.get('verify', 0.0):.1f} s of it verifying BPF"


@click.command(epilog=EXAMPLES)
@optional_pid_option
@host_wide_options
@duration_option
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default="inferprobe.ipr",
    show_default=True,
    help="Recording file to write.",
)
@click.option(
    "--ringbuf-mb",
    type=click.IntRange(1, 512),
    default=8,
    show_default=True,
    help="Kernel ring buffer size (rounded down to a power of two).",
)
@click.option(
    "--no-listen-check",
    is_flag=True,
    hidden=True,
    help="Accepted for scripts written before targets without a listening socket were allowed.",
)
@click.option(
    "--no-usdt",
    is_flag=True,
    help="Do not attach the server's inferprobe USDT probes even if it has them.",
)
@click.option(
    "--network/--no-network",
    default=False,
    show_default=True,
    help="Also trace segments and TCP state: write -> wire delay per token chunk, Nagle "
    "coalescing, TCP_NODELAY, tcp_info (docs/network.md). Cost: a BPF program on every "
    "packet the host sends or receives; on a syscall-heavy HTTP benchmark it raised server "
    "CPU per request by about 30 points over socket tracing alone (benchmarks/bench_overhead.py).",
)
@click.option(
    "--locks",
    is_flag=True,
    help="Also trace futex waits and off-CPU time (lock contention, mutex.wait.ratio; "
    "docs/locks.md). Cost: about 1 us per futex wait plus 0.5 us per context switch "
    "of the targets; see benchmarks/bench_locks.py.",
)
@click.option(
    "--lock-floor-us",
    type=click.FloatRange(min=0),
    default=10,
    show_default=True,
    help="With --locks: futex waits shorter than this are only counted in the kernel.",
)
@click.option(
    "--gpu/--no-gpu",
    default=None,
    help="CUDA and DRM GPU probes. Default: on when a target maps libcuda or libcudart; "
    "--gpu also watches targets that load CUDA only later.",
)
@click.option(
    "--tls/--no-tls",
    default=None,
    help="Read TLS plaintext at the TLS library (OpenSSL's libssl.so or linked in; docs/tls.md). "
    "Default: on when a target maps one; --tls also watches targets that load one only later.",
)
@click.option(
    "--gpu-launch-run",
    type=click.IntRange(1, 1 << 20),
    default=256,
    show_default=True,
    help="Kernel launches summed in the kernel per event (1: one event per launch).",
)
@engine_metrics_options
@live_export_options
@stack_options
@btf_option
def record(pids, all_hosts, ports, comm, cgroup, duration, output, ringbuf_mb,
           no_listen_check, no_usdt, network, locks, lock_floor_us,
           gpu, tls, gpu_launch_run, engine_metrics_url, no_engine_metrics, btf, otlp, prometheus,
           **flags) -> None:
    """Record every HTTP request the given processes serve.

    Attaches to syscall tracepoints (no change to the server, no restart),
    follows requests on accepted sockets, and writes a recording that
    `inferprobe report` reads. Request and response bodies never leave the
    kernel. Prints one line starting with "inferprobe: attached" once every
    probe is in place; Ctrl-C or SIGTERM stops and still writes a complete
    recording.
    """
    from inferprobe.collector.attach.loader import load_tracer
    from inferprobe.collector.attach.probe_sets.host_wide import host_wide_set
    from inferprobe.collector.attach.session import MAP_COUNT_INTERVAL_S, Session, own_rss_kb, recording_meta
    from inferprobe.exporters.clock import measure_offset
    from inferprobe.exporters.setup import bind_prometheus, start_live_export

    filters = host_wide_filters(pids, all_hosts, ports, comm, cgroup)
    apply_btf(btf)
    # Request metrics split by container where containers are traced (docs/containers.md).
    metrics = bind_prometheus(prometheus, container_label=filters is not None or any_in_container(pids))
    pids = list(dict.fromkeys(pids)) if filters is None else listening_now(filters)
    pages = 1 << ((ringbuf_mb * 256).bit_length() - 1)
    sets = (("sockets",) + (() if tls is False else ("tls",)) + (() if no_usdt else ("usdt",))
            + (("network",) if network else ()))
    if locks:
        sets += ("locks",)
    stack_flags = {k: flags.pop(k) for k in list(flags) if k in STACK_FLAGS}
    otlp_opts = flags
    sets += stack_sets(stack_flags)
    if gpu is not False:
        sets += ("gpu",)
    sets += ("llama",)  # off by itself unless a target has llama.cpp's llama_decode
    if filters is not None:
        sets += ("host_wide",)
    options = {"host_wide": {"filters": filters},
               **stack_set_options(stack_flags), "locks": {"floor_us": lock_floor_us},
               "gpu": "on" if gpu else "auto", "gpu_run_max_launches": gpu_launch_run,
               "tls": "on" if tls else "auto"}
    # Before attaching, so that looking for /metrics is not recorded as the server's traffic.
    engine = engine_metrics_source(pids, engine_metrics_url, no_engine_metrics)
    for attempt in range(3):
        try:
            tracer = load_tracer(pids, sets=sets, ringbuf_pages=pages, options=options)
            break
        except TargetProblem:
            if filters is None or attempt == 2:
                raise
            pids = listening_now(filters)   # with --all, a server that exited since the scan is no error
    # Where each traced process runs (cgroup, pid in its namespace, container): read once each.
    identities = ProcessIdentities()
    identities.note(target_procs.with_descendants(tracer.pids))
    for name, flag in OPT_IN_FLAGS.items():  # so every report can say why they were off
        if name not in sets:
            tracer.inactive.setdefault(name, f"not requested (record {flag})")
    writer = None
    live = None
    scraper = None
    session = None
    try:
        meta = recording_meta(tracer, sys.argv)
        if filters is not None:
            meta["host_wide"] = {"filters": filters.as_dict()}
        if engine is not None:
            meta["engine_metrics"] = {"url": engine[0], "found": engine[1]}
        writer = RecordingWriter(Path(output), meta)
        live = start_live_export(meta, metrics, otlp, otlp_opts, identities)
        sink = writer.add_ring_chunk if live is None else live.tee(writer.add_ring_chunk)
        # Host-wide, the targets come and go: only a recording of given pids ends with them.
        session = Session(tracer, tracer.tap(sink), duration_s=duration,
                          watch_pids=pids if filters is None else None)
        if engine is not None:
            scraper = Scraper(engine[0])
            scraper.start()
        scope = (f"to {len(tracer.pids)} process(es) ({', '.join(map(str, tracer.pids))})" if filters is None
                 else f"host-wide ({len(tracer.pids)} process(es) serving now)")
        click.echo(f"inferprobe: attached {scope} with probe sets {', '.join(tracer.active)}, "
                   f"writing {output} ({_startup_line(tracer.startup_s)})")
        for name, reason in tracer.inactive.items():
            click.echo(f"inferprobe: probe set {name} off: {reason}")
        for line in attach_failures.unsaid_lines(tracer.ctx.attach_failures):
            click.echo(f"inferprobe: {line}")
        if engine is not None:
            click.echo(f"inferprobe: scraping engine metrics at {engine[0]} ({engine[1]})")
        if filters is None and (note := _no_listener_note(RecordingMeta(meta))) is not None:
            click.echo(f"inferprobe: note: {note}")
        sys.stdout.flush()
        status_line = sys.stderr.isatty()
        lost = 0
        next_map_count = session.started + MAP_COUNT_INTERVAL_S

        def each_poll(_now: float) -> None:
            if scraper is not None:
                for scrape in scraper.take():
                    writer.add_engine_scrape(scrape)
                    if live is not None:
                        live.observe_engine(scrape)
            if live is not None:
                live.tick(lost)

        def each_second(now: float) -> None:
            nonlocal lost, next_map_count
            for note in tracer.refresh():
                click.echo(f"inferprobe: {note}")
            for line in attach_failures.unsaid_lines(tracer.ctx.attach_failures):
                click.echo(f"inferprobe: {line}")
            if filters is not None and live is not None and live.metrics is not None:
                live.metrics.set_targets(host_wide_set(tracer).target_names())
            sys.stdout.flush()
            counters = session.counters()
            lost = counters["events_lost"]
            stats = {"t": now - session.started, "lost_events": counters["events_lost"],
                     "clock": measure_offset().as_dict(), "rss_kb": own_rss_kb(), **counters}
            if now >= next_map_count:
                next_map_count = now + MAP_COUNT_INTERVAL_S
                identities.note(target_procs.with_descendants(tracer.pids))  # forked since
                stats["map_entries"] = tracer.map_entries()
            writer.flush(stats=stats)
            if status_line:
                # \x1b[K clears what a longer previous line left behind
                click.echo(
                    f"\r{now - session.started:6.1f}s  requests {counters['requests']}  "
                    f"events {session.reader.events}  lost {counters['events_lost']}\x1b[K",
                    err=True,
                    nl=False,
                )

        session.every(1.0, each_second)
        end_reason = session.run(each_poll)
        if scraper is not None:
            for scrape in scraper.stop():
                writer.add_engine_scrape(scrape)
        map_entries = tracer.map_entries()
        writer.add_snapshot("processes", identities.snapshot())
        for name, data in tracer.snapshots().items():
            writer.add_snapshot(name, data)
        counters = session.counters()
        if status_line:
            click.echo("", err=True)
        final: dict[str, Any] = {  # the recording's closing summary, JSON
            "duration_s": session.elapsed(),
            "end_reason": end_reason,
            "lost_events": counters["events_lost"],
            "events_received": session.reader.events,
            "map_entries": map_entries,
            "h2_header_tables": session.reader.h2_header_tables,
            "rss_kb": own_rss_kb(),
            "attach_failures": tracer.ctx.attach_failures.as_dict(),
            **counters,
        }
        if scraper is not None:
            final["engine_metrics"] = scraper.stats.as_dict()
        if live is not None:
            final["export"] = live.close(counters["events_lost"])
        writer.close(final)
        # The kernel counts every request line it read, ours too: say how many were ours.
        own = f" ({scraper.stats.scrapes} of them our own metric scrapes)" if scraper is not None else ""
        click.echo(
            f"inferprobe: wrote {output}: {counters['requests']} requests{own}, "
            f"{session.reader.events} events, {counters['events_lost']} lost ({end_reason})"
        )
        if live is not None and "otlp" in final["export"]:
            o = final["export"]["otlp"]
            click.echo(f"inferprobe: OTLP: {o['exported']} traces exported, {o['dropped']} dropped")
    finally:
        if scraper is not None:
            scraper.stop()
        if writer is not None and writer.closed:
            tracer.hand_over_on_exit()   # the recording is written: nobody waits for the detach
        if session is not None:
            session.close()
        else:
            tracer.close()
        if metrics is not None:
            metrics.close()
        if writer is not None and not writer.closed:
            # An unexpected error: keep everything received so far readable.
            writer.flush()
