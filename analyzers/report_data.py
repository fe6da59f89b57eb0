"""Everything `report` shows, computed once from a recording.

Outputs (terminal, JSON) only read a ReportData; they compute nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferprobe.analyzers import locks as lock_analysis
from inferprobe.analyzers import locks_json as lock_analysis_json
from inferprobe.analyzers.cadence import CadenceSummary, by_endpoint, summarize
from inferprobe.collector.events import ConnRecord, DecodeError, IoRecord, decode
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
    locks: lock_analysis.LockAnalysis | None = None

    @property
    def lost_events(self) -> int:
        return self.recording.lost_events


def build(recording: Recording, mutex_threshold: float = lock_analysis.DEFAULT_MUTEX_THRESHOLD) -> ReportData:
    decoded = []
    bad = 0
    for raw in recording.events:
        try:
            decoded.append(decode(raw))
        except DecodeError:
            bad += 1
    session = sessionize(e for e in decoded if isinstance(e, ConnRecord | IoRecord))
    requests = sorted(session.requests, key=lambda r: r.t_ingress_ns)
    locks = lock_analysis.analyze(requests, decoded, recording.snapshots.get("locks"), mutex_threshold)
    return ReportData(
        recording=recording,
        requests=requests,
        overall=summarize(requests),
        endpoints={ep: summarize(reqs) for ep, reqs in by_endpoint(requests).items()},
        session=session.stats,
        connections=sorted(session.connections.values(), key=lambda c: c.conn_id),
        undecodable_events=bad,
        locks=locks,
    )


def request_json(r: Request, locks: lock_analysis.LockAnalysis | None = None) -> dict:
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
        "requests": [request_json(r, data.locks) for r in data.requests],
        **lock_analysis_json.top_level(data.locks),
        "connections": [connection_json(c) for c in data.connections],
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
