"""The shape of one request's trace, as plain data (no OpenTelemetry types).

One root SERVER span over ingress -> end, one child per phase (contiguous,
ingress -> end), a child per lock wait and GPU wait when the request
carries them (the longest, up to a bound), and each token chunk as an
event on the root, up to a bound. Times stay on the kernel's monotonic clock here; otlp.py converts
them to wall-clock when it builds the real spans, so this module is pure
and tested directly.

A target's outbound call attempt (client role) is a CLIENT span instead,
with the server it called as server.address and server.port; a recording
replayed (`inferprobe export`) gives each logical call one CLIENT span
with a child per attempt (call_trace), so a retried call reads as one.

Names and attributes follow the OpenTelemetry GenAI and HTTP semantic
conventions where they name a thing; the rest is under `inferprobe.*`.
Request and response bodies are never known here: the kernel does not
send them, so no prompt, completion or model name can appear.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferprobe.analyzers.client_calls import ClientCall
from inferprobe.analyzers.decompose import phases_ns
from inferprobe.analyzers.llm_apis import llm_api
from inferprobe.analyzers.request_analysis import NONE, RequestAnalysis
from inferprobe.collector.model.recording_meta import RecordingMeta
from inferprobe.collector.model.timeline import Outcome, Request, WaitInterval

DEFAULT_MAX_TOKEN_EVENTS = 256
MAX_WAIT_SPANS = 32  # per kind and request: the longest, then a count on the root
LOCK_WAIT_SPAN = "lock wait"
GPU_WAIT_SPAN = "gpu wait"
GPU_EXECUTION_SPAN = "gpu execution"  # the GPU running the request's work (CUPTI shim), not a CPU wait
TOKEN_EVENT = "inferprobe.token_chunk"
TOKEN_SUMMARY_EVENT = "inferprobe.token_chunks.truncated"

# A span attribute's value, as OpenTelemetry takes it (whose AttributeValue also
# allows sequences of these, which no attribute here uses), without its types.
AttributeValue = str | bool | int | float
Attributes = dict[str, AttributeValue]


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int  # monotonic
    attributes: Attributes = field(default_factory=dict)


@dataclass(slots=True)
class SpanShape:
    name: str
    start_ns: int  # monotonic
    end_ns: int
    kind: str  # "server" or "internal"
    attributes: Attributes = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    children: list[SpanShape] = field(default_factory=list)
    error: bool = False
    # A root's remote parent, the caller's span (W3C trace context): the trace
    # is then the caller's (32 hex digits) and the root a child of that span (16).
    parent: RemoteParent | None = None


@dataclass(frozen=True, slots=True)
class RemoteParent:
    trace_id: str
    span_id: str
    trace_flags: int
    tracestate: str | None = None


def remote_parent(req: Request) -> RemoteParent | None:
    """The caller's span a request's trace joins: from the traceparent it carried
    (for a client, the one it wrote into its own call). None without one."""
    if req.trace_id is None or req.parent_span_id is None:
        return None
    return RemoteParent(req.trace_id, req.parent_span_id, req.trace_flags or 0, req.tracestate)


def process_attributes(req: Request) -> Attributes:
    """Where the process ran (collector/processes/containers.py): OpenTelemetry's container.id and
    k8s.pod.uid, and inferprobe's cgroup and in-namespace pid, where known."""
    p = req.process
    if p is None:
        return {}
    attrs: Attributes = {}
    if p.cgroup is not None:
        attrs["inferprobe.cgroup"] = p.cgroup
    if p.ns_pid is not None:
        attrs["inferprobe.ns_pid"] = p.ns_pid
    if p.container is not None:
        if p.container.container_id is not None:
            attrs["container.id"] = p.container.container_id
        if p.container.pod_uid is not None:
            attrs["k8s.pod.uid"] = p.container.pod_uid
        if p.container.qos_class is not None:
            attrs["inferprobe.k8s.qos_class"] = p.container.qos_class
    return attrs


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What every span of one target shares: where the server listens."""

    address: str | None = None
    port: int | None = None


def operation_name(path: str | None) -> str | None:
    """gen_ai.operation.name for an LLM API's path (analyzers/llm_apis.py); None for other HTTP traffic."""
    api = llm_api(path)
    return api.operation if api is not None else None


def genai_attributes(path: str | None, host: str | None = None) -> Attributes:
    """gen_ai.operation.name, gen_ai.provider.name where the path or host is one provider's,
    and cloud.region where the host names it (Bedrock's, Vertex's endpoints)."""
    api = llm_api(path, host)
    if api is None:
        return {}
    attrs: Attributes = {"gen_ai.operation.name": api.operation}
    if api.provider is not None:
        attrs["gen_ai.provider.name"] = api.provider
    if api.region is not None:
        attrs["cloud.region"] = api.region
    return attrs


def last_seen_ns(req: Request) -> int:
    """The end of a request, or the last thing seen of it when it never ended."""
    if req.t_end_ns is not None:
        return req.t_end_ns
    candidates = [req.t_ingress_ns, req.t_response_start_ns or 0, req.t_done_ns or 0]
    if req.token_ns:
        candidates.append(req.token_ns[-1])
    return max(candidates)


