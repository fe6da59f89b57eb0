"""Bad input gets one clear sentence, a non-zero exit and no traceback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from inferprobe.collector.errors import EnvironmentProblem, TargetProblem

from tests.support.cli import assert_one_sentence, run_inferprobe
from tests.support.kernel import needs_root
from tests.support.paths import SERVERS
from tests.support.processes import Recorder, inferprobe_cmd


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@needs_root
def test_dead_pid(tmp_path):
    pid = _dead_pid()
    result = run_inferprobe("record", "-p", str(pid), "-d", "1", "-o", str(tmp_path / "r.ipr"))
    assert_one_sentence(result, TargetProblem.exit_code, f"no process with pid {pid}")
    assert not (tmp_path / "r.ipr").exists()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to drop privileges")
def test_no_permission(tmp_path, sse_server):
    os.chmod(tmp_path, 0o777)
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
           *inferprobe_cmd("record", "-p", str(sse_server.pid), "-d", "1",
                           "-o", str(tmp_path / "r.ipr"))]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert_one_sentence(result, EnvironmentProblem.exit_code, "needs root", "sudo")


@needs_root
def test_a_btf_file_that_is_not_btf(tmp_path, sse_server):
    bad = tmp_path / "not.btf"
    bad.write_text("not BTF\n")
    result = run_inferprobe("record", "-p", str(sse_server.pid), "-d", "1", "-o", str(tmp_path / "r.ipr"),
                            "--btf", str(bad))
    assert_one_sentence(result, EnvironmentProblem.exit_code, "did not load", str(bad), "format invalid")
    assert not (tmp_path / "r.ipr").exists() or (tmp_path / "r.ipr").stat().st_size == 0


@needs_root
def test_kill_9_of_recorder_keeps_what_was_flushed(tmp_path, sse_server):
    from tests.servers import sse_client

    recording = tmp_path / "killed.ipr"
    rec = Recorder([sse_server.pid], recording)
    sse_client.run_load("127.0.0.1", sse_server.port, connections=2, requests_per_connection=5,
                        body_factory=lambda c, i: {"prompt": "a b c", "max_tokens": 3,
                                                   "stream": True, "interval_ms": 1})
    time.sleep(1.5)  # the recorder flushes at least once a second
    rec.proc.kill()
    rec.proc.wait()
    result = run_inferprobe("report", str(recording), "--format", "json")
    assert result.returncode == 0
    assert "did not stop cleanly" in result.stderr
    import json

    doc = json.loads(result.stdout)
    assert len([r for r in doc["requests"] if r["outcome"] == "complete"]) == 10


@needs_root
def test_export_to_a_dead_backend_is_one_sentence(tmp_path):
    """The OTel SDK's own log lines ("Failed to export", "Exporter already
    shutdown, ignoring batch") do not join inferprobe's sentence."""
    server = subprocess.Popen([sys.executable, str(SERVERS / "sse_server.py"),
                               "--host", "127.0.0.1", "--port", "0", "--log", str(tmp_path / "s.log")],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline().split(":")[-1])
        recording = tmp_path / "r.ipr"
        rec = Recorder([server.pid], recording, "--duration", "30")
        for _ in range(3):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
        rec.stop()
    finally:
        server.terminate()
        server.wait()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    for protocol in ("grpc", "http/protobuf"):
        result = run_inferprobe("export", str(recording), "--otlp", "--protocol", protocol, "--endpoint",
                                f"http://127.0.0.1:{dead}", "--otlp-timeout", "0.5", "--wait", "3")
        assert_one_sentence(result, 6, "were not delivered")
