"""Request timelines: what the sessionizer builds and every analyzer reads.

No BPF types here; times are the kernel's CLOCK_MONOTONIC in nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from inferprobe.collector.model.process_identity import ProcessIdentity


class Outcome(StrEnum):
    COMPLETE = "complete"  # the response ended as its framing says
    ABORTED = "aborted"  # the connection closed (or broke) before that
    INCOMPLETE = "incomplete"  # still open when the recording ended


class StreamEvent(NamedTuple):
    """SSE events of a response that are not tokens (message_start, ping,
    response.completed): the write that carried them, the first one's name,
    and how many that write carried."""

    t_ns: int
    name: str | None
    count: int  # type: ignore[assignment]  # shadows tuple.count, which nothing calls on it


class WaitInterval(NamedTuple):
    """One wait a serving thread spent in while a request was in flight, clipped to the request."""

    start_ns: int
    end_ns: int
    kind: str  # "lock" or "gil" (locks set); "gpu" (gpu set)
    what: str  # the futex address ("0x7f...") or the CUDA function name


@dataclass(slots=True)
class Request:
    pid: int
    tid: int  # the thread that read the request line
    conn: int
    method: str | None
    path: str | None
    t_ingress_ns: int  # the read that returned the request line completed
    status: int | None = None
    outcome: Outcome = Outcome.INCOMPLETE
    t_response_start_ns: int | None = None  # entry of the write carrying the status line
    token_ns: list[int] = field(default_factory=list)  # entry of each write carrying token events
    token_events: list[int] = field(default_factory=list)  # token events (SSE data, NDJSON lines) in each
    t_done_ns: int | None = None  # the stream's end marker written: "data: [DONE]" or "done": true
    t_end_ns: int | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    streaming: bool = False  # an event stream (SSE) or NDJSON response
    stream_format: str | None = None  # "sse", "ndjson" or "aws-eventstream" (Bedrock) when streaming
    stream_events: list[StreamEvent] = field(default_factory=list)  # named SSE events that are no tokens
    # What the stream states of itself (never its text): the request body's
    # "model", and the usage counts of its last events (OpenAI usage, Anthropic
    # usage, Ollama eval_count, llama.cpp timings.predicted_n).
    model: str | None = None
    output_tokens: int | None = None
    input_tokens: int | None = None
    end_reason: str | None = None
    # The error a stream ended with, as it named it: an AWS event stream's
    # :exception-type (throttlingException, modelStreamErrorException), never its message.
    stream_error: str | None = None
    write_tids: set[int] = field(default_factory=set)
    # "socket": read from socket syscalls; "tls": the plaintext of TLS library
    # calls (token_ns are then SSL_write entries, and the socket write that
    # carried the first token began at t_first_token_wire_ns, where seen).
    transport: str = "socket"
    t_first_token_wire_ns: int | None = None
    # "server": a request the target served (it read the request, wrote the
    # response); "client": one it sent (t_ingress_ns is its first request byte
    # written, the response times are reads' returns: when the bytes reached it).
    role: str = "server"
    retry_count: int | None = None  # the request's x-stainless-retry-count header, where it was read
    peer: str | None = None  # the other end, "address:port" (a client's server, a server's client)
    host: str | None = None  # the Host it named (HTTP/1: its first 32 bytes, no port): a client's endpoint
    # W3C trace context of the request (docs/trace-context.md): its traceparent's
    # trace-id and parent-id (32 and 16 lower-case hex digits) and flags, where a
    # valid one was read (HTTP/1: bpf/protocols/trace_context.bpf.h; HTTP/2: HPACK), and its
    # tracestate as sent (whole list members, at most TRACESTATE_MAX_BYTES).
    # A server request's caller, or the context a client wrote into its own call.
    trace_id: str | None = None
    parent_span_id: str | None = None
    trace_flags: int | None = None
    tracestate: str | None = None
    # Where the process that served (or sent) it runs: its cgroup v2 path, its pid in
    # its own pid namespace, the container and pod that path names (collector/processes/containers.py).
    process: ProcessIdentity | None = None
    # HTTP/2 (collector/ingest/h2_streams.py): "h2" and the stream's id; a gRPC call's
    # service and method (from :path /package.Service/Method) and its grpc-status.
    # token_ns are then the writes carrying DATA frames that complete messages.
    protocol: str = "http/1.1"
    h2_stream: int | None = None
    rpc_service: str | None = None
    rpc_method: str | None = None
    grpc_status: int | None = None
    # Filled in when the server has inferprobe USDT probes (collector/ingest/correlate.py):
    server: ServerRequest | None = None
    correlated_by: str | None = None  # "conn_fd", "thread" or "time"
    # What the analyzers find about a request (mutex.wait.ratio, lock and GPU
    # waits) is kept beside it, in the report model: analyzers/request_analysis.py.

    @property
    def t_first_token_ns(self) -> int | None:
        return self.token_ns[0] if self.token_ns else None

    @property
    def ttft_ns(self) -> int | None:
        first = self.t_first_token_ns
        return None if first is None else first - self.t_ingress_ns

    @property
    def e2e_ns(self) -> int | None:
        if self.outcome != Outcome.COMPLETE or self.t_end_ns is None:
            return None
        return self.t_end_ns - self.t_ingress_ns

    @property
    def output_token_count(self) -> int | None:
        """The server's own count (USDT request_end), else the count the stream
        stated (usage fields); never guessed from chunks."""
        if self.server is not None and self.server.output_tokens is not None:
            return int(self.server.output_tokens)
        return self.output_tokens

    @property
    def tpot_ns(self) -> float | None:
        """Time per output token after the first: (last - first token write) / (tokens - 1),
        exact when a chunk carries several tokens because the count is the server's."""
        n = self.output_token_count
        if n is None or n < 2 or len(self.token_ns) < 2:
            return None
        return (self.token_ns[-1] - self.token_ns[0]) / (n - 1)

    @property
    def itl_ns(self) -> list[int]:
        return [b - a for a, b in zip(self.token_ns, self.token_ns[1:], strict=False)]

    @property
    def endpoint(self) -> str:
        return f"{self.method or '?'} {self.path or '?'}"

    @property
    def is_error(self) -> bool:
        return self.status is not None and self.status >= 400


