"""llama.cpp's llama-server for the engine tests: the binary scripts/build_llama_server.sh
cached, started on a free port with the test model, and stopped."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.processes import answers_http, stop_process

BUILD = REPO / "scripts" / "build_llama_server.sh"


def versions() -> list[str]:
    return subprocess.run(["bash", str(BUILD), "--versions"], capture_output=True, text=True,
                          check=True).stdout.split()


def built_llama_server(version: str | None = None) -> Path:
    """The cached binary of that version (default: the newest), or a skip saying how to build it."""
    version = version or versions()[-1]
    out = subprocess.run(["bash", str(BUILD), "--path", version], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"llama-server {version} is not built: run scripts/build_llama_server.sh "
                    "(sudo make setup does)")
    return Path(out.stdout.strip())


def model() -> Path:
    from inferprobe.collector.errors import EnvironmentProblem
    from inferprobe.demo.model import find_gguf

    try:
        return find_gguf()
    except EnvironmentProblem as err:
        pytest.skip(f"the SmolLM2 GGUF is not installed: {err}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    def __init__(self, binary: Path, slots: int, log: Path | str, threads: int = 2):
        self.port = free_port()
        self.log_path = Path(log)
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [str(binary), "-m", str(model()), "--host", "127.0.0.1", "--port", str(self.port),
             "-np", str(slots), "-c", str(1024 * slots), "-t", str(threads), "--metrics", "--no-webui"],
            stdout=self.log, stderr=subprocess.STDOUT)
        if answers_http(self.proc, self.port, "/health", timeout_s=60, poll_s=0.25):
            return
        self.stop()
        pytest.fail(f"llama-server did not come up: {self.log_path.read_text()[-2000:]}")

    def complete(self, prompt: str, n_predict: int) -> dict:
        """One streaming completion; its local port and llama.cpp's final timings."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.connect()
        port = conn.sock.getsockname()[1]
        body = json.dumps({"prompt": prompt, "n_predict": n_predict, "stream": True,
                           "cache_prompt": False, "temperature": 0, "ignore_eos": True})
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        timings = None
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and '"timings"' in line:
                timings = json.loads(line[6:])["timings"]
        conn.close()
        return {"port": port, "timings": timings}

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)
        self.log.close()
