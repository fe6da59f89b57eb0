"""Raw-socket HTTP/1.1 streaming client with its own receive timestamps (stdlib only).

The one client implementation of the project: the demo load generator
(demo/loadgen.py) drives the demo server with it, and the tracer tests use it
(through tests/servers/sse_client.py) as client-side ground truth next to the
test SSE server. It deliberately avoids http.client/aiohttp: we want
``time.monotonic_ns()`` taken right after the ``recv()`` that completed each SSE
event, and full control over the TCP connection (keep-alive reuse, abrupt close
mid-stream).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

RECV_SIZE = 65536
DEFAULT_TIMEOUT_S = 30.0
MAX_HEADER_BYTES = 64 * 1024


class ProtocolError(Exception):
    """The server sent something that is not valid HTTP/1.1 as we parse it."""


@dataclass
class ClientResult:
    request_id: str
    status: int | None
    t_send_ns: int  # just before sendall() of the request
    t_first_byte_ns: int | None  # recv() that returned the first response byte
    t_event_ns: list[int]  # one per SSE data event, excluding [DONE]
    t_done_ns: int | None  # recv() that completed "data: [DONE]"
    t_end_ns: int | None  # recv() that completed the whole response
    aborted: bool
    error: str | None
    # Extras beyond the core fields, handy in tests:
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names
    body: bytes = b""  # de-chunked body (the raw SSE stream for streaming)
    events: list[str] = field(default_factory=list)  # data payloads, excl. [DONE]
    conn_reusable: bool = False  # False -> request_once closed the socket
    local_port: int | None = None  # the client's port: names the connection in a trace


class ResponseParser:
    """Incremental HTTP/1.1 response parser (one response per instance).

    ``feed(data, t_ns)`` accepts bytes exactly as recv() returned them, split
    anywhere (inside the status line, a header, a chunk-size line, a CRLF...).
    ``t_ns`` is the receive time of that piece; it is attached to every SSE
    event the piece completes.  Decoded body bytes are additionally run
    through an SSE splitter when Content-Type is text/event-stream.
    """

    def __init__(self, on_event: Callable[[str, int], None] | None = None) -> None:
        self._on_event = on_event
        self._buf = bytearray()  # unconsumed wire bytes
        self._state = "status"  # status|headers|body_length|body_close|
        #                          chunk_size|chunk_data|chunk_crlf|trailers|done
        self.status: int | None = None
        self.version: str | None = None
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.complete = False
        self._remaining = 0  # bytes left in a Content-Length body or chunk
        self._sse = False
        self._sse_line = bytearray()  # partial SSE line
        self._sse_data: list[str] = []  # data lines of the event being built

    @property
    def headers_done(self) -> bool:
        return self._state not in ("status", "headers")

    @property
    def keep_alive(self) -> bool:
        """May the connection carry another request after this response?"""
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn and self._state != "body_close"
        return "close" not in conn and self._state != "body_close"

    def feed(self, data: bytes, t_ns: int) -> None:
        if self.complete:
            if data:
                raise ProtocolError("unexpected bytes after end of response")
            return
        self._buf += data
        while not self.complete and self._step(t_ns):
            pass

    def feed_eof(self, t_ns: int) -> None:
        """Peer closed the connection."""
        if self._state == "body_close":
            self._finish()
        elif not self.complete:
            raise ProtocolError(f"connection closed by peer in state {self._state!r}")

    # -- internals -----------------------------------------------------------

    def _take_line(self) -> bytes | None:
        """Pop one CRLF- (or bare LF-) terminated line from the buffer."""
        i = self._buf.find(b"\n")
        if i < 0:
            if len(self._buf) > MAX_HEADER_BYTES:
                raise ProtocolError("line too long")
            return None
        line = bytes(self._buf[:i])
        del self._buf[: i + 1]
        return line[:-1] if line.endswith(b"\r") else line

    def _step(self, t_ns: int) -> bool:
        """Advance the state machine once; False means "need more bytes"."""
        st = self._state
        if st == "status":
            line = self._take_line()
            if line is None:
                return False
            parts = line.decode("latin-1").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise ProtocolError(f"bad status line {line!r}")
            self.version, self.status = parts[0], int(parts[1])
            self.headers = {}
            self._state = "headers"
            return True

        if st == "headers":
            line = self._take_line()
            if line is None:
                return False
            if line:
                name, sep, value = line.decode("latin-1").partition(":")
                if not sep:
                    raise ProtocolError(f"bad header line {line!r}")
                name = name.strip().lower()
                value = value.strip()
                # Repeated headers are joined as RFC 9110 allows for lists.
                self.headers[name] = (
                    f"{self.headers[name]}, {value}" if name in self.headers else value
                )
                return True
            self._end_of_headers()
            return True

        if st in ("body_length", "chunk_data"):
            if not self._buf:
                return False
            n = min(self._remaining, len(self._buf))
            self._body(bytes(self._buf[:n]), t_ns)
            del self._buf[:n]
            self._remaining -= n
            if self._remaining == 0:
                if st == "body_length":
                    self._finish()
                else:
                    self._state = "chunk_crlf"
            return True

        if st == "body_close":
            if self._buf:
                self._body(bytes(self._buf), t_ns)
                self._buf.clear()
            return False

        if st == "chunk_size":
            line = self._take_line()
            if line is None:
                return False
            size_txt = line.split(b";", 1)[0].strip()  # drop chunk extensions
            try:
                size = int(size_txt, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line {line!r}") from None
            if size == 0:
                self._state = "trailers"
            else:
                self._remaining = size
                self._state = "chunk_data"
            return True

        if st == "chunk_crlf":
            line = self._take_line()
            if line is None:
                return False
            if line:
                raise ProtocolError("missing CRLF after chunk data")
            self._state = "chunk_size"
            return True

        if st == "trailers":
            line = self._take_line()
            if line is None:
                return False
            if not line:  # empty line ends the trailer section and the message
                self._finish()
            return True

        raise AssertionError(st)

    def _end_of_headers(self) -> None:
        assert self.status is not None
        if 100 <= self.status < 200:
            # Interim response (e.g. 100 Continue): the real one follows.
            self._state = "status"
            return
        self._sse = self.headers.get("content-type", "").lower().startswith("text/event-stream")
        te = self.headers.get("transfer-encoding", "").lower()
        if self.status in (204, 304):
            self._finish()
        elif "chunked" in te:
            self._state = "chunk_size"
        elif "content-length" in self.headers:
            try:
                self._remaining = int(self.headers["content-length"])
            except ValueError:
                raise ProtocolError("bad Content-Length") from None
            if self._remaining == 0:
                self._finish()
            else:
                self._state = "body_length"
        else:
            self._state = "body_close"  # body runs until the server closes

    def _finish(self) -> None:
        self._state = "done"
        self.complete = True

    def _body(self, data: bytes, t_ns: int) -> None:
        self.body += data
        if not self._sse:
            return
        # SSE framing: lines end in LF or CRLF; a blank line dispatches the
        # event.  (A lone CR terminator, also legal in SSE, is not handled:
        # no server we test emits it.)
        self._sse_line += data
        while True:
            i = self._sse_line.find(b"\n")
            if i < 0:
                return
            line = bytes(self._sse_line[:i])
            del self._sse_line[: i + 1]
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._sse_data:
                    payload = "\n".join(self._sse_data)
                    self._sse_data = []
                    if self._on_event is not None:
                        self._on_event(payload, t_ns)
            elif line.startswith(b"data:"):
                value = line[5:]
                if value.startswith(b" "):
                    value = value[1:]
                self._sse_data.append(value.decode("utf-8", "replace"))
            # Comments (":...") and other fields (event:, id:, retry:) are ignored.


def connect(host: str, port: int, timeout: float = DEFAULT_TIMEOUT_S) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    # Small requests: don't let Nagle delay them behind an unacked segment.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def request_once(
    sock: socket.socket,
    host: str,
    path: str,
    body: dict,
    request_id: str,
    abort_after_events: int | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> ClientResult:
    """Send one POST on an open keep-alive socket and read the full response.

    If ``abort_after_events`` is k, the socket is closed as soon as k SSE data
    events have arrived (k=0: right after the response headers).  Whenever the
    connection cannot carry another request (abort, error, server said
    ``Connection: close``), this function closes the socket and returns
    ``conn_reusable=False``; the caller must reconnect.
    """
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: text/event-stream, application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
        f"X-Request-Id: {request_id}\r\n"
        "\r\n"
    ).encode()

    res = ClientResult(
        request_id=request_id,
        status=None,
        t_send_ns=0,
        t_first_byte_ns=None,
        t_event_ns=[],
        t_done_ns=None,
        t_end_ns=None,
        aborted=False,
        error=None,
    )

    def on_event(data: str, t_ns: int) -> None:
        if data == "[DONE]":
            res.t_done_ns = t_ns
        else:
            res.t_event_ns.append(t_ns)
            res.events.append(data)

    parser = ResponseParser(on_event)
    sock.settimeout(timeout)
    try:
        res.local_port = sock.getsockname()[1] if sock.family in (socket.AF_INET, socket.AF_INET6) else None
        # One sendall of head+body: a single write on the wire side.
        res.t_send_ns = time.monotonic_ns()
        sock.sendall(head + payload)
        while not parser.complete:
            data = sock.recv(RECV_SIZE)
            t = time.monotonic_ns()  # as close to the recv() return as possible
            if not data:
                parser.feed_eof(t)
                if parser.complete:
                    res.t_end_ns = t
                break
            if res.t_first_byte_ns is None:
                res.t_first_byte_ns = t
            parser.feed(data, t)
            if parser.complete:
                res.t_end_ns = t
            elif (
                abort_after_events is not None
                and parser.headers_done
                and len(res.t_event_ns) >= abort_after_events
            ):
                res.aborted = True
                break
    except (OSError, ProtocolError) as e:  # socket.timeout is an OSError
        res.error = f"{type(e).__name__}: {e}"

    res.status = parser.status
    res.headers = dict(parser.headers)
    res.body = bytes(parser.body)
    res.conn_reusable = (
        parser.complete and res.error is None and not res.aborted and parser.keep_alive
    )
    if not res.conn_reusable:
        _close(sock)
    return res


def run_load(
    host: str,
    port: int,
    *,
    connections: int,
    requests_per_connection: int | None = None,
    duration_s: float | None = None,
    body_factory: Callable[[int, int], dict],
    path: str = "/v1/completions",
    abort: Callable[[int, int], int | None] = lambda c, i: None,
    timeout: float = DEFAULT_TIMEOUT_S,
    request_id: Callable[[int, int], str] = lambda c, i: f"c{c}-r{i}",
    total_requests: int | None = None,
) -> list[ClientResult]:
    """Closed-loop load: ``connections`` threads, each with one keep-alive TCP
    connection, sending requests back to back until ``requests_per_connection``
    are done and/or ``duration_s`` has elapsed (whichever comes first).

    ``total_requests`` caps the number of requests over all connections.
    ``request_id(c, i)`` names each request (sent as X-Request-Id).

    Results are returned ordered by (connection, request index).  A connection
    is only re-opened after the server closed it or we aborted/errored on it.
    Note: receive timestamps are taken in Python threads, so under many
    connections they include GIL hand-off delay (typically tens of µs).
    """
    if requests_per_connection is None and duration_s is None and total_requests is None:
        raise ValueError("give requests_per_connection, duration_s and/or total_requests")

    per_conn: list[list[ClientResult]] = [[] for _ in range(connections)]
    # All threads start sending together, after every connection is set up.
    barrier = threading.Barrier(connections)
    deadline_box: list[int] = []
    deadline_lock = threading.Lock()
    # Requests still to start over all connections (None: no cap).
    left = [total_requests]

    def take_one() -> bool:
        with deadline_lock:
            if left[0] is None:
                return True
            if left[0] <= 0:
                return False
            left[0] -= 1
            return True

    def worker(c: int) -> None:
        out = per_conn[c]
        sock: socket.socket | None = None
        try:
            sock = connect(host, port, timeout)
        except OSError as e:
            out.append(_failed(request_id(c, 0), f"connect: {e}"))
        barrier.wait()
        if sock is None:
            return
        with deadline_lock:
            if not deadline_box:
                deadline_box.append(
                    time.monotonic_ns() + int(duration_s * 1e9) if duration_s else 0
                )
        deadline = deadline_box[0]
        i = 0
        while requests_per_connection is None or i < requests_per_connection:
            if deadline and time.monotonic_ns() >= deadline:
                break
            if not take_one():
                break
            if sock is None:
                try:
                    sock = connect(host, port, timeout)
                except OSError as e:
                    # Don't spin on a dead server: record and stop this worker.
                    out.append(_failed(request_id(c, i), f"connect: {e}"))
                    break
            res = request_once(
                sock,
                host,
                path,
                body_factory(c, i),
                request_id(c, i),
                abort(c, i),
                timeout=timeout,
            )
            out.append(res)
            if not res.conn_reusable:
                sock = None  # request_once closed it
            i += 1
        if sock is not None:
            _close(sock)

    threads = [
        threading.Thread(target=worker, args=(c,), name=f"sse-client-{c}", daemon=True)
        for c in range(connections)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for rs in per_conn for r in rs]


def _failed(request_id: str, error: str) -> ClientResult:
    return ClientResult(
        request_id=request_id,
        status=None,
        t_send_ns=time.monotonic_ns(),
        t_first_byte_ns=None,
        t_event_ns=[],
        t_done_ns=None,
        t_end_ns=None,
        aborted=False,
        error=error,
    )