def phases(req: Request) -> list[tuple[str, int, int, Attributes]]:
    """(name, start, end, attributes) per phase, contiguous from ingress to the end.

    The phases are analyzers/decompose.py's: split by the server's USDT
    probes when it has them, by the socket alone otherwise (docs/report-json.md).
    """
    source = "server" if req.server is not None else "socket"
    out: list[tuple[str, int, int, Attributes]] = []
    t = req.t_ingress_ns
    for name, duration in phases_ns(req).items():
        out.append((name, t, t + duration, {"inferprobe.phase": name, "inferprobe.phase.source": source}))
        t += duration
    end = last_seen_ns(req)
    if end > t:
        # an unfinished request: what came after the last boundary we know of
        out.append(("unfinished", t, end, {"inferprobe.phase": "unfinished",
                                            "inferprobe.phase.source": source}))
    return out


def output_tokens(req: Request) -> int | None:
    """The server's count (USDT) or the stream's stated one; never guessed from chunks."""
    return req.output_token_count


def error_type(req: Request) -> str | None:
    if req.outcome == Outcome.ABORTED:
        return "aborted"
    if req.status is not None and req.status >= 500:
        return str(req.status)
    if req.grpc_status:  # a gRPC call that failed says so in its trailers, under HTTP 200
        return f"grpc {req.grpc_status}"
    return None


def rpc_attributes(req: Request) -> Attributes:
    """An HTTP/2 request's protocol and, for gRPC, its service and method (OTel RPC conventions)."""
    if req.protocol != "h2":
        return {}
    attrs: Attributes = {"network.protocol.name": "http", "network.protocol.version": "2"}
    if req.rpc_service is not None and req.rpc_method is not None:
        attrs.update({"rpc.system": "grpc", "rpc.service": req.rpc_service, "rpc.method": req.rpc_method})
        if req.grpc_status is not None:
            attrs["rpc.grpc.status_code"] = req.grpc_status
    return attrs


def root_attributes(req: Request, server: ServerInfo, analysis: RequestAnalysis = NONE) -> Attributes:
    attrs: Attributes = genai_attributes(req.path, req.host)
    if attrs:
        attrs["gen_ai.request.stream"] = req.streaming
        if req.ttft_ns is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = req.ttft_ns / 1e9
        tokens = output_tokens(req)
        if tokens is not None:
            attrs["gen_ai.usage.output_tokens"] = tokens
        if req.input_tokens is not None:
            attrs["gen_ai.usage.input_tokens"] = req.input_tokens
        if req.model is not None:
            attrs["gen_ai.request.model"] = req.model
    if req.role == "client":
        attrs.update(peer_attributes(req.peer))
        if analysis.client is not None:
            attrs["inferprobe.call"] = analysis.client.call
            attrs["inferprobe.attempt"] = analysis.client.number
    else:
        if server.address:
            attrs["server.address"] = server.address
        if server.port:
            attrs["server.port"] = server.port
    if req.method:
        attrs["http.request.method"] = req.method
    if req.path:
        attrs["url.path"] = req.path
    if req.status is not None:
        attrs["http.response.status_code"] = req.status
    attrs.update(rpc_attributes(req))
    err = error_type(req)
    if err is not None:
        attrs["error.type"] = err
    if analysis.mutex_wait_ratio is not None:
        attrs["mutex.wait.ratio"] = float(analysis.mutex_wait_ratio)
    attrs.update({
        "inferprobe.outcome": req.outcome.value,
        "inferprobe.pid": req.pid,
        "inferprobe.tid": req.tid,
        "inferprobe.conn_id": req.conn,
        "inferprobe.bytes_in": req.bytes_in,
        "inferprobe.bytes_out": req.bytes_out,
        "inferprobe.token_chunks": len(req.token_ns),
        "inferprobe.sse_events": sum(req.token_events),
        **process_attributes(req),
    })
    if req.end_reason:
        attrs["inferprobe.end_reason"] = req.end_reason
    if req.server is not None:
        attrs["inferprobe.usdt_request_id"] = int(req.server.req_id)
        attrs["inferprobe.correlated_by"] = req.correlated_by or ""
    return attrs


def token_events(req: Request, bound: int) -> list[SpanEvent]:
    events = [
        SpanEvent(TOKEN_EVENT, t, {"inferprobe.token_chunk.index": i,
                                   "inferprobe.token_chunk.sse_events": n})
        for i, (t, n) in enumerate(zip(req.token_ns[:bound], req.token_events[:bound], strict=False))
    ]
    if len(req.token_ns) > bound:
        events.append(SpanEvent(TOKEN_SUMMARY_EVENT, req.token_ns[-1], {
            "inferprobe.token_chunks.total": len(req.token_ns),
            "inferprobe.token_chunks.not_shown": len(req.token_ns) - bound,
        }))
    return events


