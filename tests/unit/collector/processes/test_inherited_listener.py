"""A target that only inherited its parent's listening socket (vLLM's EngineCore,
a multiprocessing child) is told apart from the process that serves it, and a
recording of it with no request names the parent instead of guessing TLS or HTTP/2.

Real processes, read from /proc: a Python parent that listens and then starts a
child that keeps the socket, once a Python child forked by multiprocessing (as
vLLM starts EngineCore) and once a C program (coreutils' sleep) given the fd.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferprobe.analyzers.no_requests import explain
from inferprobe.collector.model.recording import Recording
from inferprobe.collector.model.timeline import Connection
from inferprobe.collector.processes import targets

PARENT = r"""
import multiprocessing, os, socket, subprocess, sys, time
listener = socket.create_server(("127.0.0.1", 0))
if sys.argv[1] == "fork":
    def child():
        time.sleep(60)
    multiprocessing.set_start_method("fork")
    proc = multiprocessing.Process(target=child)
    proc.start()
    pid = proc.pid
else:
    pid = subprocess.Popen(["sleep", "60"], pass_fds=[listener.fileno()]).pid
print(pid, flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def _parent_and_listening_child(argv: list[str]):
    """Start a parent that prints its child's pid; yield both once the child listens; stop both."""
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 20
        while not targets.listening_sockets([child]):  # an exec'd child holds it once exec'd
            assert time.monotonic() < deadline, "the child never listened"
            time.sleep(0.02)
        yield parent.pid, child
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


@pytest.fixture(params=["fork", "exec"])
def family(request):
    with _parent_and_listening_child([sys.executable, "-c", PARENT, request.param]) as pids:
        yield pids


def test_the_parent_that_holds_the_same_listener_is_found(family):
    parent, child = family
    assert targets.sharing_ancestor([child]) == (parent, "parent")
    assert targets.sharing_ancestor([parent]) is None  # it holds its own socket
    # recorded together (record -p PARENT follows its children), the parent is a target
    # and no other process to point at: CI saw an idle server told to record itself
    assert targets.sharing_ancestor([parent, child]) is None
    # (further up, a terminal multiplexer may listen: not these two)
    assert (targets.listening_ancestor([parent, child]) or (0, ""))[0] not in (parent, child)


def test_a_child_that_accepted_nothing_is_pointed_at_its_parent(family):
    parent, child = family
    meta = {"targets": [{"pid": child}], "listening": targets.listening_sockets([child]),
            "listening_ancestor": {"pid": parent, "relation": "parent", "shared": True}}
    ipc = Connection(conn_id=1, pid=child, fd=9, family="unix", peer=None, peer_port=None, t_open_ns=1,
                     role="client")
    sentence = explain(Recording(path=Path("r.ipr"), meta=meta), [], [ipc])
    assert sentence is not None and f"record -p {parent}" in sentence and "TLS" not in sentence
    assert "inherited from PID" in sentence and meta["listening"][0] in sentence


# A parent that serves TCP and starts a child that listens on sockets of its own, as
# vLLM's API server starts EngineCore (spawned; ZMQ on Unix sockets, torch.distributed
# on loopback ports): the child is pointed at the parent too. The Python child listens
# on both kinds, the Node child on a Unix socket only. The child's command line is the
# rest of argv.
SERVES_TCP = r"""
import socket, subprocess, sys, time
listener = socket.create_server(("127.0.0.1", 0))
print(subprocess.Popen(sys.argv[1:]).pid, flush=True)
time.sleep(60)
"""
UNIX_LISTENER_PY = ("import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); "
                    "s.listen(); t = socket.create_server(('127.0.0.1', 0)); time.sleep(60)")
UNIX_LISTENER_JS = "require('net').createServer().listen(process.argv[1]); setTimeout(() => {}, 60000)"


@pytest.fixture(params=["python", "node"])
def ipc_child(request, tmp_path):
    path = str(tmp_path / "engine.sock")
    if request.param == "python":
        child_argv = [sys.executable, "-c", UNIX_LISTENER_PY, path]
    else:
        from tests.support.node import node_binary

        child_argv = [node_binary(), "-e", UNIX_LISTENER_JS, path]
    with _parent_and_listening_child([sys.executable, "-c", SERVES_TCP, *child_argv]) as pids:
        yield pids


def test_a_child_listening_for_ipc_is_pointed_at_the_listening_parent(ipc_child):
    from inferprobe.collector.processes.targets import serving_ancestor

    parent, child = ipc_child
    served = targets.listening_sockets([parent])
    assert any(label.startswith("unix ") for label in targets.listening_sockets([child]))
    assert serving_ancestor([child]) == {"pid": parent, "relation": "parent", "listens_too": True,
                                         "its_listening": served}
    assert serving_ancestor([parent]) is None
    meta = {"targets": [{"pid": child}], "listening": targets.listening_sockets([child]),
            "listening_ancestor": serving_ancestor([child])}
    sentence = explain(Recording(path=Path("r.ipr"), meta=meta), [], [])
    assert sentence is not None and f"listens too ({served[0]})" in sentence
    assert f"record -p {parent}" in sentence and "idle" not in sentence


def test_an_api_server_whose_only_traffic_was_ipc_is_called_idle():
    # vLLM's API server between requests still talks to EngineCore over ZMQ: those reads
    # and writes are dropped in the kernel (io_skipped) and counted as IPC, no sign of TLS
    meta = {"targets": [{"pid": 10}], "listening": ["tcp 0.0.0.0:8000"]}
    recording = Recording(path=Path("r.ipr"), meta=meta, final={"io_skipped": 40, "conns_local_ipc": 2})
    ipc = Connection(conn_id=1, pid=10, fd=9, family="unix", peer=None, peer_port=None, t_open_ns=1,
                     role="server")
    sentence = explain(recording, [], [ipc])
    assert sentence is not None and "the server was idle" in sentence and "2 Unix-socket IPC" in sentence
    assert "TLS" not in sentence
    # one unread TCP connection, and the guess is back
    recording.final["conns_unrecognised"] = 1
    tcp = Connection(conn_id=2, pid=10, fd=10, family="ipv4", peer="127.0.0.1", peer_port=5555, t_open_ns=1,
                     role="server")
    assert "TLS" in explain(recording, [], [ipc, tcp])


def test_an_asyncio_server_whose_only_traffic_was_its_own_wake_ups_is_called_idle():
    # Its worker threads wake its loop through the loop's self-pipe, a socketpair it
    # holds both ends of (collector/processes/unix_peers.py): still open at the stop
    meta = {"targets": [{"pid": 10}], "listening": ["tcp 0.0.0.0:8000"]}
    recording = Recording(path=Path("r.ipr"), meta=meta, final={"io_skipped": 40},
                          snapshots={"sockets": {"open_self_pairs": 2}})
    sentence = explain(recording, [], [])
    assert sentence is not None and "the server was idle (its own wake-up socketpair aside)" in sentence
    assert "TLS" not in sentence
