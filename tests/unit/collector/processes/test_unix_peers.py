"""The ends of a socketpair one process holds, told apart from Unix IPC with another process,
by the running kernel's own Unix socket table (sock_diag)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from inferprobe.collector.processes import targets
from inferprobe.collector.processes.unix_peers import self_paired_fds


def _unix_sockets_of(pid: int) -> dict[int, int]:
    inodes = targets.socket_inodes(pid)
    return {fd: inodes[fd] for fd in targets.unix_socket_fds(pid) if fd in inodes}


def test_a_socketpair_is_self_paired_and_a_connection_to_another_process_is_not(tmp_path):
    path = str(tmp_path / "other.sock")
    other = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys\n"
        f"s = socket.socket(socket.AF_UNIX); s.bind({path!r}); s.listen()\n"
        "print('ready', flush=True); c, _ = s.accept(); sys.stdin.readline()\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "ready"
        a, b = socket.socketpair()
        to_other = socket.socket(socket.AF_UNIX)
        to_other.connect(path)
        with a, b, to_other:
            paired = self_paired_fds(os.getpid(), _unix_sockets_of(os.getpid()))
            assert {a.fileno(), b.fileno()} <= paired
            assert to_other.fileno() not in paired
    finally:
        other.kill()
        other.wait()


def test_no_unix_sockets_asks_nothing():
    assert self_paired_fds(os.getpid(), {}) == set()
