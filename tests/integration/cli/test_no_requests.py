"""A recording without requests says why, and a target that serves nothing is recorded.

Batch jobs, offline benchmarks and applications that only call out have no
listening socket: `record` notes it and records them (their locks, stacks,
GPU calls) instead of refusing. The report of a recording with no request
names the reason the recording shows: the pid serves nothing (and which
ancestor listens, when one does), the connections carried no HTTP/1.x
request line (TLS, HTTP/2), or nothing connected.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time

from inferprobe.collector.model.recording import read_recording

from tests.support.kernel import needs_root
from tests.support.processes import LISTENING_SERVER, Recorder, inferprobe_cmd

# A server that listens, forks a worker (which serves nothing) and accepts
# connections whose bytes are not HTTP/1.x (a TLS ClientHello's first bytes).
PARENT = LISTENING_SERVER + r"""
child = __import__("subprocess").Popen(["sleep", "60"])
print(child.pid, flush=True)
while True:
    conn, _ = srv.accept()
    conn.recv(4096)
    conn.sendall(b"\x16\x03\x03\x00\x02\x02\x28")
    conn.close()
"""
TLS_HELLO = bytes.fromhex("160301020001") + b"\x03\x03" + bytes(range(32)) * 4


def _report(recording, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(inferprobe_cmd("report", str(recording), *extra), capture_output=True,
                          text=True, check=True)


def _record(pid: int, recording, traffic_port: int | None = None) -> str:
    rec = Recorder([pid], recording, "--duration", "30")
    if traffic_port is not None:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", traffic_port)) as c:
                c.sendall(TLS_HELLO)
                c.recv(64)
    time.sleep(0.3)
    out, _ = rec.stop()
    return out


@needs_root
def test_a_pid_that_serves_nothing_is_recorded_and_its_listening_parent_named(tmp_path, python_script):
    server = python_script(PARENT)
    server.stdout.readline()
    worker = int(server.stdout.readline())
    out = _record(worker, tmp_path / "worker.ipr")
    assert "holds no listening socket" in out
    assert f"the listening process is PID {server.pid}, the parent of the one you gave" in out
    doc = json.loads(_report(tmp_path / "worker.ipr", "--format", "json").stdout)
    assert doc["summary"]["requests"] == 0
    assert f"record -p {server.pid}" in doc["no_requests"]
    assert "held no listening socket" in _report(tmp_path / "worker.ipr").stdout


@needs_root
def test_connections_without_a_request_line_are_named_as_unreadable_traffic(tmp_path, python_script):
    server = python_script(PARENT)
    port = int(server.stdout.readline())
    server.stdout.readline()
    _record(server.pid, tmp_path / "tls.ipr", traffic_port=port)
    doc = json.loads(_report(tmp_path / "tls.ipr", "--format", "json").stdout)
    assert doc["summary"]["requests"] == 0
    assert "3 connection(s) were accepted" in doc["no_requests"]
    assert "TLS" in doc["no_requests"] and "HTTP/2" in doc["no_requests"]
    for fmt in ("md", "html"):
        assert "encrypted (TLS)" in _report(tmp_path / "tls.ipr", "--format", fmt).stdout


@needs_root
def test_an_idle_server_is_called_idle(tmp_path, python_script):
    server = python_script(PARENT)
    server.stdout.readline()
    server.stdout.readline()
    rec = Recorder([server.pid], tmp_path / "idle.ipr", "--duration", "30")
    time.sleep(0.3)
    rec.stop()
    assert "the server was idle" in json.loads(_report(tmp_path / "idle.ipr", "--format", "json").stdout)[
        "no_requests"]
    # The recorder's account of its own start-up: each stage timed, together no longer than
    # the wait the test saw from spawning it to its attached line, which says the total.
    stages = read_recording(tmp_path / "idle.ipr").meta["startup_s"]
    assert set(stages) == {"prepare", "verify", "attach"}, stages
    assert all(seconds >= 0 for seconds in stages.values()) and stages["verify"] > 0
    assert sum(stages.values()) <= rec.attached_after_s
    attached = next(line for line in rec.stdout_lines if line.startswith("inferprobe: attached"))
    assert f"ready in {sum(stages.values()):.1f} s, {stages['verify']:.1f} s of it" in attached
