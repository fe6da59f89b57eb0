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

The cache also remembers fds that are no tracked socket, and a connection
can leave the socket table without accept or close (the table is an LRU),
which makes more ways to go stale, each with its own test below:

* a file the worker wrote to is closed and its fd handed to a connection;
* a connection's fd is closed and reopened as a file, with the connection
  still in the table or already evicted from it;
* a connection open before tracing began is polled all through the attach:
  had its thread been a target before user space seeded the socket into
  the table, it would have cached it as untracked (the loader sets the
  targets last; this test fails if that order changes).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess

import pytest

from inferprobe.collector.model.events import ConnRecord, EventType, HttpKind

from tests.support.kernel import KernelCapture, bytes_moved, needs_root
from tests.support.processes import LISTENING_SERVER

pytestmark = [pytest.mark.bpf, needs_root]

REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

# A second thread that runs OPS[op](target) when handed (op, target), and
# answers with what it returned.
WORKER = LISTENING_SERVER + r"""
REQUEST_LEN, RESPONSE = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
jobs, done = queue.Queue(), queue.Queue()

def worker():
    while (job := jobs.get()) is not None:
        op, target = job
        done.put(OPS[op](target))

def on_worker(op, target):
    jobs.put((op, target))
    return done.get()

threading.Thread(target=worker).start()
"""

# The main thread accepts, closes and reads requests; the worker does what
# it is handed, in order.
SERVER = WORKER + r"""
def poke(conn):
    try:
        conn.recv(1, socket.MSG_DONTWAIT)
    except BlockingIOError:
        pass

OPS = {"send": lambda conn: conn.sendall(RESPONSE), "recv": lambda conn: conn.recv(REQUEST_LEN), "poke": poke}
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


@contextlib.contextmanager
def attached_then_started(script: str, pending: str, python_script):
    """A WORKER server that waits for the tracer: yields (server, port, capture)
    once it has been told to go on."""
    server = python_script(script, str(len(REQUEST)), RESPONSE.hex(), stdin=subprocess.PIPE)
    port = int(server.stdout.readline())
    with KernelCapture(server.pid, options={"sockets": {"pending": pending}}) as capture:
        server.stdin.write("go\n")
        server.stdin.flush()
        yield server, port, capture


@pytest.mark.parametrize("pending", ["auto", "hash"])
def test_a_reused_fd_and_a_late_http_flip_reach_the_right_connection(pending, python_script):
    with attached_then_started(SERVER, pending, python_script) as (server, port, capture):
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
    io = [(e.conn_id, e.kind, e.bytes) for e in bytes_moved(events, server.pid)]
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


# The worker writes to a file, which is closed; the next connection gets its
# fd and the worker serves it.
REUSED_FILE_SERVER = WORKER + r"""
def serve(conn):
    conn.recv(REQUEST_LEN)
    conn.sendall(RESPONSE)

OPS = {"log": lambda fd: os.write(fd, b"a log line\n"), "serve": serve}
sys.stdin.readline()               # the tracer is attached
log = os.open(os.devnull, os.O_WRONLY)
on_worker("log", log)              # the worker caches this fd: no socket
os.close(log)
conn, _ = srv.accept()             # the lowest free fd: the file's
on_worker("serve", conn)
print(json.dumps([log, conn.fileno()]), flush=True)
conn.recv(1)
jobs.put(None)
"""


@pytest.mark.parametrize("pending", ["auto", "hash"])
def test_an_fd_cached_as_no_socket_is_traced_once_a_connection_reuses_it(pending, python_script):
    with attached_then_started(REUSED_FILE_SERVER, pending, python_script) as (server, port, capture):
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(REQUEST)
            assert read_exactly(client, len(RESPONSE)) == RESPONSE
            fds = json.loads(server.stdout.readline())
            client.sendall(b"x")
        server.wait(timeout=10)
        events, counters = capture.finish()

    assert fds[0] == fds[1], "the precondition: the connection reuses the file's fd"
    kinds = [e.kind for e in bytes_moved(events, server.pid)]
    assert kinds == [HttpKind.REQUEST, HttpKind.RESPONSE, HttpKind.DATA]
    assert counters["events_lost"] == 0


# The worker serves a connection; its fd is closed (after the test has, or
# has not, removed it from the socket table as the LRU would when full) and
# reopened as a file, which the worker writes to.
CLOSED_THEN_FILE_SERVER = WORKER + r"""
def serve(conn):
    conn.recv(REQUEST_LEN)
    conn.sendall(RESPONSE)
    conn.recv(1)

