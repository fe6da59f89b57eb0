"""What the demo tests share: the server handle and the limits it is started with."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

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
