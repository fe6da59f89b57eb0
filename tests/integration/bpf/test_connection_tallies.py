"""bpf/host_wide.bpf.c's tallies: every connection a host-wide target accepts is
counted and timed in the kernel, followed in full or not.

Two servers, one tracer filtered to their ports: Python's aiohttp
(tests/servers/sse_server.py) with none of its connections followed (the
agent's sampling at its lowest), then Node's http (tests/servers/
stream_shapes.js) with every one followed; last, Node's https with none
followed, whose TLS session must then stay unfollowed too. The client times each request
itself on CLOCK_MONOTONIC, from just before its send to the response's last
byte; the servers log when they read the request (aiohttp) and when they
wrote each token. Each request's kernel turn lies inside the client's span
and covers the server's own first-to-last-token span, so the exact sums and
every cumulative log2 bucket are bounded on both sides by what the two
programs measured themselves. Counts are exact.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from inferprobe.collector.attach.probe_sets.host_wide import host_wide_set
from inferprobe.collector.model.connection_tallies import BUCKETS, ConnectionTallies, read_tallies
from inferprobe.collector.model.events import IoRecord
from inferprobe.collector.processes import host_wide

from tests.support.kernel import KernelCapture, needs_root
from tests.support.paths import SERVERS
from tests.support.processes import ServerProcess, stop_process
from tests.support.tls import self_signed_certificate

pytestmark = [needs_root, pytest.mark.bpf]

TOKENS, INTERVAL_MS = 4, 25
AIOHTTP_BODY = {"prompt": "hi", "max_tokens": TOKENS, "interval_ms": INTERVAL_MS, "stream": True}
NODE_BODY = {"model": "m", "prompt": "hi", "tokens": TOKENS, "interval_ms": INTERVAL_MS}
GAP_FLOOR_BUCKET = 24   # 2^23 ns = 8.4 ms < INTERVAL_MS: every token-to-token gap is in bucket 24 or above


def _timed_post(conn: http.client.HTTPConnection, path: str, body: dict) -> tuple[int, int]:
    t0 = time.monotonic_ns()
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    response_body = response.read()
    t1 = time.monotonic_ns()
    assert response.status == 200 and response_body.count(b"data:") >= TOKENS
    return t0, t1


def _assert_bounded(tallies: ConnectionTallies, spans: list[tuple[int, int]], floors: list[int]) -> None:
    """Each turn <= its client span and >= the server's own span: so for every bucket edge, the
    turns below it are at least the client spans below it and at most the server spans below it."""
    turn = tallies.histograms["turn"]
    client = [t1 - t0 for t0, t1 in spans]
    assert sum(floors) <= turn.sum_ns <= sum(client), (floors, turn.sum_ns, client)
    for k in range(BUCKETS):
        edge = 1 << k
        assert sum(c < edge for c in client) <= turn.cumulative(k) <= sum(f < edge for f in floors), k


def _assert_counts(tallies: ConnectionTallies, connections: int, requests: int) -> None:
    c = tallies.counters
    assert c["connections"] == connections and c["turns"] == requests and c["unanswered"] == 0, c
    assert tallies.histograms["turn"].count == tallies.histograms["first_write"].count == requests
    # every response write but each turn's first is one gap
    gaps = tallies.histograms["write_gap"]
    assert gaps.count == c["writes"] - requests and c["writes"] >= requests * TOKENS, c
    token_gaps = sum(gaps.counts[GAP_FLOOR_BUCKET:])
    assert token_gaps >= requests * (TOKENS - 1), gaps.counts


def _settled(bpf, pid: int) -> ConnectionTallies:
    """The tallies once the server closed every connection the client made: a connection's last turn
    is counted at its close(), which on a loaded host may come a while after the client's."""
    deadline = time.monotonic() + 10
    while any(key.pid == pid for key in bpf[b"tally_turns"].keys()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return read_tallies(bpf)


def _node_server(log: Path, env: dict | None = None) -> subprocess.Popen:
    node = shutil.which("node") or pytest.skip("node is not installed (make setup installs it)")
    proc = subprocess.Popen([node, str(SERVERS / "stream_shapes.js"), str(log)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})
    proc.port = int(proc.stdout.readline())   # type: ignore[attr-defined]
    return proc


def test_every_accepted_connection_is_tallied_followed_or_not(tmp_path):
    aio = ServerProcess(tmp_path / "aiohttp.jsonl")
    node = _node_server(tmp_path / "node.jsonl")
    tls_node = _node_server(tmp_path / "node_tls.jsonl", self_signed_certificate(tmp_path))
    filters = host_wide.make_filters((aio.port, node.port, tls_node.port), None, None)
    try:
        options = {"host_wide": {"filters": filters}, "tls": "auto"}
        with KernelCapture([aio.pid, node.pid, tls_node.pid], sets=("sockets", "tls", "host_wide"),
                           options=options, ringbuf_pages=256) as cap:
            assert "tls" in cap.tracer.active, cap.tracer.inactive
            bpf = cap.tracer.bpf
            host = host_wide_set(cap.tracer)
            start = read_tallies(bpf)

            # aiohttp, nothing followed: a fresh connection per request, two requests on one more
            host.set_follow_ratio(bpf, 0.0)
            aio_spans = []
            for _ in range(3):
                conn = http.client.HTTPConnection("127.0.0.1", aio.port, timeout=10)
                aio_spans.append(_timed_post(conn, "/v1/completions", AIOHTTP_BODY))
                conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", aio.port, timeout=10)
            for _ in range(2):
                aio_spans.append(_timed_post(conn, "/v1/completions", AIOHTTP_BODY))
            conn.close()
            after_aio = _settled(bpf, aio.pid)

            # Node, everything followed: four keep-alive requests on one connection
            host.set_follow_ratio(bpf, 1.0)
            conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
            node_spans = [_timed_post(conn, "/v1/chat/completions", NODE_BODY) for _ in range(4)]
            conn.close()
            after_node = _settled(bpf, node.pid)

            # Node over TLS, nothing followed: three requests on one connection
            host.set_follow_ratio(bpf, 0.0)
            own_certificate = ssl._create_unverified_context()
            conn = http.client.HTTPSConnection("127.0.0.1", tls_node.port, timeout=10,
                                               context=own_certificate)
            tls_spans = [_timed_post(conn, "/v1/chat/completions", NODE_BODY) for _ in range(3)]
            conn.close()
            after_tls = _settled(bpf, tls_node.pid)
            events, _ = cap.finish()
    finally:
        aio.stop()
        stop_process(node)
        stop_process(tls_node)

    aio_tallies, node_tallies = after_aio.minus(start), after_node.minus(after_aio)
    _assert_counts(aio_tallies, connections=4, requests=5)
    _assert_counts(node_tallies, connections=1, requests=4)

    aio_log = [json.loads(line) for line in (tmp_path / "aiohttp.jsonl").read_text().splitlines()]
    assert len(aio_log) == 5
    _assert_bounded(aio_tallies, aio_spans, [e["t_chunk_ns"][-1] - e["t_received_ns"] for e in aio_log])
    node_log = [json.loads(line) for line in (tmp_path / "node.jsonl").read_text().splitlines()]
    assert len(node_log) == 4
    _assert_bounded(node_tallies, node_spans, [e["token_ns"][-1] - e["token_ns"][0] for e in node_log])

    # Over TLS the tallies see the ciphertext: the handshake is one more turn (ClientHello read, the
    # server's flight written), or two when the server writes its session tickets before the request.
    tls_tallies = after_tls.minus(after_node)
    c = tls_tallies.counters
    assert c["connections"] == 1 and 3 + 1 <= c["turns"] <= 3 + 2 and c["unanswered"] == 0, c
    assert len(tls_spans) == 3

    # Unfollowed connections sent nothing, TLS plaintext included; followed ones their full timelines.
    moved = [e for e in events if isinstance(e, IoRecord) and e.bytes > 0]
    assert not [e for e in moved if e.pid in (aio.pid, tls_node.pid)]
    assert [e for e in moved if e.pid == node.pid]
