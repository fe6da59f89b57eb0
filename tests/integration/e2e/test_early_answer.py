"""End to end: a response that starts before its request's write() returned.

A client writes a request's head and a 32 MB body in one blocking write()
while a second thread reads the answer; the server
(tests/servers/early_answer_server.py) answers the head at once and reads the
body only after. The response's first reads return while the request's
write is still under way, as they do when a thread is preempted between its
socket write and its return (Go's crypto/tls client on a busy host, where
this was found). The kernel classifies the request at the write's return, so
the status line is the connection's first HTTP; user space orders the write
by its entry. Each call is still one complete request with its own response.

Tolerances: the response's start and each token no later than the
application saw them and within 5 ms of it; the call's span within 20 ms
of the application's. Counts are exact.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.kernel import needs_root
from tests.support.paths import PROGRAMS, SERVERS
from tests.support.processes import inferprobe_cmd, record_client_run, stop_process

pytestmark = [needs_root, pytest.mark.bpf]

CALLS, TOKENS = 3, 3
NEAR_NS, SPAN_TOLERANCE_NS = 5_000_000, 20_000_000


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("early-answer")
    server = subprocess.Popen([sys.executable, str(SERVERS / "early_answer_server.py")],
                              stdout=subprocess.PIPE, text=True)
    recording = tmp / "run.ipr"
    try:
        port = int(server.stdout.readline())
        command = [sys.executable, str(PROGRAMS / "early_answer_client.py"), str(port), str(CALLS)]
        out = record_client_run(command, recording, ready="READY", timeout=60)
    finally:
        stop_process(server)
    report = json.loads(subprocess.run(inferprobe_cmd("report", str(recording), "--format", "json"),
                                       capture_output=True, text=True, check=True).stdout)
    return {"report": report, "app": [json.loads(line) for line in out.splitlines()]}


def test_the_answer_began_before_the_write_returned(recorded):
    """The case under test happened: a precondition, not the tracer's result."""
    for call in recorded["app"]:
        assert call["head_ns"] < call["written_ns"] and len(call["received_ns"]) == TOKENS


def test_each_call_is_one_complete_request_with_its_own_response(recorded):
    report, app = recorded["report"], recorded["app"]
    requests = sorted(report["requests"], key=lambda r: r["t_ingress_ns"])
    assert len(requests) == len(app) == CALLS
    for k, (req, mine) in enumerate(zip(requests, app, strict=True)):
        assert req["role"] == "client" and req["outcome"] == "complete" and req["status"] == 200
        assert req["model"] == f"early-{k}"
        assert mine["began_ns"] <= req["t_ingress_ns"] < mine["written_ns"]
        assert 0 <= mine["head_ns"] - req["t_response_start_ns"] < NEAR_NS
        assert len(req["token_ns"]) == TOKENS
        for traced, seen in zip(req["token_ns"], mine["received_ns"], strict=True):
            assert 0 <= seen - traced < NEAR_NS
        span = mine["returned_ns"] - mine["began_ns"]
        assert abs((req["t_end_ns"] - req["t_ingress_ns"]) - span) < SPAN_TOLERANCE_NS
    assert report["lost_events"] == 0

