"""Fixtures both tiers use: inline test servers, the test SSE server, the demo inference server.

Helpers are in tests/support/ and imported from there, never from this file.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.demo import MAX_BATCH, DemoServer, demo_extra_missing, started_demo
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

@pytest.fixture(scope="session")
def demo_server(tmp_path_factory) -> DemoServer:
    missing = demo_extra_missing()
    if missing:
        pytest.skip(f"the demo extra is not installed ({', '.join(missing)} missing): run make setup")
    with started_demo(tmp_path_factory.mktemp("demo") / "server.log", max_batch=MAX_BATCH) as server:
        yield server
