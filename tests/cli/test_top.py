"""`inferprobe top` in a pseudo-terminal (pexpect, 80x24) against a loaded server."""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest

import sse_client
from conftest import inferprobe_cmd, needs_root

pytestmark = [needs_root, pytest.mark.bpf]


SKIP = r"(?:\x1b\[[0-9;]*m|\s|│)*"  # styling, spaces and table rules between a label and its value


def _load(port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        sse_client.run_load("127.0.0.1", port, connections=4, duration_s=1.0,
                            body_factory=lambda c, i: {"prompt": "top", "max_tokens": 4, "stream": True,
                                                       "interval_ms": 3})


def test_top_shows_live_requests_and_quits_on_q(sse_server):
    pexpect = pytest.importorskip("pexpect")
    cmd = inferprobe_cmd("top", "-p", str(sse_server.pid))
    child = pexpect.spawn(cmd[0], cmd[1:], dimensions=(24, 80), encoding="utf-8", timeout=60,
                          env={"TERM": "xterm-256color", "PATH": "/usr/bin:/bin"})
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(sse_server.port, stop))
    try:
        child.expect("inferprobe top")  # attached and drew a first frame
        loader.start()
        # a frame showing a non-zero request rate and a TTFT percentile
        deadline = time.monotonic() + 30
        seen = None
        while time.monotonic() < deadline:
            child.expect(r"requests/s" + SKIP + r"([0-9.]+)")
            if float(child.match.group(1)) > 0:
                child.expect(r"time to first token" + SKIP + r"([0-9.]+)")
                seen = float(child.match.group(1))
                break
        assert seen is not None and seen > 0, "top never showed requests"
        child.send("q")
        child.expect(pexpect.EOF, timeout=15)
    finally:
        stop.set()
        if loader.is_alive():
            loader.join()
        if child.isalive():  # detach cleanly even when an assertion failed
            child.sendcontrol("c")
            child.expect(pexpect.EOF, timeout=30)
        child.close()
    assert child.exitstatus == 0, child.before


def test_top_prints_plain_lines_when_not_a_terminal(sse_server):
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(sse_server.port, stop))
    proc = subprocess.Popen(inferprobe_cmd("top", "-p", str(sse_server.pid), "--interval", "0.5"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("inferprobe: attached")
        loader.start()
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            lines.append(proc.stdout.readline())
            m = re.search(r"requests=(\d+)", lines[-1])
            if m and int(m.group(1)) > 0:
                break
        assert m and int(m.group(1)) > 0, lines
        assert "\x1b[" not in "".join(lines)  # no terminal escapes in a pipe
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=15)
        if loader.is_alive():
            loader.join()
    assert proc.returncode == 0
