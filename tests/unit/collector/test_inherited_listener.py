"""A target that only inherited its parent's listening socket (vLLM's EngineCore,
a multiprocessing child) is told apart from the process that serves it, and a
recording of it with no request names the parent instead of guessing TLS or HTTP/2.

Real processes, read from /proc: a Python parent that listens and then starts a
child that keeps the socket, once a Python child forked by multiprocessing (as
vLLM starts EngineCore) and once a C program (coreutils' sleep) given the fd.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferprobe.analyzers.no_requests import explain
from inferprobe.collector import targets
from inferprobe.collector.recording import Recording
from inferprobe.collector.timeline import Connection

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


@pytest.fixture(params=["fork", "exec"])
def family(request):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, request.param], stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while not targets.listening_sockets([child]):  # an exec'd child holds it once exec'd
        assert time.monotonic() < deadline, "the child never held the socket"
        time.sleep(0.02)
    yield parent.pid, child
    subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
    parent.kill()
    parent.wait()


def test_the_parent_that_holds_the_same_listener_is_found(family):
    parent, child = family
    assert targets.sharing_ancestor([child]) == (parent, "parent")
    assert targets.sharing_ancestor([parent]) is None  # it holds its own socket


def test_a_child_that_accepted_nothing_is_pointed_at_its_parent(family):
    parent, child = family
    meta = {"targets": [{"pid": child}], "listening": targets.listening_sockets([child]),
            "listening_ancestor": {"pid": parent, "relation": "parent", "shared": True}}
    ipc = Connection(conn_id=1, pid=child, fd=9, family="unix", peer=None, peer_port=None, t_open_ns=1,
                     role="client")
    sentence = explain(Recording(path=Path("r.ipr"), meta=meta), [], [ipc])
    assert sentence is not None and f"record -p {parent}" in sentence and "TLS" not in sentence
    assert "inherited from PID" in sentence and meta["listening"][0] in sentence
