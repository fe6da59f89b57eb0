"""An engine's own IPC is not "encrypted or unrecognised traffic".

vLLM's API server and EngineCore talk ZMQ over Unix sockets; each such connection
moved bytes no classifier recognised, and the report used to warn that TLS in an
unhooked library or HTTP/2 begun before attach might be hiding requests. Unix-domain
connections are counted apart and named as IPC of this host. Two stacks, Python's
socket module and Node's net module, each exchanging binary frames with an
untraced peer: connections open at attach (seeded from /proc), one closed while
recording (the kernel's counter) and one still open at the stop (the socket
table's snapshot), and one made after attach, which the kernel gives up on at
its first bytes (a connection the target made that carries no request line).
A process waking itself over a socketpair it holds both ends of (asyncio's
self-pipe, the C self-pipe trick) is neither IPC nor unread traffic, and goes
unsaid.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from inferprobe.collector.model.recording import read_recording

from tests.programs.build import build
from tests.support.kernel import needs_root
from tests.support.node import node_binary
from tests.support.paths import PROGRAMS
from tests.support.processes import Recorder, report_json_text, report_terminal_text, stop_process

pytestmark = [needs_root, pytest.mark.bpf]


def _echo_hub(path: str) -> socket.socket:
    """The untraced peer: echoes every frame on every connection until EOF."""
    hub = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hub.bind(path)
    hub.listen()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = hub.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return hub


def _say(proc: subprocess.Popen, line: str, answer: str) -> None:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == answer, line


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    node = node_binary()
    tmp = tmp_path_factory.mktemp("ipc")
    path = str(tmp / "hub.sock")
    hub = _echo_hub(path)
    peers = {"python": subprocess.Popen([sys.executable, str(PROGRAMS / "ipc_peer.py"), path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True),
             "node": subprocess.Popen([node, str(PROGRAMS / "ipc_peer.js"), path],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)}
    try:
        for proc in peers.values():  # each connected before the recorder attaches
            assert proc.stdout.readline().strip() == "ready"
        recording = tmp / "ipc.ipr"
        rec = Recorder([proc.pid for proc in peers.values()], recording, "--no-engine-metrics",
                       "--duration", "60")
        try:
            py, js = peers["python"], peers["node"]
            _say(py, "new", "ok")  # a second connection, made while recording
            for _ in range(3):
                _say(py, "frame", "ok")
                _say(js, "frame", "echoed")
            _say(py, "close", "ok")  # Python's one open at attach: closed while recording
            time.sleep(0.3)  # the close reaches the tracer; Node's stays open to the stop
        finally:
            rec.stop()
    finally:
        for proc in peers.values():
            stop_process(proc)
        hub.close()
    doc = json.loads(report_json_text(recording))
    return {"doc": doc, "text": report_terminal_text(recording), "recording": read_recording(recording)}


def test_ipc_connections_are_counted_as_ipc_not_as_unread_traffic(recorded):
    doc = recorded["doc"]
    # Python's first, closed, and its second, given up on; Node's, open at the stop
    rec = recorded["recording"]
    assert rec.counter("conns_local_ipc") == 2 and rec.snapshots["sockets"]["open_local_ipc"] == 1
    assert doc["local_ipc_connections"] == 3, doc["local_ipc_connections"]
    assert doc["unrecognised_connections"] == 0
    assert doc["requests"] == []


def test_the_report_names_them_and_does_not_suggest_tls(recorded):
    text = " ".join(recorded["text"].split())  # as one line: the terminal wraps
    assert "note: 3 Unix-socket connection(s) between processes of this host carried no HTTP" in text
    assert "encrypted or unrecognised" not in text


@pytest.fixture(scope="module")
def self_woken(tmp_path_factory) -> dict:
    """Two processes each waking itself over a socketpair it holds both ends of:
    Python's asyncio loop (its self-pipe, written by call_soon_threadsafe from a
    worker thread, as the demo's engine thread and any threadpool server do) and
    a C program using the self-pipe trick. Both pairs exist before attach."""
    tmp = tmp_path_factory.mktemp("self-wake")
    procs = [subprocess.Popen([sys.executable, str(PROGRAMS / "self_wake.py")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True),
             subprocess.Popen([str(build("self_pipe", tmp))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "READY"
        recording = tmp / "self.ipr"
        rec = Recorder([proc.pid for proc in procs], recording, "--no-engine-metrics", "--duration", "60")
        try:
            for proc in procs:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            woken = [int(proc.stdout.readline().split()[1]) for proc in procs]
        finally:
            rec.stop()
    finally:
        for proc in procs:
            stop_process(proc)
    return {"doc": json.loads(report_json_text(recording)), "text": report_terminal_text(recording),
            "woken": woken}


def test_a_process_waking_itself_over_a_socketpair_is_no_ipc_and_no_unread_traffic(self_woken):
    doc = self_woken["doc"]
    assert min(self_woken["woken"]) >= 100  # each woke itself that often while recorded
    assert doc["self_pair_ends"] == 4  # both ends of each pair moved bytes
    assert doc["local_ipc_connections"] == 0 and doc["unrecognised_connections"] == 0
    text = " ".join(self_woken["text"].split())
    assert "Unix-socket" not in text and "encrypted or unrecognised" not in text
