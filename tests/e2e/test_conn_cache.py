"""Each thread's cache of the socket table (bpf/sock.bpf.c, lookup_conn)
against the two ways it can go stale.

One thread accepts and closes connections while a second does I/O on them:

* the fd the second thread cached is closed by the first and handed to a
  new connection, so the same fd now means another conn_id;
* the second thread touches the new connection before any request arrived
  (a non-blocking recv that finds nothing), caching "not HTTP yet"; the
  first thread then reads the request, and the second's response must not
  be dropped as non-HTTP traffic.

Every read and write must carry the conn_id of the connection the client
really used, told apart by the client's port in the CONN_OPEN events.
"""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from inferprobe.collector.events import ConnRecord, EventType, HttpKind, IoRecord

from conftest import KernelCapture, needs_root

pytestmark = [pytest.mark.bpf, needs_root]

REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

# The main thread accepts, closes and reads requests; "worker" does what it
# is handed, in order, and answers with the fd it used.
SERVER = r"""
import json, queue, socket, sys, threading
REQUEST_LEN, RESPONSE = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
jobs, done = queue.Queue(), queue.Queue()

def worker():
    while (job := jobs.get()) is not None:
        op, conn = job
        if op == "send":
            conn.sendall(RESPONSE)
        elif op == "recv":
            conn.recv(REQUEST_LEN)
        elif op == "poke":
            try:
                conn.recv(1, socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
        done.put(conn.fileno())

def on_worker(op, conn):
    jobs.put((op, conn))
    return done.get()

threading.Thread(target=worker).start()
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
sys.stdin.readline()               # the tracer is attached: accept() is seen whole

first, _ = srv.accept()
first.recv(REQUEST_LEN)            # request 1, main thread
on_worker("send", first)           # response 1: the worker caches this fd
on_worker("recv", first)           # request 2, from the worker's cache
on_worker("send", first)           # response 2
fds = [first.fileno()]
first.close()

second, _ = srv.accept()           # the lowest free fd: the one just closed
fds.append(second.fileno())
on_worker("poke", second)          # cached before any request: not HTTP yet
print("poked", flush=True)
second.recv(REQUEST_LEN)           # request 3, main thread: now it is HTTP
on_worker("send", second)          # response 3, must not be dropped
second.recv(1)
jobs.put(None)
print(json.dumps(fds), flush=True)
"""


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        assert more, "server closed early"
        data += more
    return data


@pytest.mark.parametrize("pending", ["auto", "hash"])
def test_a_reused_fd_and_a_late_http_flip_reach_the_right_connection(pending, python_script):
    server = python_script(SERVER, str(len(REQUEST)), RESPONSE.hex(), stdin=subprocess.PIPE)
    port = int(server.stdout.readline())
    with KernelCapture(server.pid, options={"sockets": {"pending": pending}}) as capture:
        server.stdin.write("go\n")
        server.stdin.flush()
        with socket.create_connection(("127.0.0.1", port)) as first:
            first_port = first.getsockname()[1]
            for _ in range(2):
                first.sendall(REQUEST)
                assert read_exactly(first, len(RESPONSE)) == RESPONSE
        with socket.create_connection(("127.0.0.1", port)) as second:
            second_port = second.getsockname()[1]
            assert server.stdout.readline().strip() == "poked"
            second.sendall(REQUEST)
            assert read_exactly(second, len(RESPONSE)) == RESPONSE
            second.sendall(b"x")
            fds = json.loads(server.stdout.readline())
        server.wait(timeout=10)
        events, counters = capture.finish()

    assert fds[0] == fds[1], "the precondition: the second connection reuses the first's fd"
    opened = {e.peer_port: e.conn_id for e in events
              if isinstance(e, ConnRecord) and e.type == EventType.CONN_OPEN and e.pid == server.pid}
    first_id, second_id = opened[first_port], opened[second_port]
    assert first_id != second_id
    io = [(e.conn_id, e.kind, e.bytes) for e in events
          if isinstance(e, IoRecord) and e.pid == server.pid and e.bytes > 0]
    assert io == [
        (first_id, HttpKind.REQUEST, len(REQUEST)),
        (first_id, HttpKind.RESPONSE, len(RESPONSE)),
        (first_id, HttpKind.REQUEST, len(REQUEST)),
        (first_id, HttpKind.RESPONSE, len(RESPONSE)),
        (second_id, HttpKind.REQUEST, len(REQUEST)),
        (second_id, HttpKind.RESPONSE, len(RESPONSE)),
        (second_id, HttpKind.DATA, 1),
    ]
    assert counters["events_lost"] == 0
