"""HTTP/2 streams into Request timelines: every stream a request.

Fed by the sessionizer with the h2_frames events of the kernel's frame walk
(bpf/protocols/http2.bpf.h) and the h2_headers events decoded from their header
blocks (collector/ingest/h2_header_blocks.py), in the order their bytes moved
(sessionizer.effect_order). Rules (RFC 9113, and gRPC over HTTP/2):
- the request half's HEADERS (a server's reads, a client's writes) opens a
  stream's request: :method, :path, the time its read returned;
- the response half's first HEADERS starts the response (:status,
  content-type); a later one is its trailers (grpc-status);
- on the response half, each syscall whose DATA frames complete one or more
  gRPC messages is one token chunk (how many messages it completed is kept,
  as SSE events are for HTTP/1); for SSE and NDJSON over HTTP/2, each
  syscall whose DATA frames hold token events, counted in the kernel as an
  HTTP/1 body's are (SSE "data:" lines less "data: [DONE]" and empty or
  finish chunks; NDJSON lines), "data: [DONE]" or "done": true anywhere in
  a frame being the end marker. Past the frames the kernel scans per
  syscall, a frame that starts with a "data:" line other than [DONE] is one
  event, a non-empty NDJSON frame one line;
- END_STREAM on the response half (DATA or trailers) completes it;
  RST_STREAM on either half aborts it; GOAWAY aborts the streams above the
  last one the peer said it would handle; a close aborts what is open.
Frames of many streams share a syscall: each goes to its own stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferprobe.collector.ingest.trace_context import set_trace_context
from inferprobe.collector.model.events import (
    H2Content,
    H2Flag,
    H2FrameFlag,
    H2FramesRecord,
    H2FrameType,
    H2HeadersFlag,
    H2HeadersRecord,
    H2PartFlag,
)
from inferprobe.collector.model.timeline import Outcome, Request, SessionStats

# RFC 9113 section 7, for end reasons a person can read.
ERROR_CODES = {0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x2: "INTERNAL_ERROR", 0x3: "FLOW_CONTROL_ERROR",
               0x4: "SETTINGS_TIMEOUT", 0x5: "STREAM_CLOSED", 0x6: "FRAME_SIZE_ERROR", 0x7: "REFUSED_STREAM",
               0x8: "CANCEL", 0x9: "COMPRESSION_ERROR", 0xA: "CONNECT_ERROR", 0xB: "ENHANCE_YOUR_CALM",
               0xC: "INADEQUATE_SECURITY", 0xD: "HTTP_1_1_REQUIRED"}

HEADER_BLOCK_FRAMES = (H2FrameType.HEADERS, H2FrameType.CONTINUATION, H2FrameType.PUSH_PROMISE)

STREAM_FORMATS = {H2Content.GRPC: "grpc", H2Content.EVENT_STREAM: "sse", H2Content.NDJSON: "ndjson",
                  H2Content.AWS_EVENT_STREAM: "aws-eventstream"}


def grpc_method(path: str | None) -> tuple[str, str] | None:
    """(service, method) of a gRPC :path, "/package.Service/Method"."""
    if not path or not path.startswith("/"):
        return None
    parts = path[1:].split("/")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


def moment(ev: H2FramesRecord | H2HeadersRecord) -> int:
    """As for HTTP/1: a write's entry, a read's return."""
    return ev.exit_ns if ev.is_read else ev.ts_ns


def is_request_side(ev: H2FramesRecord | H2HeadersRecord) -> bool:
    return ev.is_read != (ev.role.name == "CLIENT")


@dataclass(slots=True)
class _Stream:
    request: Request
    responding: bool = False


@dataclass(slots=True)
class _H2Conn:
    streams: dict[int, _Stream] = field(default_factory=dict)
    lost: bool = False
    # Decoded header blocks waiting for the frames event of their syscall,
    # which says where among its frames each block stood (a response's
    # HEADERS, DATA and trailers often share one write).
    pending: list[H2HeadersRecord] = field(default_factory=list)


class H2Streams:
    """The HTTP/2 part of the sessionizer: appends to its requests and stats."""

    def __init__(self, requests: list[Request], stats: SessionStats, peer_of) -> None:
        self._requests = requests
        self._stats = stats
        self._peer_of = peer_of
        self._conns: dict[int, _H2Conn] = {}  # dropped at CONN_CLOSE or its process's exit (on_close)

    def feed(self, ev: H2FramesRecord | H2HeadersRecord) -> None:
        conn = self._conns.setdefault(ev.conn_id, _H2Conn())
        if isinstance(ev, H2HeadersRecord):
            conn.pending.append(ev)  # the sessionizer feeds it just before its syscall's frames
            return
        # Blocks of earlier syscalls whose frames event never came (the ring was full): in order.
        while conn.pending and conn.pending[0].exit_ns < ev.exit_ns:
            self._on_headers(conn, conn.pending.pop(0))
        self._on_frames(conn, ev)

    def _take_block(self, conn: _H2Conn, ev: H2FramesRecord, stream_id: int) -> H2HeadersRecord | None:
        for i, block in enumerate(conn.pending):
            if block.stream_id == stream_id and block.is_read == ev.is_read and block.exit_ns == ev.exit_ns:
                return conn.pending.pop(i)
        return None

    # -- header blocks ----------------------------------------------------------
    def _on_headers(self, conn: _H2Conn, ev: H2HeadersRecord) -> None:
        if H2HeadersFlag.PUSH_PROMISE in ev.flags:
            return  # a pushed response's promised request: not one the peer made
        if H2HeadersFlag.TABLE_LOST in ev.flags:
            self._stats.h2_tables_lost += 1
        t = moment(ev)
        stream = conn.streams.get(ev.stream_id)
        if is_request_side(ev):
            if stream is not None:
                return  # the request's trailers
            req = Request(pid=ev.pid, tid=ev.tid, conn=ev.conn_id, method=ev.method, path=ev.path,
                          t_ingress_ns=ev.first_piece_ns or t, transport=ev.transport.name.lower(),
                          role=ev.role.name.lower(), peer=self._peer_of(ev.conn_id), protocol="h2",
                          h2_stream=ev.stream_id)
            if ev.content == H2Content.GRPC and (names := grpc_method(ev.path)) is not None:
                req.rpc_service, req.rpc_method = names
            set_trace_context(req, ev.traceparent, ev.tracestate, self._stats,
                              tracestate_cut=ev.tracestate_cut)
            self._requests.append(req)
            self._stats.requests += 1
            conn.streams[ev.stream_id] = _Stream(req)
            return
        if stream is None:
            self._stats.responses_without_request += 1
            return
        req = stream.request
        if not stream.responding:
            stream.responding = True
            req.status = ev.status
            req.t_response_start_ns = t
            req.stream_format = STREAM_FORMATS.get(ev.content)
            req.streaming = req.stream_format is not None
            if ev.content == H2Content.GRPC and req.rpc_method is None and (names := grpc_method(req.path)):
                req.rpc_service, req.rpc_method = names
        if ev.grpc_status is not None:
            req.grpc_status = ev.grpc_status  # trailers (or a trailers-only response)
        if H2HeadersFlag.END_STREAM in ev.flags:
            self._end(conn, ev.stream_id, t, Outcome.COMPLETE, "END_STREAM")

    # -- frames -----------------------------------------------------------------
    def _on_frames(self, conn: _H2Conn, ev: H2FramesRecord) -> None:
        t = moment(ev)
        request_side = is_request_side(ev)
        chunks: dict[int, int] = {}  # stream -> token events this syscall carried on it
        for part in ev.frames:
            if (part.frame_type in HEADER_BLOCK_FRAMES and H2PartFlag.ENDS in part.part
                    and part.flags & H2FrameFlag.END_HEADERS):
                block = self._take_block(conn, ev, part.stream_id)
                if block is not None:
                    self._flush_chunks(conn, chunks, t, ev)
                    self._on_headers(conn, block)
                continue
            stream = conn.streams.get(part.stream_id)
            if part.frame_type == H2FrameType.GOAWAY and H2PartFlag.ENDS in part.part:
                # Its last stream id is of the streams its receiver opened: a server's GOAWAY
                # refuses requests past it; a client's (the AWS SDK for JavaScript closes its
                # session so after each response) speaks of pushed streams, not of its requests.
                if not request_side:
                    for sid in [s for s in conn.streams if s > part.value]:
                        self._end(conn, sid, t, Outcome.ABORTED, "GOAWAY")
                continue
            if stream is None:
                continue
            req = stream.request
            if part.frame_type == H2FrameType.RST_STREAM and H2PartFlag.ENDS in part.part:
                self._end(conn, part.stream_id, t, Outcome.ABORTED,
                          f"RST_STREAM {ERROR_CODES.get(part.value, hex(part.value))}")
                continue
            if part.frame_type != H2FrameType.DATA:
                continue
            if request_side:
                req.bytes_in += part.value
                continue
            req.bytes_out += part.value
            req.write_tids.add(ev.tid)
            if part.part & (H2PartFlag.SSE_DONE | H2PartFlag.JSON_DONE) and req.t_done_ns is None:
                req.t_done_ns = t
            events = self._token_events(req, part)
            if events:
                chunks[part.stream_id] = chunks.get(part.stream_id, 0) + events
            if part.ends_stream:
                self._add_chunk(req, chunks.pop(part.stream_id, 0), t, ev)
                self._end(conn, part.stream_id, t, Outcome.COMPLETE, "END_STREAM")
        self._flush_chunks(conn, chunks, t, ev)
        if H2Flag.LOST_SYNC in ev.flags and not conn.lost:
            conn.lost = True
            self._stats.h2_connections_lost += 1
            for sid in list(conn.streams):
                self._end(conn, sid, t, Outcome.INCOMPLETE, "HTTP/2 frames no longer followed")

    def _flush_chunks(self, conn: _H2Conn, chunks: dict[int, int], t: int, ev: H2FramesRecord) -> None:
        """The token events counted so far in this syscall, one chunk per stream."""
        for sid, events in chunks.items():
            stream = conn.streams.get(sid)
            if stream is not None:
                self._add_chunk(stream.request, events, t, ev)
        chunks.clear()

    @staticmethod
    def _token_events(req: Request, part) -> int:
        if req.stream_format == "grpc" or H2PartFlag.GRPC in part.part:
            return part.messages
        if H2PartFlag.SCANNED in part.part and req.stream_format in ("sse", "aws-eventstream"):
            return part.messages   # its events (messages), counted in the kernel as an HTTP/1 body's are
        if H2PartFlag.SCANNED in part.part and req.stream_format == "ndjson":
            # its lines; the "done" line is the end marker, not a token
            return max(part.messages - 1, 0) if H2PartFlag.JSON_DONE in part.part else part.messages
        if req.stream_format == "sse":
            return 1 if H2PartFlag.SSE_DATA in part.part and H2PartFlag.SSE_DONE not in part.part else 0
        if req.stream_format == "ndjson":
            return 1 if part.value and H2PartFlag.CONTINUED not in part.part else 0
        return 0

    @staticmethod
    def _add_chunk(req: Request, events: int, t: int, ev: H2FramesRecord) -> None:
        if not events:
            return
        if not req.token_ns:
            req.t_first_token_wire_ns = ev.wire_ns
        req.token_ns.append(t)
        req.token_events.append(events)

    def _end(self, conn: _H2Conn, stream_id: int, t: int, outcome: Outcome, reason: str) -> None:
        stream = conn.streams.pop(stream_id, None)
        if stream is None:
            return
        req = stream.request
        req.outcome = outcome
        req.t_end_ns = t if outcome != Outcome.INCOMPLETE else None
        req.end_reason = reason

    # -- connection end -----------------------------------------------------------
    def open_requests(self, conn_id: int) -> list[Request]:
        """The requests of a connection's streams still open."""
        conn = self._conns.get(conn_id)
        return [stream.request for stream in conn.streams.values()] if conn is not None else []

    def on_close(self, conn_id: int, ts: int, reason: str = "close") -> None:
        conn = self._conns.pop(conn_id, None)
        if conn is None:
            return
        for block in conn.pending:
            self._on_headers(conn, block)
        for sid in list(conn.streams):
            self._end(conn, sid, ts, Outcome.ABORTED, reason)

    def finish(self) -> None:
        for conn in self._conns.values():
            for block in conn.pending:
                self._on_headers(conn, block)
            for stream in conn.streams.values():
                stream.request.outcome = Outcome.INCOMPLETE
            conn.streams.clear()
        self._conns.clear()
