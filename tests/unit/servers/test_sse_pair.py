"""Tests of the fake SSE server and the raw-socket client themselves.

No BPF, no root: these pin down the ground truth the tracer tests rely on.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from tests.servers import sse_client
from tests.servers.sse_client import ResponseParser, connect, request_once, run_load
from tests.support.paths import SERVERS

SERVER = SERVERS / "sse_server.py"
HOST = "127.0.0.1"


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log

    def records(self) -> list[dict]:
        if not self.log.exists():
            return []
        with self.log.open() as f:
            return [json.loads(line) for line in f if line.strip()]

    def wait_record(self, request_id: str, timeout: float = 5.0) -> dict:
        """The server logs a request when it *finishes*, which can be after the
        client already has its answer; poll for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.records():
                if r["request_id"] == request_id:
                    return r
            time.sleep(0.01)
        raise AssertionError(f"no server log record for {request_id}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("sse") / "server_log.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--host", HOST, "--port", "0", "--log", str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 15.0)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("LISTENING "):
            raise RuntimeError(f"server did not start (got {line!r}, rc={proc.poll()})")
        port = int(line.split()[1].rsplit(":", 1)[1])
        yield Server(proc, port, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def _raw(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """Send a hand-written request, return (status, headers, body)."""
    with connect(HOST, port, timeout=5) as s:
        s.sendall(request)
        p = ResponseParser()
        while not p.complete:
            data = s.recv(65536)
            if not data:
                p.feed_eof(time.monotonic_ns())
                break
            p.feed(data, time.monotonic_ns())
    return p.status, p.headers, bytes(p.body)


def test_health(server: Server) -> None:
    status, headers, body = _raw(
        server.port, f"GET /health HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
    )
    assert status == 200
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body) == {"status": "ok"}


def test_streaming_timestamps(server: Server) -> None:
    with connect(HOST, server.port) as s:
        res = request_once(
            s,
            HOST,
            "/v1/completions",
            {"prompt": "alpha beta", "max_tokens": 5, "stream": True, "interval_ms": 10},
            "stream-1",
        )
    assert res.error is None and not res.aborted
    assert res.status == 200
    assert res.headers["content-type"].startswith("text/event-stream")
    assert res.headers["transfer-encoding"] == "chunked"
    assert len(res.t_event_ns) == 5
    assert res.t_done_ns is not None and res.t_end_ns is not None
    assert res.t_send_ns < res.t_first_byte_ns <= res.t_event_ns[0]
    texts = [json.loads(e)["choices"][0]["text"] for e in res.events]
    assert texts == ["alpha ", "beta ", "alpha ", "beta ", "alpha "]

    gaps_ms = [(b - a) / 1e6 for a, b in pairwise(res.t_event_ns)]
    assert sorted(gaps_ms)[len(gaps_ms) // 2] == pytest.approx(10, abs=5)
    assert all(2 < g < 100 for g in gaps_ms), gaps_ms

    rec = server.wait_record("stream-1")
    assert rec["outcome"] == "complete" and rec["status"] == 200 and rec["stream"]
    assert rec["n_tokens"] == 5
    chunks = rec["t_chunk_ns"]
    assert len(chunks) == 5
    assert all(a < b for a, b in pairwise(chunks))
    # asyncio.sleep(10 ms) never returns early, so server gaps are >= ~10 ms.
    assert all((b - a) / 1e6 >= 9.5 for a, b in pairwise(chunks))
    # Same CLOCK_MONOTONIC on both sides: a byte cannot be received before
    # the server started writing it.
    assert rec["t_received_ns"] >= res.t_send_ns
    assert rec["t_headers_ns"] < chunks[0]
    for t_srv, t_cli in zip(chunks, res.t_event_ns, strict=True):
        assert t_cli >= t_srv
    assert res.t_done_ns >= rec["t_done_ns"] > chunks[-1]
    assert rec["t_eof_ns"] >= rec["t_done_ns"]
    assert res.t_end_ns >= rec["t_eof_ns"]


def test_chat_streaming(server: Server) -> None:
    with connect(HOST, server.port) as s:
        res = request_once(
            s,
            HOST,
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "user", "content": "there"},
                ],
                "max_tokens": 3,
                "stream": True,
                "interval_ms": [1, 2, 3],
            },
            "chat-1",
        )
    assert res.status == 200 and len(res.t_event_ns) == 3 and res.t_done_ns
    words = [json.loads(e)["choices"][0]["delta"]["content"] for e in res.events]
    assert words == ["hi ", "there ", "hi "]
    assert server.wait_record("chat-1")["path"] == "/v1/chat/completions"


