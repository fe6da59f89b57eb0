"""`record --all`: servers found without a pid, before and after attach, in other namespaces.

Each server logs, on CLOCK_MONOTONIC, when it handed each token chunk to the
kernel (tests/servers/sse_server.py); the tracer's token times for the same
request must follow those within a few milliseconds, and every request a
server logged must be in the report under that server's host pid.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferprobe.collector.model.recording import read_recording

from tests.support.cli import json_report
from tests.support.kernel import needs_root
from tests.support.paths import SERVERS
from tests.support.processes import Recorder, ServerProcess, stop_namespace_init, stop_process

pytestmark = [needs_root, pytest.mark.bpf]

REQUESTS_EACH = 3
# The tracer sees a chunk's write() begin after the server took its timestamp and
# before the next; on a loaded 2-core VM that gap has reached a few ms.
TOKEN_AFTER_LOG_MAX_NS = 20_000_000
COMPLETION = json.dumps({"prompt": "hi", "max_tokens": 3, "stream": True})


def _stream_completions(port: int, n: int = REQUESTS_EACH) -> None:
    for _ in range(n):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/v1/completions", body=COMPLETION, headers={"Content-Type": "application/json"})
        assert conn.getresponse().read().count(b"data:") >= 3
        conn.close()


def _log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _assert_matches_log(requests: list[dict], log: list[dict]) -> None:
    """Same requests, in order, and each token seen on the wire just after the server logged it."""
    assert len(requests) == len(log) == REQUESTS_EACH, (requests, log)
    for traced, logged in zip(sorted(requests, key=lambda r: r["t_ingress_ns"]), log, strict=True):
        assert traced["path"] == "/v1/completions" and traced["status"] == 200
        assert len(traced["token_ns"]) == len(logged["t_chunk_ns"])
        for seen, handed in zip(traced["token_ns"], logged["t_chunk_ns"], strict=True):
            assert 0 <= seen - handed <= TOKEN_AFTER_LOG_MAX_NS, (seen, handed)


class NamespacedServer:
    """sse_server.py in new pid, mount and network namespaces (unshare), its own loopback up."""

    def __init__(self, log: Path):
        script = (f"ip link set lo up && exec {sys.executable} {SERVERS / 'sse_server.py'} "
                  f"--host 127.0.0.1 --port 0 --log {log}")
        # --kill-child: unshare passes no signal on, and stop() ends unshare: without it the
        # server (pid 1 of its namespace) outlived the test and served on for the rest of the run
        self.proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount", "--net", "sh",
                                      "-c", script], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING"):
            self.proc.kill()
            pytest.skip(f"a server in new namespaces did not start here ({line!r})")
        self.port = int(line.split(":")[-1])
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        self.pid = int(children[0])   # host pid; it is 1 inside its own pid namespace

    def requests_from_inside(self) -> None:
        """The client runs in the server's network namespace: its loopback is not ours."""
        code = (f"import sys; sys.path.insert(0, {str(Path.cwd())!r}); "
                f"from tests.integration.cli.test_record_all import _stream_completions as s; s({self.port})")
        subprocess.run(["nsenter", "-t", str(self.pid), "-n", sys.executable, "-c", code],
                       check=True, timeout=60)

    def stop(self) -> None:
        stop_namespace_init(self.pid, self.proc)


def test_record_all_finds_servers_before_after_attach_and_in_other_namespaces(tmp_path):
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("unshare and nsenter (util-linux) are needed to make the namespaces")
    before = ServerProcess(tmp_path / "before.jsonl")
    after = inside = None
    try:
        rec = Recorder([], tmp_path / "all.ipr", "--all")
        after = ServerProcess(tmp_path / "after.jsonl")
        inside = NamespacedServer(tmp_path / "inside.jsonl")
        rec.wait_for_line(f"inferprobe: host-wide: following pid {after.pid}", timeout=15)
        _stream_completions(before.port)
        _stream_completions(after.port)
        inside.requests_from_inside()
        time.sleep(0.5)
        out, err = rec.stop()
    finally:
        for server in (before, after, inside):
            if server is not None:
                server.stop()
    assert "Traceback" not in err, err
    doc = json_report(tmp_path / "all.ipr")
    by_pid: dict[int, list[dict]] = {}
    for req in doc["requests"]:
        by_pid.setdefault(req["pid"], []).append(req)
    _assert_matches_log(by_pid.get(before.pid, []), _log_lines(tmp_path / "before.jsonl"))
    _assert_matches_log(by_pid.get(after.pid, []), _log_lines(tmp_path / "after.jsonl"))
    _assert_matches_log(by_pid.get(inside.pid, []), _log_lines(tmp_path / "inside.jsonl"))
    snapshot = read_recording(tmp_path / "all.ipr").snapshots["host_wide"]
    adopted = {a["pid"]: a["how"] for a in snapshot["adopted"]}
    assert (adopted[before.pid], adopted[after.pid], adopted[inside.pid]) == ("start", "listen", "listen")


def test_port_and_comm_filters_leave_other_servers_untraced(tmp_path):
    wanted = ServerProcess(tmp_path / "wanted.jsonl")
    other = ServerProcess(tmp_path / "other.jsonl")
    try:
        rec = Recorder([], tmp_path / "port.ipr", "--all", "--port", str(wanted.port), "--comm",
                       Path(f"/proc/{wanted.pid}/comm").read_text().strip())
        late_other = ServerProcess(tmp_path / "late.jsonl")   # same name, another port: filtered out
        try:
            for port in (wanted.port, other.port, late_other.port):
                _stream_completions(port)
            time.sleep(0.5)
            rec.stop()
        finally:
            late_other.stop()
    finally:
        wanted.stop()
        other.stop()
    doc = json_report(tmp_path / "port.ipr")
    assert {r["pid"] for r in doc["requests"]} == {wanted.pid}
    _assert_matches_log(doc["requests"], _log_lines(tmp_path / "wanted.jsonl"))


def test_a_server_of_another_protocol_is_released(tmp_path):
    """A TCP server whose connections carry no request line stops being traced."""
    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    try:
        port = int(echo.stdout.readline().split()[1])
        rec = Recorder([], tmp_path / "echo.ipr", "--all", "--port", str(port))
        held = []
        for _ in range(4):   # held open, so the periodic check finds them in the socket table
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"\x00\x01binary protocol, not HTTP\r\n")
            assert sock.recv(100)
            held.append(sock)
        line = rec.wait_for_line(f"inferprobe: host-wide: released pid {echo.pid}", timeout=20)
        assert "none carrying HTTP" in line
        for sock in held:
            sock.close()
        rec.stop()
    finally:
        stop_process(echo)
    snapshot = read_recording(tmp_path / "echo.ipr").snapshots["host_wide"]
    assert echo.pid in snapshot["released"] and echo.pid not in snapshot["serving_http"]


ECHO = r"""
import socket, threading
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
print("LISTENING", srv.getsockname()[1], flush=True)
def serve(conn):
    while data := conn.recv(4096):
        conn.sendall(data)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""