OPS = {"log": lambda fd: os.write(fd, b"a log line\n"), "serve": serve}
sys.stdin.readline()               # the tracer is attached
conn, _ = srv.accept()
on_worker("serve", conn)           # the worker caches this fd: a connection
print(conn.fileno(), flush=True)
sys.stdin.readline()               # the test may have evicted it
fd = conn.fileno()
conn.close()
log = os.open(os.devnull, os.O_WRONLY)
on_worker("log", log)              # must not be taken for the closed connection
print(json.dumps([fd, log]), flush=True)
jobs.put(None)
"""


@pytest.mark.parametrize("evicted", [False, True], ids=["in-table", "evicted"])
@pytest.mark.parametrize("pending", ["auto", "hash"])
def test_a_closed_connections_fd_reopened_as_a_file_is_not_that_connection(pending, evicted, python_script):
    with attached_then_started(CLOSED_THEN_FILE_SERVER, pending, python_script) as (server, port, capture):
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(REQUEST)
            assert read_exactly(client, len(RESPONSE)) == RESPONSE
            client.sendall(b"x")
            fd = int(server.stdout.readline())
            if evicted:
                socks = capture.tracer.bpf[b"socks"]
                del socks[socks.Key(pid=server.pid, fd=fd)]
            server.stdin.write("go on\n")
            server.stdin.flush()
            fds = json.loads(server.stdout.readline())
        server.wait(timeout=10)
        events, counters = capture.finish()

    assert fds[0] == fds[1], "the precondition: the file reuses the connection's fd"
    io = [(e.kind, e.bytes) for e in bytes_moved(events, server.pid)]
    assert io == [(HttpKind.REQUEST, len(REQUEST)), (HttpKind.RESPONSE, len(RESPONSE)), (HttpKind.DATA, 1)]
    assert counters["events_lost"] == 0


# A keep-alive connection open before tracing starts, polled without
# blocking all through the attach.
POLLING_SERVER = LISTENING_SERVER + r"""
REQUEST_LEN, RESPONSE = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
conn, _ = srv.accept()
print("accepted", flush=True)
while True:
    try:
        request = conn.recv(REQUEST_LEN, socket.MSG_DONTWAIT)
        break
    except BlockingIOError:
        time.sleep(0.0002)
conn.sendall(RESPONSE)
conn.recv(1)
"""


@pytest.mark.parametrize("pending", ["auto", "hash"])
def test_a_connection_polled_during_attach_is_traced_once_seeded(pending, python_script):
    server = python_script(POLLING_SERVER, str(len(REQUEST)), RESPONSE.hex())
    port = int(server.stdout.readline())
    with socket.create_connection(("127.0.0.1", port)) as client:
        assert server.stdout.readline().strip() == "accepted"
        with KernelCapture(server.pid, options={"sockets": {"pending": pending}}) as capture:
            client.sendall(REQUEST)
            assert read_exactly(client, len(RESPONSE)) == RESPONSE
            client.sendall(b"x")
            server.wait(timeout=10)
            events, counters = capture.finish()

    io = [(e.kind, e.bytes) for e in bytes_moved(events, server.pid)]
    assert io == [(HttpKind.REQUEST, len(REQUEST)), (HttpKind.RESPONSE, len(RESPONSE)), (HttpKind.DATA, 1)]
    assert counters["events_lost"] == 0
