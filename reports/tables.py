"""The report's tables, shared by the HTML, Markdown and terminal outputs so
that each shows the same numbers formatted the same way."""

from __future__ import annotations

import datetime as dt

from inferprobe.analyzers.breakdown import SOURCE_SOCKETS, SOURCE_USDT
from inferprobe.analyzers.cadence import CadenceSummary, Distribution
from inferprobe.analyzers.report_data import ReportData
from inferprobe.analyzers.units import ms
from inferprobe.collector.model.recording_meta import RecordingMeta
from inferprobe.reports.sections.model import Table


def _dist(name: str, d: Distribution) -> tuple[str, ...]:
    return (name, str(d.count), ms(d.p50), ms(d.p90), ms(d.p99), ms(d.max))


def latency_table(s: CadenceSummary, caption: str) -> Table:
    return Table(
        caption=caption,
        columns=("latency (ms)", "count", "p50", "p90", "p99", "max"),
        rows=(
            _dist("time to first token", s.ttft_ns),
            _dist("inter-token", s.itl_ns),
            _dist("end-to-end", s.e2e_ns),
        ),
    )


def endpoint_table(data: ReportData) -> Table:
    rows = tuple(
        (ep, str(s.requests), str(s.errors), ms(s.ttft_ns.p50), ms(s.ttft_ns.p99),
         ms(s.itl_ns.p50), ms(s.itl_ns.p99), ms(s.e2e_ns.p50), ms(s.e2e_ns.p99))
        for ep, s in data.endpoints.items()
    )
    return Table(caption="Per endpoint (ms)",
                 columns=("endpoint", "requests", "errors", "TTFT p50", "TTFT p99", "ITL p50",
                          "ITL p99", "E2E p50", "E2E p99"),
                 rows=rows)


def model_table(data: ReportData) -> Table | None:
    """Per requested model, where requests named one; TPOT where a count is known."""
    if not data.models:
        return None
    rows = tuple(
        (m, str(s.requests), str(s.errors), ms(s.ttft_ns.p50), ms(s.ttft_ns.p99),
         ms(s.tpot_ns.p50), ms(s.tpot_ns.p99), ms(s.e2e_ns.p50), ms(s.e2e_ns.p99))
        for m, s in data.models.items()
    )
    return Table(caption="Per model (ms; TPOT where the server or the stream stated its token count)",
                 columns=("model", "requests", "errors", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
                          "E2E p50", "E2E p99"),
                 rows=rows)


def cgroup_table(data: ReportData) -> Table | None:
    """Per cgroup (a container is one; docs/containers.md), where the requests ran in more
    than one or in a container: the split a host running several servers needs."""
    groups = data.cgroups
    if len(groups) < 2 and not any(g.container is not None for g in groups):
        return None
    rows = []
    for g in groups:
        c = g.container
        where = (c.container_id[:12] if c is not None and c.container_id else "-")
        pod = (f"{c.pod_uid} ({c.qos_class})" if c is not None and c.pod_uid else "-")
        pids = ", ".join(f"{p} (ns {g.ns_pids[p]})" if p in g.ns_pids else str(p) for p in g.pids)
        s = g.summary
        rows.append((g.cgroup, where, pod, pids, str(s.requests if s else 0), str(s.errors if s else 0),
                     ms(s.ttft_ns.p50) if s else "-", ms(s.ttft_ns.p99) if s else "-",
                     ms(s.e2e_ns.p50) if s else "-", ms(s.e2e_ns.p99) if s else "-"))
    return Table(caption="Per cgroup (ms): where each server process ran, with its pid in its own namespace",
                 columns=("cgroup", "container", "pod (QoS)", "pids", "requests", "errors", "TTFT p50",
                          "TTFT p99", "E2E p50", "E2E p99"),
                 rows=tuple(rows))


def decomposition_source_text(source: str | None) -> str:
    if source == SOURCE_USDT:
        return "Phases from the server's own USDT probes."
    if source == SOURCE_SOCKETS:
        return ("Phases from the socket view only (no USDT phases in this recording): request read, "
                "response headers written, first token chunk written, end. Queueing and prefill "
                "both fall before the first token and are not told apart here.")
    if source == "mixed":
        return ("Phases from the server's USDT probes where a request could be tied to them, from the "
                "socket view otherwise (probes attached mid-run, or requests the server did not report).")
    return "No request had a first token, so there is nothing to split."


def ttft_phase_table(data: ReportData) -> Table | None:
    d = data.breakdown
    if d is None or not d.ttft:
        return None
    names = [n for n in d.phase_names if any(dict(b.phases).get(n) for b in d.ttft)]
    rows = []
    for b in d.ttft:
        cells = [b.label, ms(b.ttft_ns)]
        for n in names:
            cells.append(f"{ms(dict(b.phases).get(n, 0))} ({b.share(n) * 100:.0f} %)")
        cells.append(f"conn {b.request.conn}")
        rows.append(tuple(cells))
    return Table(caption="TTFT by phase, for the requests at p50, p90 and p99 of TTFT (ms, share of TTFT)",
                 columns=("percentile", "TTFT", *names, "request"), rows=tuple(rows))


