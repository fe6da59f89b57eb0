"""Shared fixtures: the test SSE server, and running `inferprobe record`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVERS = REPO / "tests" / "servers"
sys.path.insert(0, str(SERVERS))
sys.path.insert(0, str(REPO / "tests"))

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="loads BPF programs: needs root")


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
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Recorder:
    """`inferprobe record` as a subprocess; start() returns once attached."""

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


@pytest.fixture
def sse_server(tmp_path):
    server = ServerProcess(tmp_path / "server_log.jsonl")
    yield server
    server.stop()
