"""`inferprobe top` in a pseudo-terminal (pexpect, 80x24) against a loaded server."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.servers import sse_client
from tests.support.kernel import needs_root
from tests.support.paths import SERVERS
from tests.support.processes import ListeningProgram, inferprobe_cmd

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


def _plain_lines_until(proc: subprocess.Popen, pattern: str, accept, timeout_s: float = 40) -> list[str]:
    """Reads top's plain lines until one matches pattern and accept(match); returns them all."""
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines.append(proc.stdout.readline())
        m = re.search(pattern, lines[-1])
        if m and accept(m):
            return lines
    raise AssertionError(f"no line matched {pattern!r}:\n{''.join(lines[-8:])}")


def _stop_top(proc: subprocess.Popen, stop: threading.Event, loader: threading.Thread) -> None:
    stop.set()
    proc.terminate()
    proc.wait(timeout=30)
    if loader.is_alive():
        loader.join()


def test_top_prints_plain_lines_when_not_a_terminal(sse_server):
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(sse_server.port, stop))
    proc = subprocess.Popen(inferprobe_cmd("top", "-p", str(sse_server.pid), "--interval", "0.5"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("inferprobe: attached")
        loader.start()
        lines = _plain_lines_until(proc, r"requests=(\d+)", lambda m: int(m.group(1)) > 0, timeout_s=30)
        assert "\x1b[" not in "".join(lines)  # no terminal escapes in a pipe
    finally:
        _stop_top(proc, stop, loader)
    assert proc.returncode == 0


def test_top_locks_shows_the_share_of_requests_flagged_for_lock_waits():
    """lock_server.py: /contend requests wait on a held threading.Lock about half
    their time (ratio > 0.37, the server measures it itself), /free ones never.
    With only /free in the window the share is 0 %; with only /contend, all."""
    server = ListeningProgram([sys.executable, str(SERVERS / "lock_server.py")])
    phase = {"path": "/free"}
    stop = threading.Event()

    def load() -> None:
        with ThreadPoolExecutor(3) as pool:
            while not stop.is_set():
                url = f"{phase['path']}?cycles=10&sleep_us=4000"
                list(pool.map(server.get, [url] * 3))

    proc = subprocess.Popen(inferprobe_cmd("top", "-p", str(server.pid), "--locks", "--window", "3",
                                           "--interval", "0.5"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    loader = threading.Thread(target=load)
    try:
        assert proc.stdout.readline().startswith("inferprobe: attached")
        loader.start()
        share = r"mutex_flagged=(\d+)% judged=(\d+)"
        _plain_lines_until(proc, share, lambda m: int(m.group(2)) >= 3 and int(m.group(1)) == 0)
        phase["path"] = "/contend"
        # once the /free requests have left the 3 s window, every judged request contended
        _plain_lines_until(proc, share, lambda m: int(m.group(2)) >= 3 and int(m.group(1)) == 100)
    finally:
        _stop_top(proc, stop, loader)
        server.stop()
    assert proc.returncode == 0, proc.stderr.read()
