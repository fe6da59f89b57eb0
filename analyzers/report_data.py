"""Everything `report` shows, computed once from a recording.

Outputs (terminal, JSON) only read a ReportData; they compute nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferprobe.analyzers import locks as lock_analysis
from inferprobe.analyzers import locks_json as lock_analysis_json
from inferprobe.analyzers import network as network_analysis
from inferprobe.analyzers import no_requests, verdict
from inferprobe.analyzers.breakdown import Breakdown, break_down
from inferprobe.analyzers.cadence import CadenceSummary, by_endpoint, by_model, percentile, summarize
from inferprobe.analyzers.decompose import TTFT_PHASES, phases_ns
from inferprobe.analyzers.findings import Finding, FindingList
from inferprobe.analyzers.gpu import GpuSummary, gpu_json, summarize_gpu
from inferprobe.analyzers.itl_phases import gaps_at_percentiles, itl_phases_ns
from inferprobe.analyzers.registry import ANALYZERS
from inferprobe.analyzers.scheduler import SchedulerSummary, stall_ns_by_request, summarize_scheduler
from inferprobe.analyzers.sections import AnalysisInput, AnalyzerSection
from inferprobe.analyzers.timeseries import TimeSeries, over_time
from inferprobe.collector.events import GpuRecord, UsdtRecord
from inferprobe.collector.ingest import ingest
from inferprobe.collector.recording import Recording
from inferprobe.collector.server_view import ServerView
from inferprobe.collector.timeline import Connection, Request, SessionStats

JSON_FORMAT_VERSION = 1
DECOMPOSITION_PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class ReportData:
    recording: Recording
    requests: list[Request]
    overall: CadenceSummary
    endpoints: dict[str, CadenceSummary]
    session: SessionStats
    connections: list[Connection]
    undecodable_events: int
    server: ServerView
    scheduler: SchedulerSummary
    correlated: int  # requests tied to the server's own (USDT) view of them
    stall_ns: dict[tuple[int, int], int]  # (pid, req_id) -> time spent in stalled batches
    decomposition: dict[int, Request]  # percentile -> the request at that TTFT percentile
    network: list[network_analysis.ConnectionNetwork]  # per connection, from the network set
    # the HTML/Markdown report (reports/): phase split drawn, series, analyzer sections, verdict
    breakdown: Breakdown | None = None
    series: TimeSeries | None = None
    sections: list[AnalyzerSection] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # ranked, largest share first
    locks: lock_analysis.LockAnalysis | None = None
    gpu: GpuSummary | None = None  # None without the gpu probe set
    models: dict[str, CadenceSummary] = field(default_factory=dict)  # by the request body's "model"
    no_requests: str | None = None  # why the recording holds no request (analyzers/no_requests.py)

    @property
    def probe_sets(self) -> dict:
        sets = self.recording.meta.get("probe_sets", {})
        if isinstance(sets, list):  # recordings from before probe sets had reasons
            return {"active": {name: "" for name in sets}, "inactive": {}}
        return sets

    @property
    def lost_events(self) -> int:
        return self.recording.lost_events


def build(recording: Recording, mutex_threshold: float = lock_analysis.DEFAULT_MUTEX_THRESHOLD) -> ReportData:
    ingested = ingest(recording.events)
    decoded, requests, server = ingested.events, ingested.requests, ingested.server
    usdt = [ev for ev in decoded if isinstance(ev, UsdtRecord)]
    scheduler = summarize_scheduler(server)
    locks = lock_analysis.analyze(requests, decoded, recording.snapshots.get("locks"), mutex_threshold,
                                  steps=server.steps)
    for r in requests:  # exporters read it from the request (span attribute, metric)
        span = locks.of(r)
        r.mutex_wait_ratio = span.ratio if span is not None else None
        if locks.enabled:  # trace spans (exporters/spans.py) draw each wait
            r.lock_wait_intervals = list(span.lock_waits) if span is not None else []
    network = network_analysis.analyze(decoded, list(ingested.connections.values()),
                                       recording.snapshots.get("network"))
    final = recording.final or {}
    gpu = summarize_gpu(
        [ev for ev in decoded if isinstance(ev, GpuRecord)], recording.snapshots.get("gpu"), requests,
        server.steps, int(final["duration_s"] * 1e9) if "duration_s" in final else None,
        recording.meta.get("probe_sets", {}).get("active", {}).get("gpu")
        if isinstance(recording.meta.get("probe_sets"), dict) else None)
    for attributed in gpu.requests if gpu is not None else ():
        requests[attributed.index].gpu_wait_intervals = list(attributed.wait_intervals)
    breakdown = break_down(requests)
    series = over_time(requests, usdt, recording.meta.get("started_monotonic_ns"))
    active_sets = recording.meta.get("probe_sets", {}).get("active", {})
    findings = FindingList(verdict.core_findings(requests, breakdown, series, active_sets))
    sections = []
    inp = AnalysisInput(recording=recording, requests=requests, events=decoded, locks=locks,
                        network=network, gpu=gpu)
    for analyze in ANALYZERS:
        result = analyze(inp)
        if result is not None:
            if result.section is not None:
                sections.append(result.section)
            findings.extend(result.findings)
    return ReportData(
        recording=recording,
        requests=requests,
        overall=summarize(requests),
        endpoints={ep: summarize(reqs) for ep, reqs in by_endpoint(requests).items()},
        models={m: summarize(reqs) for m, reqs in by_model(requests).items()},
        no_requests=no_requests.explain(recording, requests, list(ingested.connections.values())),
        session=ingested.session,
        connections=sorted(ingested.connections.values(), key=lambda c: c.conn_id),
        undecodable_events=ingested.undecodable,
        server=server,
        scheduler=scheduler,
        correlated=ingested.correlated,
        stall_ns=stall_ns_by_request(scheduler.stalls),
        decomposition=requests_at_ttft_percentiles(requests),
        network=network,
        breakdown=breakdown,
        series=series,
        sections=sections,
        findings=findings.ranked(),
        locks=locks,
        gpu=gpu,
    )


def requests_at_ttft_percentiles(requests: list[Request]) -> dict[int, Request]:
    """The request whose TTFT is the p50 (p90, p99) one: the rows of the
    latency decomposition. Nearest rank, like every percentile here."""
    with_ttft = sorted((r for r in requests if r.ttft_ns is not None), key=lambda r: r.ttft_ns)
    if not with_ttft:
        return {}
    out = {}
    for q in DECOMPOSITION_PERCENTILES:
        target = percentile([r.ttft_ns for r in with_ttft], q)
        out[q] = next(r for r in with_ttft if r.ttft_ns == target)
    return out


def server_json(r: Request, stall_ns: dict[tuple[int, int], int]) -> dict:
    """The USDT fields of one request; null when the server has no probes."""
    s = r.server
    if s is None:
        return {"usdt_request_id": None, "correlated_by": None, "prompt_tokens": None,
                "output_tokens": None, "server_status": None, "decode_steps": None,
                "batch_size_p50": None, "batch_stall_ns": None}
    return {
        "usdt_request_id": s.req_id,
        "correlated_by": r.correlated_by,
        "prompt_tokens": s.prompt_tokens,
        "output_tokens": s.output_tokens,
        "server_status": s.status,
        "decode_steps": len(s.steps),
        "batch_size_p50": percentile([st.batch_size for st in s.steps], 50),
        "batch_stall_ns": stall_ns.get((s.pid, s.req_id), 0),
    }


def request_json(r: Request, stall_ns: dict[tuple[int, int], int] | None = None,
                 locks: lock_analysis.LockAnalysis | None = None) -> dict:
    """One request in the documented JSON shape (docs/report-json.md)."""
    return {
        **lock_analysis_json.request_fields(r, locks),
        "pid": r.pid,
        "tid": r.tid,
        "conn": r.conn,
        "method": r.method,
        "path": r.path,
        "status": r.status,
        "outcome": r.outcome.value,
        "streaming": r.streaming,
        "stream_format": r.stream_format,
        "model": r.model,
        "usage": ({"output_tokens": r.output_tokens, "input_tokens": r.input_tokens}
                  if r.output_tokens is not None or r.input_tokens is not None else None),
        "tpot_ns": r.tpot_ns,
        "stream_events": [[e.t_ns, e.name, e.count] for e in r.stream_events],
        "t_ingress_ns": r.t_ingress_ns,
        "t_response_start_ns": r.t_response_start_ns,
        "t_first_token_ns": r.t_first_token_ns,
        "token_ns": list(r.token_ns),
        "token_chunk_events": list(r.token_events),
        "t_done_ns": r.t_done_ns,
        "t_end_ns": r.t_end_ns,
        "ttft_ns": r.ttft_ns,
        "e2e_ns": r.e2e_ns,
        "bytes_in": r.bytes_in,
        "bytes_out": r.bytes_out,
        "phases_ns": phases_ns(r),
        "itl_phases_ns": itl_phases_ns(r),
        **server_json(r, stall_ns or {}),
    }


def series_json(points: list[tuple[int, float]], peak: float | None) -> dict:
    return {"max": peak, "points": [[t, v] for t, v in points]}


def scheduler_json(data: ReportData) -> dict:
    sched = data.scheduler
    return {
        "probes_seen": sorted(data.server.probes_seen),
        "requests_announced": len(data.server.requests),
        "requests_correlated": data.correlated,
        "decode_steps": sched.steps,
        "batch_size": sched.batch_size.as_dict(),
        "scheduler_queue_length": series_json(sched.queue_length, sched.queue_length_max),
        "token_occupancy_ratio": series_json(sched.occupancy, sched.occupancy_max),
        "batch_stall_duration_ns": sched.stall_ns.as_dict(),
    }


def decomposition_json(data: ReportData) -> dict:
    out = {}
    for q, r in data.decomposition.items():
        phases = phases_ns(r)
        out[f"p{q}"] = {
            "ttft_ns": r.ttft_ns,
            "e2e_ns": r.e2e_ns,
            "t_ingress_ns": r.t_ingress_ns,
            "conn": r.conn,
            "ttft_phases_ns": {k: v for k, v in phases.items() if k in TTFT_PHASES},
        }
    return out


def itl_split_json(requests: list[Request]) -> dict | None:
    """The gap at p50/p90/p99 of all split inter-token gaps, with its phases; null when none split."""
    at = gaps_at_percentiles(requests, DECOMPOSITION_PERCENTILES)
    return {f"p{q}": {"itl_ns": gap, "phases_ns": split} for q, (gap, split) in at.items()} or None


def finding_json(f: Finding) -> dict:
    return {"kind": f.kind, "share": f.share, "of": f.of, "sentence": f.sentence,
            "recommendation": f.recommendation, "evidence": f.evidence, "source": f.source}


def summary_json(s: CadenceSummary) -> dict:
    return {
        "requests": s.requests,
        "outcomes": s.outcomes,
        "errors": s.errors,
        "ttft_ns": s.ttft_ns.as_dict(),
        "itl_ns": s.itl_ns.as_dict(),
        "e2e_ns": s.e2e_ns.as_dict(),
        "tokens_per_request": s.tokens_per_request.as_dict(),
        "tpot_ns": s.tpot_ns.as_dict(),
        "output_tokens": s.output_tokens.as_dict(),
    }


def to_json(data: ReportData) -> dict:
    rec = data.recording
    return {
        "format_version": JSON_FORMAT_VERSION,
        "lost_events": data.lost_events,
        "recording": {
            "path": str(rec.path),
            "complete": rec.complete,
            "problem": rec.problem,
            "meta": rec.meta,
            "final": rec.final,
            "events": len(rec.events),
            "undecodable_events": data.undecodable_events,
        },
        "summary": summary_json(data.overall),
        "no_requests": data.no_requests,
        "endpoints": {ep: summary_json(s) for ep, s in data.endpoints.items()},
        "models": {m: summary_json(s) for m, s in data.models.items()},
        "probe_sets": data.probe_sets,
        "latency_decomposition": decomposition_json(data),
        "itl_phase_split": itl_split_json(data.requests),
        "findings": [finding_json(f) for f in data.findings],
        "scheduler": scheduler_json(data) if not data.server.empty else None,
        "gpu": gpu_json(data.gpu) if data.gpu is not None else None,
        "requests": [request_json(r, data.stall_ns, data.locks) for r in data.requests],
        **lock_analysis_json.top_level(data.locks),
        "connections": [connection_json(c) for c in data.connections],
        "network": network_analysis.network_json(
            data.network, data.recording.snapshots.get("network"),
            "network" in data.probe_sets.get("active", {})),
    }


def connection_json(c: Connection) -> dict:
    return {
        "conn_id": c.conn_id,
        "pid": c.pid,
        "fd": c.fd,
        "family": c.family,
        "peer": c.peer,
        "peer_port": c.peer_port,
        "t_open_ns": c.t_open_ns,
        "t_close_ns": c.t_close_ns,
    }