def test_non_streaming(server: Server) -> None:
    marker = "SECRET-MARKER-42"
    with connect(HOST, server.port) as s:
        res = request_once(
            s,
            HOST,
            "/v1/completions",
            {"prompt": f"x {marker}", "max_tokens": 4, "interval_ms": 2},
            "unary-1",
        )
    assert res.status == 200 and res.error is None
    assert int(res.headers["content-length"]) == len(res.body)
    assert "transfer-encoding" not in res.headers
    assert res.t_event_ns == [] and res.t_done_ns is None
    body = json.loads(res.body)
    assert body["choices"][0]["text"] == f"x {marker} x {marker} "
    rec = server.wait_record("unary-1")
    assert rec["outcome"] == "complete" and rec["stream"] is False
    assert rec["t_response_ns"] - rec["t_received_ns"] >= 8_000_000
    assert rec["t_chunk_ns"] == [] and rec["t_headers_ns"] is None
    assert res.t_end_ns >= rec["t_response_ns"]


def test_forced_status(server: Server) -> None:
    with connect(HOST, server.port) as s:
        res = request_once(
            s,
            HOST,
            "/v1/completions",
            {"prompt": "p", "stream": True, "status": 503},
            "err-503",
        )
    assert res.status == 503
    assert int(res.headers["content-length"]) == len(res.body)
    assert "error" in json.loads(res.body)
    rec = server.wait_record("err-503")
    assert rec["status"] == 503 and rec["outcome"] == "error"


def test_invalid_json_and_missing_prompt(server: Server) -> None:
    bad = b"{not json"
    status, headers, body = _raw(
        server.port,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: bad-json\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(bad), bad),
    )
    assert status == 400 and "error" in json.loads(body)
    assert server.wait_record("bad-json")["outcome"] == "error"

    with connect(HOST, server.port) as s:
        res = request_once(s, HOST, "/v1/completions", {"max_tokens": 2}, "no-prompt")
    assert res.status == 400


def test_keep_alive_reuse(server: Server) -> None:
    s = connect(HOST, server.port)
    try:
        local = s.getsockname()
        for i in range(3):
            res = request_once(
                s,
                HOST,
                "/v1/completions",
                {"prompt": "k", "max_tokens": 2, "stream": i != 1, "interval_ms": 1},
                f"ka-{i}",
            )
            assert res.status == 200 and res.conn_reusable, res
        peers = {server.wait_record(f"ka-{i}")["peer"] for i in range(3)}
        assert peers == {f"{local[0]}:{local[1]}"}
    finally:
        s.close()


def test_abort_mid_stream(server: Server) -> None:
    s = connect(HOST, server.port)
    res = request_once(
        s,
        HOST,
        "/v1/completions",
        {"prompt": "a b c", "max_tokens": 20, "stream": True, "interval_ms": 20},
        "abort-1",
        abort_after_events=2,
    )
    assert res.aborted and not res.conn_reusable
    assert len(res.t_event_ns) == 2 and res.t_done_ns is None
    assert s.fileno() == -1  # request_once closed it
    rec = server.wait_record("abort-1")
    assert rec["outcome"] == "aborted"
    # The server notices on its next write after the client's FIN.
    assert 2 <= rec["n_tokens"] < 20
    assert rec["t_done_ns"] is None and rec["t_eof_ns"] is None


def test_run_load(server: Server) -> None:
    results = run_load(
        HOST,
        server.port,
        connections=4,
        requests_per_connection=3,
        body_factory=lambda c, i: {
            "prompt": f"conn{c} req{i}",
            "max_tokens": 4,
            "stream": True,
            "interval_ms": 2,
        },
    )
    assert [r.request_id for r in results] == [f"c{c}-r{i}" for c in range(4) for i in range(3)]
    for r in results:
        assert r.error is None and not r.aborted and r.status == 200, r
        assert len(r.t_event_ns) == 4 and r.t_done_ns and r.t_end_ns
    for r in results:
        assert server.wait_record(r.request_id)["outcome"] == "complete"
    # One keep-alive connection per client thread.
    peers = {}
    for r in results:
        peers.setdefault(r.request_id.split("-")[0], set()).add(
            server.wait_record(r.request_id)["peer"]
        )
    assert all(len(p) == 1 for p in peers.values())