@dataclass(slots=True)
class Connection:
    conn_id: int
    pid: int
    fd: int
    family: str  # "ipv4", "ipv6", "unix", or "unknown" (open before recording)
    peer: str | None  # address without port
    peer_port: int | None
    t_open_ns: int | None
    t_close_ns: int | None = None
    # "server": the target accepted it; "client": the target connect()ed it
    # (an outbound call), from t_open_ns (connect()'s entry) to
    # t_connect_end_ns (the TCP handshake done), connect_result its return.
    role: str = "server"
    t_connect_end_ns: int | None = None
    connect_result: int = 0
    t_tls_done_ns: int | None = None  # its TLS handshake completed (OpenSSL), where one was seen
    # A client connection's own port, from its TCP handshake (None: a server's, or not seen):
    # the peer port its server sees, which ties a proxy's hop to the next (analyzers/proxy_hops.py).
    local_port: int | None = None


@dataclass(slots=True)
class SessionStats:
    requests: int = 0
    responses_without_request: int = 0  # e.g. connections already mid-response at start
    writes_without_response: int = 0
    # traceparent values read but not valid (collector/ingest/trace_context.py)
    trace_context_invalid: int = 0
    h2_tables_lost: int = 0  # HTTP/2 header blocks whose HPACK table could not be followed
    h2_connections_lost: int = 0  # HTTP/2 connections whose frames could no longer be followed


# -- the server's own view, from its inferprobe USDT probes ---------------------


@dataclass(slots=True)
class DecodeStep:
    """One decode_step_start .. decode_step_end of a server's engine."""

    pid: int
    tid: int
    step_id: int
    t_start_ns: int
    t_end_ns: int | None
    batch_size: int
    tokens_in_batch: int
    requests: set[int] = field(default_factory=set)  # req ids that emitted a token in it
    # Where the step's batch is read whole (llama.cpp's uprobes): the prompt tokens it
    # carried besides the decode tokens, and the positions its attention covered (each
    # sequence's cache after the step). None where the engine does not say (USDT).
    prefill_tokens: int | None = None
    context_tokens: int | None = None


class ProbeSpan(NamedTuple):
    """One start..end pair of a server's probes for one request (prefill_start ..
    prefill_end, request_queued .. request_scheduled), each pair as fired: a
    request queued again after a preemption has two."""

    pid: int
    tid: int  # the thread that fired the start
    req_id: int
    start_ns: int
    end_ns: int


@dataclass(slots=True)
class ServerRequest:
    """What the server's probes said about one request (one req_id in one pid)."""

    pid: int
    req_id: int
    tid: int | None = None  # the thread that fired request_start
    t_start_ns: int | None = None
    prompt_tokens: int | None = None
    conn_fd: int | None = None  # None when the server passed -1
    t_queued_ns: int | None = None
    queue_depth_at_queue: int | None = None
    t_scheduled_ns: int | None = None
    batch_size_at_schedule: int | None = None
    t_prefill_start_ns: int | None = None
    t_prefill_end_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)  # token_emit times, index order
    t_end_ns: int | None = None
    output_tokens: int | None = None
    status: int | None = None  # 0 ok, 1 aborted by the client, 2 server error, 3 rejected
    steps: list[DecodeStep] = field(default_factory=list)  # the decode steps it took part in
    # Engines read between their processes (collector/ingest/engine_ipc_view.py): the
    # engine's own id of the request, and when the API server handed it to the engine.
    engine_request_id: str | None = None
    t_handoff_ns: int | None = None
