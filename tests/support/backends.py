"""Real backends for the export tests: Arize Phoenix (OTLP) and Prometheus.

Both run on 127.0.0.1 with their storage in a temporary directory and are
stopped by the fixtures that start them. scripts/setup.sh installs both
(Phoenix in /var/cache/inferprobe/phoenix-venv, Prometheus from Debian).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support.processes import stop_process

PHOENIX_PYTHON = Path(os.environ.get("PHOENIX_VENV", "/var/cache/inferprobe/phoenix-venv")) / "bin" / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 10) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} not ready after {timeout} s: {log.read_text()[-2000:]}")


class Phoenix:
    def __init__(self, workdir: Path):
        self.http_port, self.grpc_port = free_port(), free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.http_port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_WORKING_DIR": str(workdir),
            "PHOENIX_SQL_DATABASE_URL": f"sqlite:///{workdir / 'phoenix.db'}",
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        for key in [k for k in env if k.startswith("OTEL_")]:
            del env[key]  # Phoenix must not trace itself into the store under test
        self.log = workdir / "phoenix.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([str(PHOENIX_PYTHON), "-m", "phoenix.server.main", "serve"],
                                         env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
        _wait_http(f"{self.http_url}/healthz", self.proc, self.log, timeout=120)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def spans(self) -> list[dict]:
        out: list[dict] = []
        cursor = None
        while True:
            query = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            page = get_json(f"{self.http_url}/v1/projects/default/spans?{urllib.parse.urlencode(query)}")
            out.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def stop(self) -> None:
        stop_process(self.proc)


class Prometheus:
    def __init__(self, workdir: Path, scrape_target: str):
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: inferprobe\n    static_configs:\n"
            f"      - targets: ['{scrape_target}']\n")
        self.log = workdir / "prometheus.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [shutil.which("prometheus") or "prometheus", f"--config.file={config}",
                 f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
        _wait_http(f"http://127.0.0.1:{self.port}/-/ready", self.proc, self.log, timeout=60)

    def query(self, expr: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        body = get_json(url)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        stop_process(self.proc)