def test_run_load_with_abort_reconnects(server: Server) -> None:
    results = run_load(
        HOST,
        server.port,
        connections=2,
        requests_per_connection=3,
        body_factory=lambda c, i: {
            "prompt": "z",
            "max_tokens": 3,
            "stream": True,
            "interval_ms": 5,
        },
        abort=lambda c, i: 1 if i == 0 else None,
    )
    assert len(results) == 6
    assert [r.aborted for r in results] == [True, False, False] * 2
    assert all(r.error is None for r in results)


def test_summary_cli(server: Server) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(SERVERS / "sse_client.py"),
            "--port",
            str(server.port),
            "--connections",
            "2",
            "--requests",
            "2",
            "--max-tokens",
            "3",
            "--interval-ms",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    summary = json.loads(out.stdout)
    assert summary["requests"] == 4 and summary["completed"] == 4
    assert summary["tokens"] == 12 and summary["itl_ms_p50"] is not None


# -- parser unit tests (no server) -------------------------------------------


def _chunk(data: bytes, ext: bytes = b"") -> bytes:
    return b"%x%s\r\n%s\r\n" % (len(data), ext, data)


_SSE_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\nX-Dup: a\r\nx-dup: b\r\n\r\n"
    + _chunk(b'data: {"a":1}\n\n')
    # One event split over two chunks, CRLF line endings, two data lines.
    + _chunk(b"data: two\r\nda", b";ext=1")
    + _chunk(b"ta: x\r\n\r\n: comment\n\n")
    + _chunk(b"data: [DONE]\n\n")
    + b"0\r\nTrailer: t\r\n\r\n"
)


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(_SSE_RESPONSE)])
def test_parser_arbitrary_splits(step: int) -> None:
    events: list[tuple[str, int]] = []
    p = ResponseParser(lambda d, t: events.append((d, t)))
    for n, off in enumerate(range(0, len(_SSE_RESPONSE), step)):
        p.feed(_SSE_RESPONSE[off : off + step], n)
    assert p.complete and p.status == 200
    assert p.headers["x-dup"] == "a, b"
    assert [d for d, _ in events] == ['{"a":1}', "two\nx", "[DONE]"]
    # Each event is stamped with the feed() call that completed it.
    ts = [t for _, t in events]
    assert ts == sorted(ts)
    if step == 1:
        ends = [
            _SSE_RESPONSE.index(b"\n\n\r\n") + 1,
            _SSE_RESPONSE.index(b"x\r\n\r\n") + 4,
            _SSE_RESPONSE.index(b"[DONE]\n\n") + 7,
        ]
        assert ts == ends


def test_parser_content_length_and_close() -> None:
    p = ResponseParser()
    p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel", 0)
    assert not p.complete
    p.feed(b"lo", 1)
    assert p.complete and bytes(p.body) == b"hello" and p.keep_alive

    p = ResponseParser()
    p.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nabc", 0)
    assert p.status == 200 and not p.complete
    p.feed_eof(1)
    assert p.complete and bytes(p.body) == b"abc" and not p.keep_alive

    p = ResponseParser()
    p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", 0)
    with pytest.raises(sse_client.ProtocolError):
        p.feed_eof(1)


def test_server_sigterm_flushes_inflight(tmp_path: Path) -> None:
    """SIGTERM with a stream in flight: clean exit, the request is logged."""
    log = tmp_path / "log.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", "--log", str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(proc.stdout.readline().split(":")[-1])
        s = socket.create_connection((HOST, port))
        body = json.dumps(
            {"prompt": "p", "max_tokens": 1000, "stream": True, "interval_ms": 10}
        ).encode()
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: term-1\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        s.recv(1024)  # headers arrived: the handler is running
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        s.close()
        recs = [json.loads(line) for line in log.read_text().splitlines()]
        assert [r["request_id"] for r in recs] == ["term-1"]
        assert recs[0]["outcome"] == "aborted"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
