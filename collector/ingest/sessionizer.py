"""Turns decoded socket events into Request timelines.

One state machine per connection, fed in the order the syscalls completed.
HTTP/1.1 rules it follows (RFC 9112):
- a read that starts with a request line opens a request; keep-alive gives
  many per connection, and pipelined requests wait in a FIFO for their
  responses, so timelines never mix;
- a write that starts with a status line starts the response of the oldest
  waiting request (1xx interim responses do not);
- the response ends at: the last chunk of a chunked body, Content-Length
  bytes of body, no body at all (HEAD, 204, 304), or close() when the body
  is delimited by the connection closing;
- a chunked body also ends when its last chunk ("0\\r\\n") and the blank line
  after its trailers come in writes of their own (cpp-httplib, llama.cpp's
  server), and a close after the last chunk leaves the response complete;
- each write carrying token events is one token chunk: SSE "data:" fields of
  unnamed or *delta events (text/event-stream), or complete lines of an
  NDJSON stream (application/x-ndjson, jsonl). A write may carry several: we
  record how many and do not guess further. The end markers ("data: [DONE]",
  an NDJSON line with "done": true) are not tokens; SSE events with other
  names are stream events.
"""

from __future__ import annotations

import ipaddress
import socket
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferprobe.collector.ingest.h2_streams import H2Streams
from inferprobe.collector.ingest.h2_streams import moment as h2_moment
from inferprobe.collector.ingest.trace_context import TraceContextJoiner
from inferprobe.collector.model.events import (
    ConnRecord,
    ConnRole,
    Event,
    EventType,
    H2FramesRecord,
    H2HeadersRecord,
    HttpFlag,
    HttpKind,
    IoRecord,
    StreamFlag,
)
from inferprobe.collector.model.timeline import Connection, Outcome, Request, SessionStats, StreamEvent

# The end reason of a client's error answer closed with its body unread (_on_close).
ERROR_BODY_UNREAD = "error status, then closed with its body unread"
# The end reason of a request whose process exited (its sockets closed with it, no close() seen).
PROCESS_EXITED = "process exited"


@dataclass(slots=True)
class _Response:
    request: Request
    chunked: bool = False
    length: int | None = None  # Content-Length, when given
    body_seen: int = 0
    close_delimited: bool = False
    last_write_ns: int = 0
    last_chunk_seen: bool = False  # "0\r\n" written: the body is whole, trailers may follow
    done_line_open: bool = False  # NDJSON "done": true seen, its line not yet counted


@dataclass(slots=True)
class _Conn:
    waiting: deque[Request] = field(default_factory=deque)  # read, no response yet
    reading: Request | None = None  # the request whose bytes reads belong to
    responding: _Response | None = None


def _peer_of(ev: ConnRecord) -> tuple[str, str | None]:
    """(family, address) of an event's peer."""
    if ev.family == socket.AF_INET:
        return "ipv4", str(ipaddress.IPv4Address(ev.peer_addr[:4]))
    if ev.family == socket.AF_INET6:
        return "ipv6", str(ipaddress.IPv6Address(ev.peer_addr))
    if ev.family == socket.AF_UNIX:
        return "unix", None
    return "unknown", None


def _connection(ev: ConnRecord) -> Connection:
    family, peer = _peer_of(ev)
    return Connection(
        conn_id=ev.conn_id,
        pid=ev.pid,
        fd=ev.fd,
        family=family,
        peer=peer,
        peer_port=ev.peer_port if peer else None,
        t_open_ns=ev.ts_ns,
        role=ev.role.name.lower(),
        connect_result=ev.result,
    )


def moment(ev: IoRecord) -> int:
    """When the bytes of an I/O moved for the application: a write's entry
    (the server handed its token over), a read's return (the bytes were there)."""
    return ev.exit_ns if ev.is_read else ev.ts_ns


def arrived(ev: IoRecord) -> int:
    """When a request began to move: the first of the pieces its head came in
    (joined in the kernel), else the syscall's own moment."""
    return ev.first_piece_ns if ev.first_piece_ns is not None else moment(ev)


