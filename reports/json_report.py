"""`report --format json`: the report model in the documented shape (docs/report-json.md).

Reads the model (analyzers/report_data.py) and computes nothing: every value
here was found there. The lock, GPU and network parts have modules of their own.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferprobe.analyzers.breakdown import ItlBreakdown
from inferprobe.analyzers.by_container import CgroupGroup
from inferprobe.analyzers.cadence import CadenceSummary
from inferprobe.analyzers.client_calls import Attempt, ClientCall
from inferprobe.analyzers.engine_metrics import EngineMetricsSummary
from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.llm_apis import llm_api
from inferprobe.analyzers.locks import LockAnalysis
from inferprobe.analyzers.report_data import ReportData
from inferprobe.analyzers.request_analysis import RequestAnalysis
from inferprobe.collector.model.timeline import Connection, Request
from inferprobe.reports import json_locks
from inferprobe.reports.json_batching import batching_json
from inferprobe.reports.json_gpu import gpu_json
from inferprobe.reports.json_network import network_json
from inferprobe.reports.json_stacks import stacks_json

JSON_FORMAT_VERSION = 1


def server_json(r: Request, analysis: RequestAnalysis, stall_ns: dict[tuple[int, int], int]) -> dict:
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
        "batch_size_p50": analysis.batch_size_p50,
        "batch_stall_ns": stall_ns.get((s.pid, s.req_id), 0),
    }


def request_json(r: Request, analysis: RequestAnalysis, stall_ns: dict[tuple[int, int], int] | None = None,
                 locks: LockAnalysis | None = None) -> dict:
    """One request in the documented JSON shape (docs/report-json.md)."""
    return {
        **json_locks.request_fields(r, locks),
        "pid": r.pid,
        "tid": r.tid,
        "conn": r.conn,
        "method": r.method,
        "path": r.path,
        "status": r.status,
        "outcome": r.outcome.value,
        "streaming": r.streaming,
        "stream_format": r.stream_format,
        "stream_error": r.stream_error,
        "model": r.model,
        "usage": ({"output_tokens": r.output_tokens, "input_tokens": r.input_tokens}
                  if r.output_tokens is not None or r.input_tokens is not None else None),
        "tpot_ns": r.tpot_ns,
        "stream_events": [[e.t_ns, e.name, e.count] for e in r.stream_events],
        "t_ingress_ns": r.t_ingress_ns,
        "t_response_start_ns": r.t_response_start_ns,
        "t_first_token_ns": r.t_first_token_ns,
        "t_first_token_wire_ns": r.t_first_token_wire_ns,
        "transport": r.transport,
        "role": r.role,
        "peer": r.peer,
        "protocol": r.protocol,
        "h2_stream": r.h2_stream,
        "rpc": ({"system": "grpc", "service": r.rpc_service, "method": r.rpc_method,
                 "grpc_status": r.grpc_status} if r.rpc_service is not None else None),
        **trace_context_fields(r),
        **process_fields(r),
        **client_fields(analysis.client),
        "token_ns": list(r.token_ns),
        "token_chunk_events": list(r.token_events),
        "t_done_ns": r.t_done_ns,
        "t_end_ns": r.t_end_ns,
        "ttft_ns": r.ttft_ns,
        "e2e_ns": r.e2e_ns,
        "bytes_in": r.bytes_in,
        "bytes_out": r.bytes_out,
        "phases_ns": analysis.phases_ns,
        "itl_phases_ns": analysis.itl_phases_ns,
        **server_json(r, analysis, stall_ns or {}),
    }


def trace_context_fields(r: Request) -> dict:
    """The caller's W3C trace context (docs/trace-context.md); None where the request had no valid one."""
    return {"trace_id": r.trace_id, "parent_span_id": r.parent_span_id, "trace_flags": r.trace_flags,
            "tracestate": r.tracestate}


def process_fields(r: Request) -> dict:
    """Where the request's process ran (docs/containers.md); None where it was not read."""
    p = r.process
    c = p.container if p is not None else None
    return {"ns_pid": p.ns_pid if p else None, "cgroup": p.cgroup if p else None,
            "container_id": c.container_id if c else None, "pod_uid": c.pod_uid if c else None,
            "qos_class": c.qos_class if c else None}


def cgroup_json(g: CgroupGroup) -> dict:
    c = g.container
    return {"cgroup": g.cgroup, "container_id": c.container_id if c else None,
            "runtime": c.runtime if c else None, "pod_uid": c.pod_uid if c else None,
            "qos_class": c.qos_class if c else None, "pids": g.pids,
            "ns_pids": {str(pid): ns for pid, ns in g.ns_pids.items()},
            "summary": summary_json(g.summary) if g.summary is not None else None}


def client_fields(attempt: Attempt | None) -> dict:
    """An outbound call's attempt (docs/report-json.md, "Client role"); null for served requests."""
    if attempt is None:
        return {"call": None, "attempt": None, "grouped_by": None, "retry_count": None,
                "connection_reused": None, "connection_opened_ahead": None,
                "t_connect_start_ns": None, "t_connect_end_ns": None,
                "t_tls_done_ns": None}
    return {
        "call": attempt.call,
        "attempt": attempt.number,
        "grouped_by": attempt.grouped_by,
        "retry_count": attempt.request.retry_count,
        "connection_reused": attempt.reused,
        "connection_opened_ahead": attempt.opened_ahead,
        "t_connect_start_ns": attempt.t_connect_start_ns,
        "t_connect_end_ns": attempt.t_connect_end_ns,
        "t_tls_done_ns": attempt.t_tls_done_ns,
    }


