"""In-flight BPF state does not outlive the thread it belongs to.

bpf/sock.bpf.c keeps one entry per thread between a traced syscall's entry
and its exit. On kernels without task-local storage for tracepoints that is
`pending`, a plain hash, not an LRU (cheaper per syscall), so nothing evicts
a stale entry: a thread killed while it sits in a traced read() must not
leave one behind (the kernel still runs the syscall's exit tracepoint on the
way out). The test forces that fallback, which this kernel would not choose.
(Task-local storage is freed by the kernel with its thread.)
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from inferprobe.collector.attach.loader import load_tracer

from tests.support.kernel import needs_root
from tests.support.processes import LISTENING_SERVER

pytestmark = [pytest.mark.bpf, needs_root]

# Answers one request per recv() on a worker thread, then blocks in the next recv().
TARGET = LISTENING_SERVER + r"""
conn, _ = srv.accept()
def serve():
    print(threading.get_native_id(), flush=True)
    while conn.recv(4096):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
t = threading.Thread(target=serve)
t.start()
t.join()
"""


def _pending_tids(tracer) -> set[int]:
    return {k.value & 0xFFFFFFFF for k in tracer.bpf[b"pending"].keys()}


def test_a_thread_killed_inside_a_traced_read_leaves_no_pending_entry():
    target = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
    tracer = None
    try:
        port = int(target.stdout.readline())
        tracer = load_tracer([target.pid], sets=("sockets",), options={"sockets": {"pending": "hash"}})
        client = socket.create_connection(("127.0.0.1", port))
        worker = int(target.stdout.readline())
        client.sendall(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
        # The worker is back in recv(): its entry is in flight.
        deadline = time.monotonic() + 5
        while worker not in _pending_tids(tracer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker in _pending_tids(tracer), "the blocked read was not traced"
        target.kill()
        target.wait()
        deadline = time.monotonic() + 5
        while worker in _pending_tids(tracer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker not in _pending_tids(tracer)
        client.close()
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
        if tracer is not None:
            tracer.close()
