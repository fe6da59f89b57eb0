"""Children forked after recording starts are traced too (pre-fork servers)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.support.kernel import needs_root
from tests.support.paths import SERVERS
from tests.support.processes import Recorder, inferprobe_cmd

pytestmark = [needs_root, pytest.mark.bpf]


def test_worker_forked_after_attach_is_traced(tmp_path):
    server = subprocess.Popen([sys.executable, str(SERVERS / "forking_server.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        port = int(server.stdout.readline().rsplit(":", 1)[1])
        rec = Recorder([server.pid], tmp_path / "fork.ipr")
        server.stdin.write("fork\n")
        server.stdin.flush()
        child = int(server.stdout.readline().split()[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            for i in range(3):
                sock.sendall(f"GET /item/{i}?secret=x HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                reply = b""
                while not reply.endswith(b'{"ok": true}'):
                    reply += sock.recv(4096)
        rec.stop()
    finally:
        # the worker is not our child: kill it by pid, then its parent
        for pid in (child, server.pid):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        server.wait()
    doc = json.loads(subprocess.run(inferprobe_cmd("report", str(tmp_path / "fork.ipr"), "--format",
                                                   "json"), capture_output=True, text=True,
                                    check=True).stdout)
    reqs = doc["requests"]
    assert [r["path"] for r in reqs] == ["/item/0", "/item/1", "/item/2"]  # no query strings
    assert all(r["pid"] == child and r["status"] == 200 and r["outcome"] == "complete" for r in reqs)


# Waits for a line on stdin, then starts a thread and forks a child (each says
# its id and stays), then on the next line lets both end.
FORKER = r"""
import os, sys, threading
sys.stdin.readline()
release = threading.Event()
t = threading.Thread(target=release.wait)
t.start()
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.read(r, 1)
    os._exit(0)
print(t.native_id, child, flush=True)
sys.stdin.readline()
release.set()
t.join()
os.write(w, b"x")
os.waitpid(child, 0)
print("done", flush=True)
sys.stdin.readline()
"""


def test_the_kernel_target_set_follows_forks_and_exits():
    from inferprobe.collector.attach.loader import load_tracer
    from inferprobe.collector.attach.target_bitmap import target_pids

    proc = subprocess.Popen([sys.executable, "-c", FORKER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    tracer = load_tracer([proc.pid], sets=("sockets",), require_listener=False)
    try:
        assert target_pids(tracer.bpf) == [proc.pid]
        proc.stdin.write("go\n")
        proc.stdin.flush()
        thread, child = map(int, proc.stdout.readline().split())
        assert set(target_pids(tracer.bpf)) == {proc.pid, thread, child}
        proc.stdin.write("end\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        assert target_pids(tracer.bpf) == [proc.pid]  # thread and child gone, their bits cleared
    finally:
        proc.kill()
        proc.wait()
        tracer.close()