def wait_spans(name: str, intervals: Sequence[WaitInterval] | None,
               bound: int) -> tuple[list[SpanShape], int]:
    """The longest `bound` waits as child spans, in time order, and how many were left out."""
    if not intervals:
        return [], 0
    longest = sorted(intervals, key=lambda w: (w.start_ns - w.end_ns, w.start_ns))[:bound]
    attr = {GPU_WAIT_SPAN: "inferprobe.cuda.function",
            GPU_EXECUTION_SPAN: "inferprobe.gpu.what"}.get(name, "inferprobe.futex.address")
    spans = [SpanShape(name=name, start_ns=w.start_ns, end_ns=w.end_ns, kind="internal",
                       attributes={"inferprobe.wait.kind": w.kind, attr: w.what})
             for w in sorted(longest)]
    return spans, len(intervals) - len(longest)


def peer_attributes(peer: str | None) -> Attributes:
    """server.address and server.port of the server a client called ("addr:port")."""
    if not peer:
        return {}
    address, _, port = peer.rpartition(":")
    if not port.isdigit():
        return {"server.address": peer}
    return {"server.address": address, "server.port": int(port)}


def root_name(req: Request) -> str:
    op = operation_name(req.path)
    if op is not None:
        return op
    if req.rpc_service is not None and req.rpc_method is not None:
        return f"{req.rpc_service}/{req.rpc_method}"  # the RPC conventions' span name
    return f"{req.method or 'HTTP'} {req.path or '/'}"


def request_trace(req: Request, server: ServerInfo | None = None,
                  max_token_events: int = DEFAULT_MAX_TOKEN_EVENTS,
                  max_wait_spans: int = MAX_WAIT_SPANS, analysis: RequestAnalysis = NONE) -> SpanShape:
    """analysis: what the report model found about this request (recordings); none live."""
    server = server or ServerInfo()
    end = last_seen_ns(req)
    root = SpanShape(
        name=root_name(req),
        start_ns=req.t_ingress_ns,
        end_ns=end,
        kind="client" if req.role == "client" else "server",
        attributes=root_attributes(req, server, analysis),
        events=token_events(req, max_token_events),
        error=error_type(req) is not None,
        parent=remote_parent(req),
    )
    root.children = [SpanShape(name=name, start_ns=s, end_ns=e, kind="internal", attributes=attrs)
                     for name, s, e, attrs in phases(req)]
    # Lock and GPU waits (recordings only: the report model's analysis has them), after the phases
    for name, intervals, key in ((LOCK_WAIT_SPAN, analysis.lock_waits, "lock_waits"),
                                 (GPU_WAIT_SPAN, analysis.gpu_waits, "gpu_waits"),
                                 (GPU_EXECUTION_SPAN, analysis.gpu_execution, "gpu_execution")):
        spans, left_out = wait_spans(name, intervals, max_wait_spans)
        root.children += spans
        if intervals is not None:
            root.attributes[f"inferprobe.{key}"] = len(intervals)
        if left_out:
            root.attributes[f"inferprobe.{key}.not_shown"] = left_out
    if analysis.gpu_busy_ns is not None and analysis.gpu_idle_ns is not None:
        root.attributes["inferprobe.gpu.busy_s"] = analysis.gpu_busy_ns / 1e9
        root.attributes["inferprobe.gpu.idle_s"] = analysis.gpu_idle_ns / 1e9
    return root


def call_trace(call: ClientCall, analyses: Sequence[RequestAnalysis],
               max_token_events: int = DEFAULT_MAX_TOKEN_EVENTS) -> SpanShape:
    """One logical outbound call: a CLIENT span from its first attempt's start (its
    connect, where it opened one) to its last attempt's end, with each attempt's
    trace as a child. analyses: one per attempt, in order."""
    first, last = call.attempts[0].request, call.attempts[-1].request
    attrs: Attributes = {"inferprobe.call": call.id, "inferprobe.attempts": len(call.attempts),
                         **peer_attributes(first.peer)}
    attrs.update(genai_attributes(first.path, first.host))
    if first.model is not None:
        attrs["gen_ai.request.model"] = first.model
    err = error_type(last)
    if err is not None:
        attrs["error.type"] = err
    root = SpanShape(name=root_name(first), start_ns=call.t_start_ns, end_ns=call.t_end_ns, kind="client",
                     attributes={**attrs, **process_attributes(first)}, error=err is not None,
                     parent=remote_parent(first))
    root.children = [request_trace(a.request, None, max_token_events, analysis=an)
                     for a, an in zip(call.attempts, analyses, strict=True)]
    return root


def server_info(meta: Mapping[str, Any]) -> ServerInfo:
    """The one TCP listener the recorder saw; none when there were several or none."""
    tcp = [entry.split(" ", 1)[1].rpartition(":") for entry in RecordingMeta.of(meta).listening
           if entry.startswith("tcp")]
    ports = {int(port) for _host, _, port in tcp}
    hosts = {host.strip("[]") for host, _, _port in tcp}
    if len(ports) != 1:
        return ServerInfo()
    # one port on 0.0.0.0 and :: is still one server; its address is then unknown
    return ServerInfo(address=hosts.pop() if len(hosts) == 1 else None, port=ports.pop())
