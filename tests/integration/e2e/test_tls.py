"""End to end over TLS: real SDK clients, a TLS library loaded after attach, traffic nothing reads.

1. uvicorn serving HTTPS (asyncio's memory BIO over the shared libssl), called
   by the official openai and anthropic SDKs (PyPI) in a client process that
   timed each chunk's arrival itself. Every call is found with its exact
   chunk count; the tracer's chunk times (SSL_write entries) are within the
   plain-socket tolerances of the server's own clock and before the client
   received each chunk; the prompt marker and the API key reach no output.
2. A server that imports ssl only after the tracer attached (record --tls):
   libssl is mapped late, found by the re-scan, and its blocking ssl sockets
   (a socket BIO: OpenSSL writes the socket itself) give each first token the
   socket write that carried it.
3. A connection that sends a TLS ClientHello to a plain HTTP/1.1 server moves
   bytes nothing recognises: the report counts and names it.
4. A Rust server on hyper and tokio-rustls (rustls compiled in, its symbols
   kept: tests/programs/rustls_sse), called by a Rust client: every call is
   found with its exact chunks at the server's clock, on its connection, and
   no connection is left unrecognised. (The client's side of the same
   programs is in test_client_calls.py.)
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.e2e.test_stream_shapes import write_errors
from tests.support.kernel import needs_root
from tests.support.paths import PROGRAMS, SERVERS
from tests.support.processes import Recorder, report_json_text, stop_process
from tests.support.rust import rustls_program, start_rustls_server
from tests.support.tls import self_signed_certificate

pytestmark = [needs_root, pytest.mark.bpf]

MARKER = "PRIVATE-MARKER-5e1d"
SECRET = "sk-SECRET-b7c2e9"
MEDIAN_ERROR_NS, P99_ERROR_NS = 100_000, 1_000_000
CALLS, TOKENS = 6, 7


def report_json(recording: Path) -> dict:
    return json.loads(report_json_text(recording))


def within_tolerance(errors: list[int]) -> None:
    abs_errors = sorted(abs(e) for e in errors)
    p99 = abs_errors[min(len(abs_errors) - 1, int(0.99 * len(abs_errors)))]
    assert statistics.median(abs_errors) < MEDIAN_ERROR_NS, statistics.median(abs_errors)
    assert p99 < P99_ERROR_NS, p99
    assert min(errors) >= 0, min(errors)  # the library call comes after the server's clock read


@pytest.fixture(scope="module")
def sdk_calls(tmp_path_factory):
    for module in ("openai", "anthropic", "uvicorn"):
        pytest.importorskip(module, reason=f"{module} is not installed (the test extra installs it)")
    tmp_path = tmp_path_factory.mktemp("tls-sdk")
    log = tmp_path / "server.log"
    env = {**os.environ, **self_signed_certificate(tmp_path)}
    server = subprocess.Popen([sys.executable, str(SERVERS / "stream_shapes_fastapi.py"), str(log)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(server.stdout.readline())
        recording = tmp_path / "run.ipr"
        rec = Recorder([server.pid], recording, "--duration", "120")
        client_out = []
        for sdk in ("openai", "anthropic"):
            done = subprocess.run([sys.executable, str(PROGRAMS / "llm_sdk_client.py"), sdk,
                                   f"https://127.0.0.1:{port}", str(CALLS), str(TOKENS)],
                                  capture_output=True, text=True, timeout=120, check=True)
            client_out += [json.loads(line) for line in done.stdout.splitlines()]
        time.sleep(0.3)
        rec.stop()
    finally:
        stop_process(server)
    served = [json.loads(line) for line in log.read_text().splitlines()]
    return {"report": report_json(recording), "recording": recording, "client": client_out, "served": served}


def test_every_sdk_call_is_found_with_exact_chunks_and_server_times(sdk_calls):
    recorded = sorted(sdk_calls["report"]["requests"], key=lambda r: r["t_ingress_ns"])
    client, served = sdk_calls["client"], sdk_calls["served"]
    assert len(recorded) == len(client) == len(served) == 2 * CALLS
    errors = []
    for rec, call, srv in zip(recorded, client, served, strict=True):
        assert rec["transport"] == "tls" and rec["outcome"] == "complete" and rec["status"] == 200
        assert rec["path"] == call["path"] == srv["path"] and rec["model"] == call["model"]
        assert len(rec["token_ns"]) == TOKENS == len(call["received_ns"]) == len(srv["token_ns"])
        errors += write_errors(rec["token_ns"], srv)
        # each chunk left the server before the client's SDK handed it over
        assert all(t < r for t, r in zip(rec["token_ns"], call["received_ns"], strict=True))
    within_tolerance(errors)
    assert sdk_calls["report"]["lost_events"] == 0


def test_sdk_calls_keep_their_connections(sdk_calls):
    connections = {c["conn_id"]: c for c in sdk_calls["report"]["connections"]}
    for rec in sdk_calls["report"]["requests"]:
        conn = connections[rec["conn"]]
        assert conn["peer"] == "127.0.0.1" and conn["fd"] >= 0


def test_no_prompt_or_api_key_reaches_the_outputs(sdk_calls):
    raw = sdk_calls["recording"].read_bytes()
    text = json.dumps(sdk_calls["report"])
    for secret in (MARKER, SECRET, "say something"):
        assert secret.encode() not in raw
        assert secret not in text


def test_a_tls_library_loaded_after_attach_is_read(tmp_path):
    cert = self_signed_certificate(tmp_path)
    log = tmp_path / "server.log"
    server = subprocess.Popen([sys.executable, str(SERVERS / "late_tls_sse.py"),
                               cert["STREAM_SHAPES_TLS_CERT"], cert["STREAM_SHAPES_TLS_KEY"], str(log)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        maps = Path(f"/proc/{server.pid}/maps").read_text()
        assert "libssl" not in maps  # nothing TLS yet: the test's premise
        recording = tmp_path / "run.ipr"
        # (--no-engine-metrics: the engine-metrics probe of the port, plain HTTP, would be a
        # request line on the socket before the server speaks TLS)
        rec = Recorder([server.pid], recording, "--tls", "--no-engine-metrics", "--duration", "60")
        server.stdin.write("go\n")
        server.stdin.flush()
        assert server.stdout.readline().strip() == "tls"
        rec.wait_for_line("inferprobe: tls: attached")
        import ssl

        context = ssl._create_unverified_context()  # the test's own certificate
        with socket.create_connection(("127.0.0.1", port)) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            for k in range(4):
                body = json.dumps({"tokens": 3 + k, "interval_ms": 2, "prompt": MARKER}).encode()
                conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: application/json\r\n"
                             b"Authorization: Bearer " + SECRET.encode() + b"\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                answer = b""
                while not answer.endswith(b"0\r\n\r\n"):
                    answer += conn.recv(65536)
        time.sleep(0.3)
        rec.stop()
    finally:
        stop_process(server)
    report = report_json(recording)
    served = [json.loads(line) for line in log.read_text().splitlines()]
    recorded = sorted(report["requests"], key=lambda r: r["t_ingress_ns"])
    assert len(recorded) == len(served) == 4
    errors = []
    for k, (rec_, srv) in enumerate(zip(recorded, served, strict=True)):
        assert rec_["transport"] == "tls" and rec_["outcome"] == "complete"
        assert len(rec_["token_ns"]) == 3 + k == len(srv["token_ns"])
        errors += write_errors(rec_["token_ns"], srv)
        # a socket BIO: the ciphertext write began inside the SSL_write, right after its entry
        wire = rec_["t_first_token_wire_ns"]
        assert wire is not None and 0 <= wire - rec_["t_first_token_ns"] < 1_000_000
    within_tolerance(errors)
    assert MARKER.encode() not in recording.read_bytes() and SECRET.encode() not in recording.read_bytes()


def test_unrecognised_traffic_is_counted_and_named(tmp_path):
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (the test extra installs it)")
    log = tmp_path / "server.log"
    server = subprocess.Popen([sys.executable, str(SERVERS / "stream_shapes_fastapi.py"), str(log)],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        recording = tmp_path / "run.ipr"
        rec = Recorder([server.pid], recording, "--duration", "60")
        # A TLS client at a plain HTTP port: the start of a ClientHello record, no request line
        # (the HTTP/2 preface would now be recognised: tests/integration/e2e/test_http2.py).
        with socket.create_connection(("127.0.0.1", port)) as conn:
            client_hello = bytes([0x16, 0x03, 0x01, 0x00, 0x2f, 0x01, 0x00, 0x00, 0x2b, 0x03, 0x03])
            conn.sendall(client_hello + bytes(32))
            conn.settimeout(5)
            try:
                while conn.recv(4096):
                    pass
            except TimeoutError:
                pass
        time.sleep(0.5)
        rec.stop()
    finally:
        stop_process(server)
    report = report_json(recording)
    assert report["requests"] == []
    assert report["unrecognised_connections"] == 1
    assert "1 moved bytes nothing recognised" in report["no_requests"]


def test_a_tls_connection_open_before_attach_is_picked_up_at_its_next_record(tmp_path):
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (the test extra installs it)")
    import http.client
    import ssl

    log = tmp_path / "server.log"
    env = {**os.environ, **self_signed_certificate(tmp_path)}
    server = subprocess.Popen([sys.executable, str(SERVERS / "stream_shapes_fastapi.py"), str(log)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(server.stdout.readline())
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30,
                                           context=ssl._create_unverified_context())

        def ask(tokens: int) -> None:
            body = json.dumps({"model": "m", "tokens": tokens, "prompt": MARKER, "interval_ms": 2})
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Content-Type": "application/json"})
            assert conn.getresponse().read()

        deadline = time.monotonic() + 20  # the port is printed before uvicorn listens on it
        while True:
            try:
                ask(2)  # handshake and a first request before the tracer exists
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                conn.close()
                time.sleep(0.1)
        recording = tmp_path / "run.ipr"
        rec = Recorder([server.pid], recording, "--no-engine-metrics", "--duration", "60")
        for k in range(3):
            ask(3 + k)
        conn.close()
        time.sleep(0.3)
        rec.stop()
    finally:
        stop_process(server)
    report = report_json(recording)
    recorded = sorted(report["requests"], key=lambda r: r["t_ingress_ns"])
    assert [len(r["token_ns"]) for r in recorded] == [3, 4, 5]
    assert {r["transport"] for r in recorded} == {"tls"} and len({r["conn"] for r in recorded}) == 1
    (conn_json,) = [c for c in report["connections"] if c["conn_id"] == recorded[0]["conn"]]
    assert conn_json["fd"] >= 0  # the socket seeded at attach: the session was tied to it


def test_a_rust_server_s_rustls_plaintext_is_read(tmp_path):
    log = tmp_path / "server.log"
    server, port = start_rustls_server(tmp_path, log)
    try:
        client = subprocess.Popen([str(rustls_program("rustls_sse_client")), f"https://127.0.0.1:{port}",
                                   str(CALLS), str(TOKENS)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert client.stdout.readline().strip() == "ready"   # its warm-up call made, before the tracer
        recording = tmp_path / "run.ipr"
        rec = Recorder([server.pid], recording, "--duration", "60")
        out, _ = client.communicate("go\n", timeout=60)
        time.sleep(0.3)
        rec.stop()
    finally:
        stop_process(server)
    report = report_json(recording)
    calls = [json.loads(line) for line in out.splitlines()]
    served = [json.loads(line) for line in log.read_text().splitlines()][1:]   # less the warm-up
    recorded = sorted(report["requests"], key=lambda r: r["t_ingress_ns"])
    assert len(recorded) == len(calls) == len(served) == CALLS
    errors = []
    for rec_, call, srv in zip(recorded, calls, served, strict=True):
        assert rec_["transport"] == "tls" and rec_["outcome"] == "complete" and rec_["status"] == 200
        assert rec_["path"] == call["path"] == srv["path"] and rec_["model"] == call["model"]
        assert len(rec_["token_ns"]) == TOKENS == len(call["received_ns"]) == len(srv["token_ns"])
        errors += write_errors(rec_["token_ns"], srv)
        assert all(t < r for t, r in zip(rec_["token_ns"], call["received_ns"], strict=True))
        assert call["began_ns"] < rec_["t_ingress_ns"] and rec_["t_end_ns"] < call["returned_ns"]
    within_tolerance(errors)
    connections = {c["conn_id"]: c for c in report["connections"]}
    (conn,) = {rec_["conn"] for rec_ in recorded}   # one pooled connection, opened after attach
    assert connections[conn]["peer"] == "127.0.0.1" and connections[conn]["fd"] >= 0
    assert report["unrecognised_connections"] == 0 and report["lost_events"] == 0
    raw = recording.read_bytes()
    for secret in (MARKER, SECRET, "say something"):
        assert secret.encode() not in raw and secret not in json.dumps(report)


def test_concurrent_rustls_connections_keep_their_own_requests(tmp_path):
    """Each rustls connection is tied to the socket its thread read last when its
    plaintext first moves (docs/tls.md): with 16 clients at once on the server's two
    worker threads, every request still lands on its own connection, whole, in the
    order its client sent it (each client alternates two models)."""
    clients_n, calls = 16, 5
    server, port = start_rustls_server(tmp_path, tmp_path / "server.log")
    try:
        clients = [subprocess.Popen([str(rustls_program("rustls_sse_client")), f"https://127.0.0.1:{port}",
                                     str(calls), str(TOKENS)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                   for _ in range(clients_n)]
        for client in clients:
            assert client.stdout.readline().strip() == "ready"
        recording = tmp_path / "run.ipr"
        rec = Recorder([server.pid], recording, "--duration", "60")
        for client in clients:
            client.stdin.write("go\n")
            client.stdin.flush()
        for client in clients:
            client.communicate(timeout=60)
            assert client.returncode == 0
        time.sleep(0.3)
        rec.stop()
    finally:
        stop_process(server)
    report = report_json(recording)
    by_conn: dict[int, list[dict]] = {}
    for r in sorted(report["requests"], key=lambda r: r["t_ingress_ns"]):
        by_conn.setdefault(r["conn"], []).append(r)
    assert len(by_conn) == clients_n
    for requests in by_conn.values():
        assert [r["model"] for r in requests] == [f"rust-test-{k % 2}" for k in range(calls)]
        assert all(r["outcome"] == "complete" and r["status"] == 200 and len(r["token_ns"]) == TOKENS
                   for r in requests)
    assert report["unrecognised_connections"] == 0 and report["lost_events"] == 0
