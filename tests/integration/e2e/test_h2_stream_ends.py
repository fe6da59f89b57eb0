"""End to end: an LLM stream over HTTP/2 ends at its end marker, and its finish
chunk is no token, also when they share the last DATA frame.

An OpenAI-style stream ends with a chunk whose delta is empty (the finish
reason, or the usage) and "data: [DONE]"; an Ollama one with a line saying
"done": true. Servers often write the end together with the last token or
the finish chunk, so over HTTP/2 one DATA frame holds several events. The
kernel scans such a frame's lines as it scans an HTTP/1 body write
(bpf/sock.bpf.c, h2_scan_data).

Stacks: hypercorn (Python) serving the FastAPI app of the stream-shape
tests over HTTP/2 on TLS (ALPN h2), called by httpx's HTTP/2 client; and
Node's http2 server over h2c ending each stream with a finish chunk and
[DONE] in one write, called by Node's http2 client. Server and client are
both recorded.

Ground truth: the tokens each call asked for, and each client's own clock
for when they arrived. Every stream is complete with exactly its tokens
(no finish, usage or [DONE] chunk counted), its end marker found, and no
earlier than its last token.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.kernel import needs_root
from tests.support.node import node_binary
from tests.support.paths import PROGRAMS, SERVERS
from tests.support.processes import Recorder, report_json_text, stop_process
from tests.support.tls import self_signed_certificate

pytestmark = [needs_root, pytest.mark.bpf]

CALLS, TOKENS = 3, 4
HYPERCORN_PATHS = ("/v1/chat/completions", "/api/generate")   # OpenAI SSE, Ollama NDJSON
SECRET = "sk-SECRET-h2end-77c1"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    pytest.importorskip("hypercorn")
    pytest.importorskip("h2")
    base = tmp_path_factory.mktemp("h2end")
    tls = self_signed_certificate(base)
    cert, key = tls["STREAM_SHAPES_TLS_CERT"], tls["STREAM_SHAPES_TLS_KEY"]
    hypercorn = subprocess.Popen(
        [sys.executable, str(SERVERS / "stream_shapes_hypercorn.py"), str(base / "log"), cert, key],
        stdout=subprocess.PIPE, text=True, cwd=SERVERS)
    node = subprocess.Popen([node_binary(), str(SERVERS / "h2_token_server.js")], stdout=subprocess.PIPE,
                            text=True)
    clients: list[subprocess.Popen] = []
    try:
        hypercorn_port = int(hypercorn.stdout.readline())
        node_port = int(node.stdout.readline().split()[1])
        httpx_client = subprocess.Popen(
            [sys.executable, str(PROGRAMS / "h2_stream_client.py"), str(hypercorn_port), str(CALLS),
             str(TOKENS), *HYPERCORN_PATHS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        clients.append(httpx_client)
        assert httpx_client.stdout.readline().strip() == "READY"
        recording = base / "run.ipr"
        rec = Recorder([hypercorn.pid, node.pid, httpx_client.pid], recording, "--duration", "120")
        try:
            httpx_client.stdin.write("go\n")
            httpx_client.stdin.flush()
            httpx_out, _ = httpx_client.communicate(timeout=60)
            # Node's client is not recorded (it starts after attach): its server's side is checked
            # here, the client side on httpx's.
            node_out = subprocess.run([node_binary(), str(PROGRAMS / "h2_sse_client.js"), str(node_port),
                                       str(CALLS), str(TOKENS), SECRET, "finish"],
                                      capture_output=True, text=True, timeout=60, check=True).stdout
            time.sleep(0.3)
        finally:
            rec.stop()
    finally:
        for proc in (*clients, hypercorn, node):
            stop_process(proc)
    report = json.loads(report_json_text(recording))
    by_pid = lambda pid: sorted((r for r in report["requests"] if r["pid"] == pid),  # noqa: E731
                                key=lambda r: r["t_ingress_ns"])
    return {"report": report,
            "hypercorn": by_pid(hypercorn.pid), "httpx": by_pid(httpx_client.pid), "node": by_pid(node.pid),
            "httpx_calls": [json.loads(line) for line in httpx_out.splitlines()],
            "node_calls": [json.loads(line) for line in node_out.splitlines()]}


def check_streams(requests: list[dict], calls: list[dict], paths: list[str]) -> None:
    assert [r["path"] for r in requests] == paths
    for req, call in zip(requests, calls, strict=True):
        where = (req["role"], req["path"])
        assert req["protocol"] == "h2" and req["outcome"] == "complete", where
        assert len(call["received_ns"]) == TOKENS, where   # the client's own count
        assert len(req["token_ns"]) == TOKENS and sum(req["token_chunk_events"]) == TOKENS, where
        assert req["t_done_ns"] is not None and req["t_done_ns"] >= req["token_ns"][-1], where


def test_hypercorn_streams_end_at_their_marker_with_exact_tokens(recorded):
    paths = [p for p in HYPERCORN_PATHS for _ in range(CALLS)]
    check_streams(recorded["hypercorn"], recorded["httpx_calls"], paths)
    assert all(r["transport"] == "tls" for r in recorded["hypercorn"])


def test_httpx_reads_the_same_ends_on_the_client_side(recorded):
    paths = [p for p in HYPERCORN_PATHS for _ in range(CALLS)]
    check_streams(recorded["httpx"], recorded["httpx_calls"], paths)
    # the client's reads are its tokens' arrival: never before the tracer saw the read
    for req, call in zip(recorded["httpx"], recorded["httpx_calls"], strict=True):
        assert all(t <= got for t, got in zip(req["token_ns"], call["received_ns"], strict=True))


def test_node_finish_chunk_and_done_in_one_frame(recorded):
    check_streams(recorded["node"], recorded["node_calls"], ["/v1/chat/completions"] * CALLS)


def test_no_secret_or_prompt_reaches_the_report(recorded):
    raw = json.dumps(recorded["report"])
    assert SECRET not in raw and "PRIVATE" not in raw
