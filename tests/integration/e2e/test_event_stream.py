"""AWS event streams (Bedrock): bpf/protocols/event_stream.bpf.h against exact bytes, and
servers that speak them.

A scripted server answers with Bedrock's wire format, message by message
and coalesced, plain and vectored, over a real TCP connection; the tracer's
io_events for its writes are compared with what each write holds: token
messages (invoke's chunks of Anthropic's content_block_delta or of another
model, converse's contentBlockDelta), the other events, converse's stated
usage, an exception and its type, and the end of the chunked body. The
messages are built by tests/support/aws_event_stream.py, which botocore
reads back (CRCs checked) in the SDK tests.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferprobe.collector.model.events import HttpFlag, HttpKind, StreamFlag

from tests.integration.e2e.test_stream_shapes import MEDIAN_ERROR_NS, P99_ERROR_NS, write_errors
from tests.support.aws_event_stream import anthropic_events, chunk, converse_events, exception
from tests.support.kernel import bytes_moved, needs_root, scripted_exchange
from tests.support.node import node_binary, node_package
from tests.support.paths import PROGRAMS, SERVERS
from tests.support.processes import Recorder, report_json_text, stop_process
from tests.support.tls import self_signed_certificate

pytestmark = [pytest.mark.bpf, needs_root]

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.amazon.eventstream\r\n"
        b"Transfer-Encoding: chunked\r\nx-amzn-RequestId: r1\r\n\r\n")
REQUEST = b"POST /model/anthropic.claude/invoke-with-response-stream HTTP/1.1\r\nHost: h\r\n\r\n"


def chunked(payload: bytes) -> bytes:
    return b"%x\r\n" % len(payload) + payload + b"\r\n"


ANTHROPIC = [chunk(e) for e in anthropic_events(["Hi", " there", "!"], input_tokens=9)]
CONVERSE = converse_events(["a", "b", "c", "d"], input_tokens=3)
# (the writes of one response, and per write: token messages, other events, usage (out, in), exception)
CASES = {
    "one message per write, Anthropic's events told apart by their base64 type": (
        [chunked(m) for m in ANTHROPIC] + [b"0\r\n\r\n"],
        [(0, 1), (0, 1), (0, 1), (1, 0), (1, 0), (1, 0), (0, 1), (0, 1), (0, 1), (0, 0)]),
    "the whole stream in one write, across the 512-byte windows": (
        [b"".join(chunked(m) for m in ANTHROPIC) + b"0\r\n\r\n"], [(3, 6)]),
    "another model's chunks are tokens": (
        [chunked(chunk({"generation": "Hello", "stop_reason": None})) + chunked(chunk({"outputText": "x"}))],
        [(2, 0)]),
    "converse-stream: deltas, events and the metadata's usage": (
        [b"".join(chunked(m) for m in CONVERSE)], [(4, 4, (4, 3))]),
    "chunk framing as iovecs of their own, as Node and hyper write it": (
        [[b"%x\r\n" % len(m), m, b"\r\n"] for m in CONVERSE[1:3]], [(1, 0), (1, 0)]),
    "an exception ends the stream, named": (
        [chunked(CONVERSE[1]), chunked(exception("throttlingException", "Too many tokens, please wait."))],
        [(1, 0), (0, 0, None, "throttlingException")]),
}


@pytest.mark.parametrize("pending", ["auto", "hash"])   # with bpf_loop, and without (sock_hash.bpf.o)
def test_each_write_counts_its_messages(tmp_path, pending, python_script):
    exchanges = [(REQUEST, [HEAD, *writes]) for writes, _ in CASES.values()]
    events, counters, pid = scripted_exchange(python_script, tmp_path, exchanges,
                                              options={"sockets": {"pending": pending}})
    writes = [e for e in bytes_moved(events, pid) if not e.is_read]
    heads = [e for e in writes if e.kind == HttpKind.RESPONSE]
    assert len(heads) == len(CASES)
    assert all(StreamFlag.AWS_EVENTS in h.stream_flags and HttpFlag.CHUNKED in h.flags for h in heads)
    bodies = [e for e in writes if e.kind == HttpKind.DATA]
    want = [w for _, per_write in CASES.values() for w in per_write]
    got = []
    for ev, expected in zip(bodies, want, strict=True):
        usage = (ev.output_tokens, ev.input_tokens) if ev.output_tokens is not None else None
        error = ev.event_name if StreamFlag.EXCEPTION in ev.stream_flags else None
        got.append((ev.sse_events, ev.named_events, usage, error)[:len(expected)])
    assert got == want
    assert HttpFlag.CHUNKED_END in bodies[len(CASES[next(iter(CASES))][1]) - 1].flags
    assert counters["events_lost"] == 0


def test_a_server_sent_event_body_is_not_read_as_messages(tmp_path, python_script):
    """The event-stream scan is the connection's only after its response said so:
    the next response on the same connection, SSE, is read as lines again."""
    sse_head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    exchanges = [(REQUEST, [HEAD, chunked(CONVERSE[1])]),
                 (REQUEST, [sse_head, chunked(b'data: {"a":1}\n\n'), b"0\r\n\r\n"])]
    events, _, pid = scripted_exchange(python_script, tmp_path, exchanges)
    writes = [(e.kind, e.sse_events, StreamFlag.AWS_EVENTS in e.stream_flags)
              for e in bytes_moved(events, pid) if not e.is_read]
    assert writes == [(HttpKind.RESPONSE, 0, True), (HttpKind.DATA, 1, False),
                      (HttpKind.RESPONSE, 0, False), (HttpKind.DATA, 1, False), (HttpKind.DATA, 0, False)]



# ---------------------------------------------------------------- the server side, with the real SDKs
#
# Servers that speak Bedrock's wire format, traced: FastAPI/uvicorn (HTTP/1.1, plain
# and TLS: tests/servers/stream_shapes_fastapi.py) called by boto3 (converse-stream)
# and anthropic's AnthropicBedrock (invoke-with-response-stream), and Node's http2
# module (h2c and TLS: tests/servers/bedrock_h2_server.js) called by the AWS SDK for
# JavaScript. Each token message's write is timed against the server's own clock
# (test_stream_shapes' bounds and tolerances); counts are exact.
TOKENS, CALLS = 5, 2
SERVER_SIDE = {
    "uvicorn": ("http", ["boto3", "bedrock"]),
    "uvicorn-tls": ("https", ["boto3", "bedrock"]),
    "node-h2": ("http", ["bedrock-node"]),
    # Node's http2 over TLS writes its SETTINGS before it reads the client's preface, at
    # times: the TLS session's first call is then a write, as a client's is (bpf/sock.bpf.c,
    # tls_tie_late)
    "node-h2-tls": ("https", ["bedrock-node"]),
}


def _server(stack: str, tmp_path: Path, log: Path) -> list[str]:
    if stack.startswith("node"):
        return [node_binary(), str(SERVERS / "bedrock_h2_server.js"), str(log)]
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (the test extra installs it)")
    pytest.importorskip("boto3", reason="boto3 is not installed (the test extra installs it)")
    return [sys.executable, str(SERVERS / "stream_shapes_fastapi.py"), str(log)]


def _client(sdk: str, base_url: str) -> tuple[list[str], dict]:
    if sdk == "bedrock-node":
        env = {**os.environ, "NODE_PATH": node_package("@aws-sdk/client-bedrock-runtime"),
               "NODE_TLS_REJECT_UNAUTHORIZED": "0"}
        program = str(PROGRAMS / "bedrock_node_client.mjs")
        return [node_binary(), program, base_url, str(CALLS), str(TOKENS)], env
    return [sys.executable, str(PROGRAMS / "llm_sdk_client.py"), sdk, base_url, str(CALLS), str(TOKENS),
            "--wait"], dict(os.environ)


@pytest.fixture(scope="module", params=list(SERVER_SIDE))
def served(request, tmp_path_factory):
    stack = request.param
    scheme, sdks = SERVER_SIDE[stack]
    tmp_path = tmp_path_factory.mktemp(f"bedrock-{stack}")
    log = tmp_path / "server.log"
    env = {**os.environ, **(self_signed_certificate(tmp_path) if scheme == "https" else {})}
    server = subprocess.Popen(_server(stack, tmp_path, log), stdout=subprocess.PIPE, text=True, env=env)
    recording = tmp_path / "run.ipr"
    try:
        port = int(server.stdout.readline())
        rec = Recorder([server.pid], recording, "--duration", "120")
        try:
            for sdk in sdks:
                command, client_env = _client(sdk, f"{scheme}://127.0.0.1:{port}")
                # each client waits for a line once ready (a tracer of its own would attach then)
                subprocess.run(command, input="go\n", capture_output=True, text=True, env=client_env,
                               check=True, timeout=120)
            time.sleep(0.3)   # the last close reaches the tracer
        finally:
            rec.stop()
    finally:
        stop_process(server)
    report = json.loads(report_json_text(recording))
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    # the Node client's warm-up call (k = -1) is served and recorded too; the Python ones have none
    return {"stack": stack, "tls": scheme == "https", "report": report, "served": logged,
            "recording": recording}


def test_each_token_message_is_a_chunk_timed_by_the_servers_clock(served):
    requests = sorted(served["report"]["requests"], key=lambda r: r["t_ingress_ns"])
    assert len(requests) == len(served["served"]) > 0
    errors = []
    for rec, logged in zip(requests, served["served"], strict=True):
        assert rec["role"] == "server" and rec["path"] == logged["path"]
        assert rec["outcome"] == "complete" and rec["status"] == 200
        assert rec["stream_format"] == "aws-eventstream" and rec["streaming"]
        assert rec["protocol"] == ("h2" if served["stack"].startswith("node") else "http/1.1")
        assert rec["transport"] == ("tls" if served["tls"] else "socket")
        assert rec["token_chunk_events"] == [1] * TOKENS == [1] * len(logged["token_ns"])
        errors += write_errors(rec["token_ns"], logged)
        if rec["path"].endswith("/converse-stream") and rec["protocol"] == "http/1.1":
            assert rec["usage"] == {"output_tokens": TOKENS, "input_tokens": 7}
    abs_errors = sorted(abs(e) for e in errors)
    assert statistics.median(abs_errors) < MEDIAN_ERROR_NS, statistics.median(abs_errors)
    assert abs_errors[int(0.99 * (len(abs_errors) - 1))] < P99_ERROR_NS
    assert min(errors) >= 0
    assert served["report"]["lost_events"] == 0


def test_no_signature_token_or_prompt_reaches_the_recording(served):
    raw = served["recording"].read_bytes()
    for secret in ("sk-SECRET-b7c2e9", "AKIDEXAMPLE", "PRIVATE-MARKER-5e1d"):
        assert secret.encode() not in raw
