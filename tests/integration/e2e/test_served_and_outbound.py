"""A server's own outbound calls are not requests it served.

An engine that exports its own telemetry (vLLM's OTLP traces) calls out while it
serves. Those calls are the client view's (client_calls); the headline, the
per-endpoint table and the percentiles count the requests served. Two servers
under one recorder, Node's http module and Python's http.server, each exporting
one POST /v1/traces to an untraced sink after every stream it serves, over a
keep-alive connection opened before the recorder attached (seeded as a client
connection from /proc) and so kept for the whole recording.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.kernel import needs_root
from tests.support.node import node_binary
from tests.support.paths import SERVERS
from tests.support.processes import Recorder, report_json_text, report_terminal_text, stop_process

pytestmark = [needs_root, pytest.mark.bpf]

STREAMS = 5  # per server, each followed by one export


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    exports = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with _Sink.lock:
            _Sink.exports += 1
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def _stream(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=b'{"stream": true}',
                 headers={"Content-Type": "application/json"})
    body = conn.getresponse().read()
    assert body.endswith(b"data: [DONE]\n\n"), body
    conn.close()


def _wait_for_exports(n: int) -> None:
    deadline = time.monotonic() + 20
    while _Sink.exports < n:
        assert time.monotonic() < deadline, f"{_Sink.exports} exports of {n}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    node = node_binary()
    tmp = tmp_path_factory.mktemp("outbound")
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    sink_port = sink.server_address[1]
    commands = {"node": [node, str(SERVERS / "serve_and_export.js")],
                "python": [sys.executable, str(SERVERS / "serve_and_export.py")]}
    servers = {name: subprocess.Popen([*argv, str(sink_port)], stdout=subprocess.PIPE, text=True)
               for name, argv in commands.items()}
    try:
        ports = {name: int(proc.stdout.readline()) for name, proc in servers.items()}
        for port in ports.values():  # the exporters' connections open before the recorder attaches
            _stream(port)
        _wait_for_exports(len(ports))
        recording = tmp / "run.ipr"
        rec = Recorder([proc.pid for proc in servers.values()], recording, "--no-engine-metrics",
                       "--duration", "120")
        try:
            for port in ports.values():
                for _ in range(STREAMS):
                    _stream(port)
            _wait_for_exports(len(ports) * (STREAMS + 1))
            time.sleep(0.3)
        finally:
            rec.stop()
    finally:
        for proc in servers.values():
            stop_process(proc)
        sink.shutdown()
    doc = json.loads(report_json_text(recording))
    return {"doc": doc, "text": report_terminal_text(recording),
            "pids": {name: proc.pid for name, proc in servers.items()}}


def test_each_servers_exports_are_its_outbound_calls(recorded):
    doc = recorded["doc"]
    for name, pid in recorded["pids"].items():
        mine = [r for r in doc["requests"] if r["pid"] == pid]
        served = [r for r in mine if r["role"] == "server"]
        calls = [r for r in mine if r["role"] == "client"]
        assert [r["path"] for r in served] == ["/v1/chat/completions"] * STREAMS, name
        assert [r["path"] for r in calls] == ["/v1/traces"] * STREAMS, name
        assert all(r["outcome"] == "complete" and r["status"] == 200 for r in mine), name
    assert len(doc["client_calls"]) == 2 * STREAMS


def test_the_served_numbers_count_only_the_requests_served(recorded):
    doc, text = recorded["doc"], " ".join(recorded["text"].split())  # as one line: the terminal wraps
    assert doc["summary"]["requests"] == 2 * STREAMS
    assert doc["summary"]["ttft_ns"]["count"] == 2 * STREAMS
    assert set(doc["endpoints"]) == {"POST /v1/chat/completions"}
    assert f"requests {2 * STREAMS} " in text and f"outbound calls {2 * STREAMS} (not counted above)" in text
