"""A read already blocked when tracing began (bpf/sock.bpf.c, recover_in_flight).

An idle threaded server sits in recv() on a keep-alive connection when the
tracer attaches, so the kernel never saw that syscall begin. Its request
must still be recorded, rebuilt at the syscall's exit from the thread's
saved registers, flagged BEGAN_UNSEEN, and timed between the client's own
send and receive; the next request on the connection is an ordinary one.
But if its fd was closed under it and reused by a newer connection, its
bytes belong to neither, and nothing is recorded for them.
"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from inferprobe.collector.attach.probe_sets.sockets import sock_object_usable
from inferprobe.collector.model.events import EventType, HttpFlag, HttpKind

from tests.support.kernel import KernelCapture, bytes_moved, needs_root
from tests.support.processes import LISTENING_SERVER

pytestmark = [
    pytest.mark.bpf,
    needs_root,
    pytest.mark.skipif(not sock_object_usable(),
                       reason="needs sock.bpf.o: x86-64, task-local storage and bpf_task_pt_regs "
                       "(with BTF) to tell unseen threads and read their syscall's arguments, and "
                       "bpf_loop (Linux 5.17+)"),
]

REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
RECVFROM = 45  # x86-64 syscall number, as /proc/<pid>/task/<tid>/syscall shows it

# Both servers: listen, print the port, then accept; each then prints the
# tid of the worker thread that blocks in recv().
LISTEN = LISTENING_SERVER + r"""
REQUEST_LEN, RESPONSE = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
"""

SERVER = LISTEN + r"""
conn, _ = srv.accept()

def serve():
    while conn.recv(REQUEST_LEN):
        conn.sendall(RESPONSE)

worker = threading.Thread(target=serve)
worker.start()
print(worker.native_id, flush=True)
worker.join()
"""


def blocked_in(pid: int, tid: int) -> int | None:
    """The syscall number a thread is blocked in, None if it is running."""
    fields = open(f"/proc/{pid}/task/{tid}/syscall").read().split()
    return int(fields[0]) if fields and fields[0].lstrip("-").isdigit() else None


def connect_until_worker_blocks(server) -> tuple[int, socket.socket, int]:
    """Connects to a LISTEN server and waits until its worker sits in recv():
    (port, client socket, worker tid)."""
    port = int(server.stdout.readline())
    client = socket.create_connection(("127.0.0.1", port))
    worker = int(server.stdout.readline())
    deadline = time.monotonic() + 10
    while blocked_in(server.pid, worker) != RECVFROM:
        assert time.monotonic() < deadline, "the worker never blocked in recv()"
        time.sleep(0.02)
    return port, client, worker


def test_a_request_read_blocked_at_attach_is_recorded(python_script):
    server = python_script(SERVER, str(len(REQUEST)), RESPONSE.hex())
    _, client, worker = connect_until_worker_blocks(server)
    client_port = client.getsockname()[1]

    with KernelCapture(server.pid) as capture:  # the worker is inside recv() all along
        sent_ns = time.monotonic_ns()
        client.sendall(REQUEST)
        assert client.recv(len(RESPONSE)) == RESPONSE
        answered_ns = time.monotonic_ns()
        client.sendall(REQUEST)
        assert client.recv(len(RESPONSE)) == RESPONSE
        client.close()
        server.wait(timeout=10)
        events, counters = capture.finish()

    io = bytes_moved(events, server.pid)
    assert [(e.kind, e.tid, bool(e.flags & HttpFlag.BEGAN_UNSEEN)) for e in io] == [
        (HttpKind.REQUEST, worker, True),
        (HttpKind.RESPONSE, worker, False),
        (HttpKind.REQUEST, worker, False),
        (HttpKind.RESPONSE, worker, False),
    ]
    first = io[0]
    assert first.path == "/v1/models" and first.bytes == len(REQUEST)
    assert first.ts_ns == first.exit_ns, "an unseen start stands at the exit"
    assert sent_ns <= first.exit_ns <= answered_ns
    assert len({e.conn_id for e in io}) == 1 and first.conn_id != 0
    # open at attach, so no accept told its peer: the kernel names it once, at the first read
    peers = [e for e in events if e.type == EventType.CONN_PEER and e.pid == server.pid]
    assert [(p.conn_id, p.peer_port, p.peer_addr[:4]) for p in peers] == [
        (first.conn_id, client_port, socket.inet_aton("127.0.0.1"))]
    assert counters["events_lost"] == 0


# The fd the worker is blocked on is closed under it and handed to a newer
# connection; the old peer's bytes then end the worker's recv().
REUSED = LISTEN + r"""
old, _ = srv.accept()
old_fd = old.fileno()
worker = threading.Thread(target=old.recv, args=(REQUEST_LEN,))
worker.start()
print(worker.native_id, flush=True)
sys.stdin.readline()               # the tracer is attached
old.close()                        # the worker stays inside recv() on the old socket
new, _ = srv.accept()
print(new.fileno() == old_fd, flush=True)
new.recv(REQUEST_LEN)
new.sendall(RESPONSE)
worker.join()
new.recv(1)
"""


def test_a_read_begun_on_a_socket_since_closed_is_not_given_to_the_fds_new_connection(python_script):
    server = python_script(REUSED, str(len(REQUEST)), RESPONSE.hex(), stdin=subprocess.PIPE)
    port, old_client, worker = connect_until_worker_blocks(server)

    with KernelCapture(server.pid) as capture:
        server.stdin.write("go\n")
        server.stdin.flush()
        new_client = socket.create_connection(("127.0.0.1", port))
        assert server.stdout.readline().strip() == "True", "precondition: the fd was reused"
        new_client.sendall(REQUEST)
        assert new_client.recv(len(RESPONSE)) == RESPONSE
        old_client.sendall(REQUEST)          # ends the worker's recv() on the old socket
        new_client.sendall(b"x")
        server.wait(timeout=10)
        events, counters = capture.finish()
    old_client.close()
    new_client.close()

    io = bytes_moved(events, server.pid)
    assert worker not in {e.tid for e in io}, "the old socket's bytes were credited to the new one"
    assert [(e.kind, e.bytes) for e in io] == [
        (HttpKind.REQUEST, len(REQUEST)), (HttpKind.RESPONSE, len(RESPONSE)), (HttpKind.DATA, 1)]
    assert len({e.conn_id for e in io}) == 1
    assert counters["events_lost"] == 0