def is_request_side(ev: IoRecord) -> bool:
    """The request half of an exchange: what a server reads, what a client writes."""
    return ev.is_read != (ev.role == ConnRole.CLIENT)


def effect_order(ev: Event) -> tuple[int, int]:
    """The time an event took effect, the order the sessionizer is fed in.

    I/O goes by when its bytes moved (moment()): a read by its return (a
    server's request read is before the writes that answer it), a write by
    its entry, over HTTP/1 and HTTP/2 alike. Not a write's return: a
    client's request is on the wire before its write call returns, and a
    thread preempted after the socket write (Go's crypto/tls Write, on a
    busy host) can return after the response's first read did.
    Ordered by return, that response found no request waiting and every
    later call on the connection took its predecessor's answer. Causality
    still holds both ways: a server's write begins after the read it answers
    returned, a client's next write after the reads of the last response.
    An HTTP/2 syscall's decoded header blocks (user space made them from a
    ring of their own) go before its frames, which they name the streams of.
    """
    if isinstance(ev, IoRecord):
        return moment(ev), 1
    if isinstance(ev, H2FramesRecord):
        return h2_moment(ev), 1
    if isinstance(ev, H2HeadersRecord):
        return h2_moment(ev), 0
    return ev.ts_ns, 1


class Sessionizer:
    def __init__(self) -> None:
        self._conns: dict[int, _Conn] = {}  # dropped at CONN_CLOSE, or at its process's exit (forget_process)
        self.requests: list[Request] = []  # live: handed out and dropped by LiveIngest.harvest once ended
        self.connections: dict[int, Connection] = {}  # live: LiveIngest.harvest drops it after close or exit
        # The connection open at each (pid, fd), for EVENT_TLS_TIED; dropped at close and at process exit.
        self._open_at: dict[tuple[int, int], int] = {}
        self.stats = SessionStats()
        self._trace = TraceContextJoiner(self.stats)  # W3C traceparent / tracestate onto requests
        self._h2 = H2Streams(self.requests, self.stats, self._peer)

    # -- feeding ---------------------------------------------------------------
    def feed_all(self, events: Iterable[Event]) -> None:
        for ev in sorted(events, key=effect_order):
            self.feed(ev)

    def feed(self, ev: Event) -> None:
        if self._trace.feed(ev):
            return
        if isinstance(ev, H2FramesRecord | H2HeadersRecord):
            self._known_by_first_io(ev)
            self._h2.feed(ev)
            return
        if not isinstance(ev, ConnRecord | IoRecord):
            return  # USDT and stack-sample events belong to other analyzers
        if isinstance(ev, ConnRecord):
            if ev.type == EventType.CONN_CLOSE:
                if self._open_at.get((ev.pid, ev.fd)) == ev.conn_id:
                    del self._open_at[(ev.pid, ev.fd)]
                if ev.conn_id in self.connections:
                    self.connections[ev.conn_id].t_close_ns = ev.ts_ns
                self._on_close(ev.conn_id, ev.ts_ns, "close")
                self._h2.on_close(ev.conn_id, ev.ts_ns)
            elif ev.type == EventType.CONN_CONNECTED:
                if ev.conn_id in self.connections:
                    self.connections[ev.conn_id].t_connect_end_ns = ev.ts_ns
                    self.connections[ev.conn_id].local_port = ev.local_port or None
            elif ev.type == EventType.CONN_PEER:
                self._on_peer(ev)
            elif ev.type == EventType.TLS_HANDSHAKE:
                known = self.connections.get(ev.conn_id)
                if known is not None and known.t_tls_done_ns is None:
                    known.t_tls_done_ns = ev.ts_ns
            elif ev.type == EventType.TLS_TIED:
                self._on_tls_tied(ev)
            else:
                self.connections[ev.conn_id] = _connection(ev)
                self._open_at[(ev.pid, ev.fd)] = ev.conn_id
                # A new connection under a reused id cannot happen (ids are
                # unique); a fresh state is all an open needs.
                self._conns.setdefault(ev.conn_id, _Conn())
            return
        self._known_by_first_io(ev)
        conn = self._conns.setdefault(ev.conn_id, _Conn())
        if is_request_side(ev):
            self._on_request_bytes(conn, ev)
        else:
            self._on_response_bytes(conn, ev)

    def _known_by_first_io(self, ev: IoRecord | H2FramesRecord | H2HeadersRecord) -> None:
        if ev.conn_id not in self.connections:
            # open before the recording started: known only by its first I/O
            fd = ev.fd if isinstance(ev, IoRecord | H2FramesRecord) else -1
            self.connections[ev.conn_id] = Connection(
                conn_id=ev.conn_id, pid=ev.pid, fd=fd, family="unknown", peer=None,
                peer_port=None, t_open_ns=None, role=ev.role.name.lower())

    def _on_tls_tied(self, ev: ConnRecord) -> None:
        """A TLS session whose requests began under an id of their own (a client's
        first write over a memory BIO: Node, asyncio) was tied to its socket at its
        first read (bpf/tls.bpf.c, tls_tie_late). The connection opened at that
        (pid, fd) is the session's: its peer and connect times go to the session's
        id, and the socket's own id, which carried only ciphertext, is dropped."""
        carrier = self._open_at.get((ev.pid, ev.fd))
        self._open_at[(ev.pid, ev.fd)] = ev.conn_id
        if carrier is None or carrier == ev.conn_id:
            return  # open before the recording: nothing known of it to move
        opened = self.connections.pop(carrier, None)
        self._conns.pop(carrier, None)
        if opened is None:
            return
        opened.conn_id = ev.conn_id
        self.connections[ev.conn_id] = opened
        # Its requests so far began before their connection was known: HTTP/1's, and
        # HTTP/2's streams (the AWS SDK for JavaScript's default handler).
        session = self._conns.get(ev.conn_id)
        current = [] if session is None else [*session.waiting, *(
            [session.responding.request] if session.responding is not None else [])]
        for req in (*current, *self._h2.open_requests(ev.conn_id)):
            req.peer = req.peer or self._peer(ev.conn_id)

    def _on_peer(self, ev: ConnRecord) -> None:
        """The peer of a connection accepted without its address, or open at attach,
        named at its first read (bpf/sock.bpf.c, peer_wanted): before the read's own
        event, so the requests it starts carry it."""
        family, peer = _peer_of(ev)
        # A TLS session over it tied later (EVENT_TLS_TIED) takes the peer from here.
        self._open_at.setdefault((ev.pid, ev.fd), ev.conn_id)
        known = self.connections.get(ev.conn_id)
        if known is None:  # open at attach: its first I/O is still to come
            known = self.connections[ev.conn_id] = Connection(
                conn_id=ev.conn_id, pid=ev.pid, fd=ev.fd, family=family, peer=None, peer_port=None,
                t_open_ns=None, role=ev.role.name.lower())
        known.family, known.peer, known.peer_port = family, peer, ev.peer_port if peer else None

    def pids(self) -> set[int]:
        """The processes some connection state is kept for."""
        return {c.pid for c in self.connections.values()} | {pid for pid, _fd in self._open_at}

    def forget_process(self, pid: int, ts: int) -> int:
        """pid exited: its sockets closed without a close() the kernel reports (exit closes
        them), so each of its connections ends here as at a close at ts. Returns how many."""
        ended = [cid for cid, c in self.connections.items() if c.pid == pid and c.t_close_ns is None]
        for cid in ended:
            self.connections[cid].t_close_ns = ts
            self._on_close(cid, ts, PROCESS_EXITED)
            self._h2.on_close(cid, ts, PROCESS_EXITED)
        for key in [k for k in self._open_at if k[0] == pid]:
            del self._open_at[key]
        return len(ended)

    def finish(self) -> list[Request]:
        """Ends the recording: whatever is still open is incomplete."""
        self._h2.finish()
        for conn in self._conns.values():
            if conn.responding is not None:
                conn.responding.request.outcome = Outcome.INCOMPLETE
                conn.responding = None
            for req in conn.waiting:
                req.outcome = Outcome.INCOMPLETE
            conn.waiting.clear()
        self._conns.clear()
        return self.requests

    # -- the request half: a server's reads, a client's writes -----------------
    def _on_request_bytes(self, conn: _Conn, ev: IoRecord) -> None:
        if ev.kind == HttpKind.REQUEST:
            req = Request(
                pid=ev.pid,
                tid=ev.tid,
                conn=ev.conn_id,
                method=ev.method,
                path=ev.path,
                t_ingress_ns=arrived(ev),
                bytes_in=ev.bytes,
                model=ev.model,
                transport=ev.transport.name.lower(),
                role=ev.role.name.lower(),
                retry_count=ev.retry_count,
                peer=self._peer(ev.conn_id),
                host=ev.host,
            )
            self.requests.append(req)
            self.stats.requests += 1
            conn.waiting.append(req)
            conn.reading = req
            self._trace.saw_request_io(ev.conn_id, ev.exit_ns, req)
        elif ev.kind == HttpKind.DATA and ev.bytes > 0:
            if conn.reading is not None:
                conn.reading.bytes_in += ev.bytes
                if conn.reading.model is None:
                    conn.reading.model = ev.model
                self._trace.saw_request_io(ev.conn_id, ev.exit_ns, conn.reading)
        elif ev.kind == HttpKind.EOF:
            conn.reading = None

    def _peer(self, conn_id: int) -> str | None:
        conn = self.connections.get(conn_id)
        if conn is None or conn.peer is None:
            return None
        return f"{conn.peer}:{conn.peer_port}" if conn.peer_port is not None else conn.peer

    # -- the response half: a server's writes, a client's reads ----------------
    def _on_response_bytes(self, conn: _Conn, ev: IoRecord) -> None:
        if ev.kind == HttpKind.ERROR:
            return  # a failed write moved nothing; close() decides the outcome
        if ev.kind == HttpKind.EOF:
            # A client read 0: the server closed. A body delimited by the close ends here.
            resp = conn.responding
            if resp is not None and resp.close_delimited:
                self._end_response(conn, resp.last_write_ns, "close")
            return
        t = moment(ev)
        body_bytes = ev.bytes
        if ev.kind == HttpKind.RESPONSE:
            if 100 <= ev.status < 200:
                return  # interim response (100 Continue): the real one follows
            self._start_response(conn, ev)
            if conn.responding is None:
                return
            if HttpFlag.HEADERS_END in ev.flags:
                body_bytes = ev.bytes - ev.header_bytes
            else:
                body_bytes = 0
        resp = conn.responding
        if resp is None:
            if ev.bytes > 0:
                self.stats.writes_without_response += 1
            return
        req = resp.request
        req.bytes_out += max(ev.bytes, 0)
        req.write_tids.add(ev.tid)
        resp.last_write_ns = t
        tokens = self._token_events(resp, ev, t)
        if tokens and (req.streaming or ev.kind == HttpKind.DATA):
            if not req.token_ns:
                req.t_first_token_wire_ns = ev.wire_ns
            req.token_ns.append(t)
            req.token_events.append(tokens)
        if ev.named_events and req.stream_format == "sse":
            req.stream_events.append(StreamEvent(t, ev.event_name, ev.named_events))
        if StreamFlag.EXCEPTION in ev.stream_flags and req.stream_error is None:
            req.stream_error = ev.event_name  # the AWS event stream's exception: the stream ends in it
        if ev.output_tokens is not None:
            req.output_tokens = ev.output_tokens  # the last count stated is the total
        if ev.input_tokens is not None:
            req.input_tokens = ev.input_tokens
        resp.body_seen += max(body_bytes, 0)
        if self._response_ended(resp, ev):
            self._end_response(conn, t, "framing")

    @staticmethod
    def _token_events(resp: _Response, ev: IoRecord, t: int) -> int:
        """Token events in one write (or a client's read) of the response, its end marker left out."""
        req = resp.request
        if req.stream_format != "ndjson":
            if HttpFlag.SSE_DONE in ev.flags and req.t_done_ns is None:
                req.t_done_ns = t
            return ev.sse_events
        lines = ev.json_lines
        if HttpFlag.JSON_DONE in ev.flags and req.t_done_ns is None:
            req.t_done_ns = t
            resp.done_line_open = True
        if resp.done_line_open and lines:
            # The "done" line is the stream's last: counted by the write that
            # ends it, this one or the next that ends a line.
            lines -= 1
            resp.done_line_open = False
        return lines

    def _start_response(self, conn: _Conn, ev: IoRecord) -> None:
        if conn.responding is not None:
            # The previous response had no length we could see: a new status
            # line on the connection means it ended with its last write.
            self._end_response(conn, conn.responding.last_write_ns, "next response")
        if not conn.waiting:
            self.stats.responses_without_request += 1
            return
        req = conn.waiting.popleft()
        if conn.reading is req:
            conn.reading = None
        req.status = ev.status
        req.t_response_start_ns = moment(ev)
        if HttpFlag.EVENT_STREAM in ev.flags:
            req.stream_format = "sse"
        elif HttpFlag.NDJSON_STREAM in ev.flags:
            req.stream_format = "ndjson"
        elif StreamFlag.AWS_EVENTS in ev.stream_flags:
            req.stream_format = "aws-eventstream"  # token messages counted in sse_events
        req.streaming = req.stream_format is not None
        headers_seen = HttpFlag.HEADERS_END in ev.flags
        resp = _Response(
            request=req,
            chunked=HttpFlag.CHUNKED in ev.flags,
            length=ev.content_length,
            last_write_ns=moment(ev),
        )
        no_body = req.method == "HEAD" or ev.status in (204, 304)
        if no_body:
            resp.length = 0
        resp.close_delimited = headers_seen and not resp.chunked and resp.length is None
        conn.responding = resp

    @staticmethod
    def _response_ended(resp: _Response, ev: IoRecord) -> bool:
        if resp.chunked:
            if HttpFlag.CHUNKED_END in ev.flags:
                return True
            # The last chunk's line, then trailers, then a blank line: in one
            # write or in several.
            resp.last_chunk_seen |= HttpFlag.LAST_CHUNK in ev.flags
            return resp.last_chunk_seen and HttpFlag.BLANK_LINE_END in ev.flags
        if resp.length is not None:
            return resp.body_seen >= resp.length
        return False

    def _end_response(self, conn: _Conn, t_end: int, reason: str) -> None:
        resp = conn.responding
        if resp is None:
            return
        req = resp.request
        req.outcome = Outcome.COMPLETE
        req.t_end_ns = t_end
        req.end_reason = reason
        conn.responding = None

    # -- close -----------------------------------------------------------------
    def _on_close(self, conn_id: int, ts: int, reason: str) -> None:
        self._trace.on_close(conn_id)
        conn = self._conns.pop(conn_id, None)
        if conn is None:
            return
        resp = conn.responding
        if resp is not None:
            if resp.close_delimited:
                self._end_response(conn, resp.last_write_ns, "close")
            elif resp.last_chunk_seen:
                # The body was whole; only the blank line after it was not seen.
                self._end_response(conn, resp.last_write_ns, "last chunk, then close")
            elif resp.request.t_done_ns is not None:
                # The stream said it ended ("data: [DONE]", "done": true) and the chunked
                # terminator never came by: a client (the openai SDK) that stops reading at
                # the marker and closes, when the server's last chunk came in a later segment.
                self._end_response(conn, resp.last_write_ns, "end marker, then close")
            elif resp.request.role == "client" and (resp.request.status or 0) >= 400:
                # An error answer (503 overloaded, 429 throttled) is its status: SDKs that
                # retry close the connection without reading its body. The call was
                # answered, not cut short.
                self._end_response(conn, resp.last_write_ns, ERROR_BODY_UNREAD)
            else:
                req = resp.request
                req.outcome = Outcome.ABORTED
                req.t_end_ns = ts
                req.end_reason = reason
        for req in conn.waiting:
            req.outcome = Outcome.ABORTED
            req.t_end_ns = ts
            req.end_reason = "closed before a response"


def sessionize(events: Iterable[Event]) -> Sessionizer:
    """Feeds every event and finishes: read .requests, .connections, .stats."""
    s = Sessionizer()
    s.feed_all(events)
    s.finish()
    return s
