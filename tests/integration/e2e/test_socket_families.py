"""Requests over IPv6 and Unix stream sockets are traced like IPv4 ones."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.support.kernel import needs_root
from tests.support.paths import SERVERS
from tests.support.processes import Recorder, inferprobe_cmd

pytestmark = [needs_root, pytest.mark.bpf]

# Serves with forking_server.serve() in-process (no fork) on a listener of
# the requested family, printing READY once it listens.
SERVER = """
import socket, sys
sys.path.insert(0, {servers!r})
from forking_server import serve
family = sys.argv[1]
if family == "unix":
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[2])
    listener.listen()
else:
    listener = socket.create_server(("::1", 0), family=socket.AF_INET6)
print("READY", listener.getsockname()[1] if family != "unix" else sys.argv[2], flush=True)
if sys.argv[3] == "wait":
    sys.stdin.readline()  # accept() starts after the recorder attached
serve(listener)
"""


def _exchange(sock: socket.socket, n: int) -> None:
    for i in range(n):
        sock.sendall(f"POST /v1/x{i} HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{{}}".encode())
        reply = b""
        while not reply.endswith(b'{"ok": true}'):
            reply += sock.recv(4096)


CASES = [("ipv6", False), ("unix", False), ("ipv6", True)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    """A server per case, all under one recorder (a BPF compile each would cost ~10 s here):
    each case's requests and connection are told apart by its server's pid."""
    tmp = tmp_path_factory.mktemp("families")
    cases = [case for case in CASES if case[0] != "ipv6" or socket.has_ipv6]
    servers = {case: subprocess.Popen(
        [sys.executable, "-c", SERVER.format(servers=str(SERVERS)), case[0], str(tmp / f"srv{k}.sock"),
         "now" if case[1] else "wait"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for k, case in enumerate(cases)}
    local_ports = {}
    try:
        addresses = {case: server.stdout.readline().split()[1] for case, server in servers.items()}
        rec = Recorder([server.pid for server in servers.values()], tmp / "f.ipr")
        for server in servers.values():  # the in-flight servers never read it
            server.stdin.write("go\n")
            server.stdin.flush()
        for (family, in_flight), address in addresses.items():
            if family == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(address)
            else:
                sock = socket.create_connection(("::1", int(address)))
            with sock:
                local_ports[(family, in_flight)] = sock.getsockname()[1] if family == "ipv6" else None
                _exchange(sock, 4)
        rec.stop()
    finally:
        for server in servers.values():
            server.kill()
            server.wait()
    doc = json.loads(subprocess.run(inferprobe_cmd("report", str(tmp / "f.ipr"), "--format", "json"),
                                    capture_output=True, text=True, check=True).stdout)
    return {"doc": doc, "pids": {case: server.pid for case, server in servers.items()},
            "local_ports": local_ports}


@pytest.mark.parametrize(("family", "accept_in_flight"), CASES)
def test_family(family, accept_in_flight, recorded):
    """accept_in_flight: the server already sits in accept() when the recorder
    attaches (an idle threaded server): the connection must still be traced, and
    its peer, which that accept()'s entry would have told, is named by the kernel
    at the connection's first read instead."""
    if family == "ipv6" and not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    pid, doc = recorded["pids"][(family, accept_in_flight)], recorded["doc"]
    requests = [r for r in doc["requests"] if r["pid"] == pid]
    assert [r["path"] for r in requests] == [f"/v1/x{i}" for i in range(4)]
    assert all(r["outcome"] == "complete" and r["status"] == 200 for r in requests)
    (conn,) = [c for c in doc["connections"] if c["pid"] == pid]
    assert conn["family"] == family
    if family == "ipv6":
        local_port = recorded["local_ports"][(family, accept_in_flight)]
        assert conn["peer"] == "::1" and conn["peer_port"] == local_port
