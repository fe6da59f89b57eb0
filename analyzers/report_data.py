"""Everything `report` shows, computed once from a recording.

Outputs (terminal, JSON) only read a ReportData; they compute nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferprobe.analyzers import verdict
from inferprobe.analyzers.cadence import CadenceSummary, by_endpoint, summarize
from inferprobe.analyzers.decompose import Decomposition, decompose
from inferprobe.analyzers.findings import Finding, FindingList
from inferprobe.analyzers.registry import ANALYZERS
from inferprobe.analyzers.sections import AnalysisInput, AnalyzerSection
from inferprobe.analyzers.timeseries import TimeSeries, over_time
from inferprobe.collector.events import DecodeError, UsdtRecord, decode
from inferprobe.collector.recording import Recording
from inferprobe.collector.sessionizer import sessionize
from inferprobe.collector.timeline import Connection, Request, SessionStats

JSON_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ReportData:
    recording: Recording
    requests: list[Request]
    overall: CadenceSummary
    endpoints: dict[str, CadenceSummary]
    session: SessionStats
    connections: list[Connection]
    undecodable_events: int
    decomposition: Decomposition | None = None
    series: TimeSeries | None = None
    sections: list[AnalyzerSection] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # ranked, largest share first

    @property
    def lost_events(self) -> int:
        return self.recording.lost_events


def build(recording: Recording) -> ReportData:
    decoded = []
    bad = 0
    for raw in recording.events:
        try:
            decoded.append(decode(raw))
        except DecodeError:
            bad += 1
    usdt = [e for e in decoded if isinstance(e, UsdtRecord)]
    session = sessionize([e for e in decoded if not isinstance(e, UsdtRecord)])
    requests = sorted(session.requests, key=lambda r: r.t_ingress_ns)
    decomposition = decompose(requests)
    series = over_time(requests, usdt, recording.meta.get("started_monotonic_ns"))
    findings = FindingList(verdict.core_findings(requests, decomposition, series))
    sections = []
    inp = AnalysisInput(recording=recording, requests=requests, events=decoded)
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
        session=session.stats,
        connections=sorted(session.connections.values(), key=lambda c: c.conn_id),
        undecodable_events=bad,
        decomposition=decomposition,
        series=series,
        sections=sections,
        findings=findings.ranked(),
    )


def request_json(r: Request) -> dict:
    """One request in the documented JSON shape (docs/report-json.md)."""
    return {
        "pid": r.pid,
        "tid": r.tid,
        "conn": r.conn,
        "method": r.method,
        "path": r.path,
        "status": r.status,
        "outcome": r.outcome.value,
        "streaming": r.streaming,
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
    }


def summary_json(s: CadenceSummary) -> dict:
    return {
        "requests": s.requests,
        "outcomes": s.outcomes,
        "errors": s.errors,
        "ttft_ns": s.ttft_ns.as_dict(),
        "itl_ns": s.itl_ns.as_dict(),
        "e2e_ns": s.e2e_ns.as_dict(),
        "tokens_per_request": s.tokens_per_request.as_dict(),
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
        "endpoints": {ep: summary_json(s) for ep, s in data.endpoints.items()},
        "requests": [request_json(r) for r in data.requests],
        "connections": [connection_json(c) for c in data.connections],
        "findings": [finding_json(f) for f in data.findings],
        "decomposition": decomposition_json(data.decomposition),
    }


def finding_json(f: Finding) -> dict:
    return {"kind": f.kind, "share": f.share, "of": f.of, "sentence": f.sentence,
            "recommendation": f.recommendation, "evidence": f.evidence, "source": f.source}


def decomposition_json(d: Decomposition | None) -> dict | None:
    if d is None:
        return None
    return {
        "source": d.source,
        "phases": list(d.phase_names),
        "ttft": [
            {"label": b.label, "conn": b.request.conn, "t_ingress_ns": b.request.t_ingress_ns,
             "ttft_ns": b.ttft_ns, "phases_ns": dict(b.phases)}
            for b in d.ttft
        ],
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