def client_call_json(call: ClientCall) -> dict:
    first = call.attempts[0].request
    api = llm_api(first.path, first.host)
    return {"call": call.id, "peer": call.peer, "host": first.host, "t_start_ns": call.t_start_ns,
            "t_end_ns": call.t_end_ns, "duration_ns": call.duration_ns, "attempts": len(call.attempts),
            "operation": api.operation if api else None, "provider": api.provider if api else None,
            "region": api.region if api else None, "explanation": call.explain()}


def series_json(points: Sequence[tuple[int, float]], peak: float | None) -> dict:
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


def engine_metrics_json(m: EngineMetricsSummary) -> dict:
    """The engine's own gauges, each with the engine's name it was read from."""
    ttft = m.ttft
    return {
        "url": m.url,
        "engine": m.engine,
        "scrapes": m.scrapes,
        "source": "engine_metrics",
        "gauges": {g: {"metric": s.metric, "max": s.peak, "points": [[t, v] for t, v in s.points]}
                   for g, s in m.series.items()},
        "ttft": None if ttft is None else {"metric": ttft.metric, "count": ttft.count,
                                           "p50_s": ttft.quantile(0.5), "p99_s": ttft.quantile(0.99)},
        "scraper": m.stats,
    }


def decomposition_json(data: ReportData) -> dict:
    out = {}
    for q, row in data.decomposition.items():
        r = row.request
        out[f"p{q}"] = {
            "ttft_ns": r.ttft_ns,
            "e2e_ns": r.e2e_ns,
            "t_ingress_ns": r.t_ingress_ns,
            "conn": r.conn,
            "ttft_phases_ns": row.ttft_phases_ns,
        }
    return out


def itl_split_json(itl: Sequence[ItlBreakdown]) -> dict | None:
    """The gap at p50/p90/p99 of all split inter-token gaps, with its phases; null when none split."""
    return {b.label: {"itl_ns": b.itl_ns, "phases_ns": dict(b.phases)} for b in itl} or None


def finding_json(f: Finding) -> dict:
    return {"kind": f.kind, "share": f.share, "of": f.of, "sentence": f.sentence,
            "recommendation": f.recommendation, "evidence": f.evidence, "source": f.source,
            "value": f.value, "figures": dict(f.figures)}


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
            "meta": rec.meta.as_json(),
            "final": rec.final,
            "events": len(rec.events),
            "undecodable_events": data.undecodable_events,
        },
        "summary": summary_json(data.overall),
        "no_requests": data.no_requests,
        "unrecognised_connections": data.unread_connections,
        "local_ipc_connections": data.local_ipc_connections,
        "tls_connections_without_plaintext": data.tls_connections_without_plaintext,
        "self_pair_ends": data.self_pair_ends,
        "endpoints": {ep: summary_json(s) for ep, s in data.endpoints.items()},
        "models": {m: summary_json(s) for m, s in data.models.items()},
        "cgroups": [cgroup_json(g) for g in data.cgroups],
        "trace_context": {"requests": sum(r.trace_id is not None for r in data.requests),
                          "invalid_traceparents": data.session.trace_context_invalid},
        "probe_sets": data.probe_sets,
        "latency_decomposition": decomposition_json(data),
        "itl_phase_split": itl_split_json(data.breakdown.itl if data.breakdown is not None else ()),
        "findings": [finding_json(f) for f in data.findings],
        "scheduler": scheduler_json(data) if not data.server.empty else None,
        "gpu": gpu_json(data.gpu) if data.gpu is not None else None,
        "engine_metrics": None if data.engine_metrics is None else engine_metrics_json(data.engine_metrics),
        "batching": None if data.batching is None else batching_json(data.batching),
        "requests": [request_json(r, analysis, data.stall_ns, data.locks)
                     for r, analysis in zip(data.requests, data.per_request, strict=True)],
        **json_locks.top_level(data.locks),
        "connections": [connection_json(c) for c in data.connections],
        "client_calls": [client_call_json(c) for c in data.client_calls],
        # a traced proxy's connections to its traced backend (analyzers/proxy_hops.py): the
        # backend's requests on them are not in "summary" or "endpoints"
        "proxy_hops": [] if data.proxy_hops is None else [
            {"proxy_pid": t.proxy_pid, "proxy_conn": t.proxy_conn, "backend_pid": t.backend_pid,
             "backend_conn": t.backend_conn, "first_token_held_ns": list(held)}
            for t, held in zip(data.proxy_hops.ties, data.proxy_hops.held_ns, strict=True)],
        "network": network_json(data.network, data.network_findings, data.recording.snapshots.get("network"),
                                "network" in data.probe_sets.get("active", {})),
        "stacks": stacks_json(data.recording),
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
        "role": c.role,
        "t_connect_end_ns": c.t_connect_end_ns,
        "connect_result": c.connect_result,
        "t_tls_done_ns": c.t_tls_done_ns,
        "local_port": c.local_port,
    }