def itl_phase_table(data: ReportData) -> Table | None:
    d = data.breakdown
    if d is None or not d.itl:
        return None
    rows = tuple((b.label, ms(b.itl_ns),
                  *(f"{ms(ns)} ({b.share(n) * 100:.0f} %)" for n, ns in b.phases)) for b in d.itl)
    return Table(caption="Inter-token latency by phase: the gaps at p50, p90 and p99 of all token gaps "
                         "(ms, share of the gap)",
                 columns=("percentile", "gap", *(n for n, _ in d.itl[0].phases)), rows=rows)


def waterfall_table(data: ReportData) -> Table | None:
    d = data.breakdown
    if d is None or not d.waterfall:
        return None
    names = list(d.phase_names)
    rows = []
    for w in d.waterfall:
        phases = dict(w.phases)
        rows.append((f"conn {w.request.conn}", ms(w.ttft_ns),
                     *(ms(phases.get(n)) if n in phases else "-" for n in names),
                     str(len(w.token_offsets_ns)), w.outcome))
    return Table(caption="Slowest requests by TTFT (ms)",
                 columns=("request", "TTFT", *names, "token chunks", "outcome"), rows=tuple(rows))


def _wall_clock(meta: RecordingMeta) -> str:
    if meta.started_wall_ns is None:
        return "-"
    when = dt.datetime.fromtimestamp(meta.started_wall_ns / 1e9, tz=dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def facts_table(data: ReportData) -> Table:
    rec = data.recording
    meta = rec.meta
    final = rec.final or {}
    sets = meta.probe_sets
    active, inactive = sets.active, sets.inactive
    targets = ", ".join(f"{t.comm} (pid {t.pid})" for t in meta.targets)
    duration = final.get("duration_s")
    command = meta.command_line
    loader, loader_version = meta.loader   # bcc's, in recordings made before the move to libbpf
    rows = (
        ("host", _or_dash(meta.host)),
        ("kernel", _or_dash(meta.kernel)),
        (f"{loader} version", _or_dash(loader_version)),
        ("inferprobe version", _or_dash(meta.inferprobe_version)),
        ("target processes", targets or "-"),
        ("started", _wall_clock(meta)),
        ("duration", "-" if duration is None else f"{duration:.1f} s"),
        ("stopped because", str(final.get("end_reason", "-"))),
        ("events in the recording", str(len(rec.events))),
        ("events undecodable", str(data.undecodable_events)),
        ("lost events", str(data.lost_events)),
        ("probe sets active", "; ".join(f"{k}: {v}" for k, v in sorted(active.items())) or "-"),
        ("probe sets off", "; ".join(f"{k}: {v}" for k, v in sorted(inactive.items())) or "none"),
        ("command line", " ".join(command) if isinstance(command, list) else str(command or "-")),
        ("recording file", str(rec.path)),
        ("recording state", "complete" if rec.complete else f"incomplete: {rec.problem}"),
    )
    return Table(caption="Recording facts", columns=("fact", "value"), rows=rows)


def headline_table(data: ReportData) -> Table:
    s = data.overall
    oc = s.outcomes
    return Table(
        caption="At a glance",
        columns=("requests", "TTFT p50 / p99 (ms)", "ITL p50 / p99 (ms)", "E2E p50 / p99 (ms)",
                 "errors", "aborted", "lost events"),
        rows=((str(s.requests), f"{ms(s.ttft_ns.p50)} / {ms(s.ttft_ns.p99)}",
               f"{ms(s.itl_ns.p50)} / {ms(s.itl_ns.p99)}",
               f"{ms(s.e2e_ns.p50)} / {ms(s.e2e_ns.p99)}",
               str(s.errors), str(oc.get("aborted", 0)), str(data.lost_events)),),
    )


def warnings(data: ReportData) -> list[str]:
    out = []
    rec = data.recording
    if rec.problem:
        out.append(f"The recording is {rec.problem}; this report shows what is readable.")
    if data.lost_events:
        out.append(f"{data.lost_events} events were lost (kernel ring buffer full): some requests may be "
                   "missing or cut short; record again with a larger --ringbuf-mb.")
    if data.undecodable_events:
        out.append(f"{data.undecodable_events} events could not be decoded (a newer recording layout?).")
    if data.no_requests:
        out.append(data.no_requests)
    elif data.unread_traffic:
        out.append(data.unread_traffic)
    return out


def notes(data: ReportData) -> list[str]:
    """What the recording left out on purpose, said so that no gap is silent."""
    return [data.local_ipc] if data.local_ipc else []
