"""A real vLLM (its CPU build, scripts/setup_vllm.sh) for the engine tests: started once per
run on a free port with the demo model, its OTLP traces sent to a sink in the test, and
stopped. Start-up takes one to two minutes (vLLM compiles its model at each start)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.llama_server import free_port
from tests.support.otlp_sink import OtlpTraceSink
from tests.support.paths import REPO
from tests.support.processes import answers_http, stop_process

SETUP = REPO / "scripts" / "setup_vllm.sh"
MODEL = Path(os.environ.get("INFERPROBE_VLLM_CACHE", "/var/cache/inferprobe/vllm")) / "model"
START_TIMEOUT_S = 300


def vllm_cli() -> Path:
    out = subprocess.run(["bash", str(SETUP), "--path"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("vLLM's CPU build is not set up: run scripts/setup_vllm.sh (about 2 minutes, 3.5 GB)")
    return Path(out.stdout.strip())


class RequestSpans(OtlpTraceSink):
    """An OTLP/HTTP traces endpoint keeping each vLLM llm_request span's attributes by request id."""

    def __init__(self) -> None:
        self.by_id: dict[str, dict] = {}
        super().__init__()

    def receive(self, span) -> None:
        attrs = {a.key: (a.value.double_value or a.value.int_value or a.value.string_value)
                 for a in span.attributes}
        if "gen_ai.request.id" in attrs:
            self.by_id[str(attrs["gen_ai.request.id"])] = attrs


class VllmServer:
    def __init__(self, log: Path, otlp_port: int | None = None, max_num_seqs: int = 4):
        self.port = free_port()
        self.log = log.open("w")
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", HF_HUB_OFFLINE="1",
                   OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf", OTEL_BSP_SCHEDULE_DELAY="200")
        otlp = ["--otlp-traces-endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces"] if otlp_port else []
        self.proc = subprocess.Popen(
            [str(vllm_cli()), "serve", str(MODEL), "--served-model-name", "smol", "--max-model-len", "2048",
             "--host", "127.0.0.1", "--port", str(self.port), "--max-num-seqs", str(max_num_seqs),
             # no torch.compile: its cache fails to load in this vLLM ("'function' object has no
             # attribute 'finalize_loading'"), so every start compiled the model again, 35 s of
             # a 67 s start here; eager, vLLM answers after 22 s and its steps take ~15 % longer.
             # Nothing checked here depends on how the model's layers run.
             "-O0", *otlp],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        if answers_http(self.proc, self.port, "/v1/models", timeout_s=START_TIMEOUT_S, poll_s=2):
            return
        if self.proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {self.proc.returncode}: see {log}")
        self.stop()
        raise RuntimeError(f"vLLM did not answer within {START_TIMEOUT_S} s: see {log}")

    def stream(self, prompt: str, max_tokens: int) -> tuple[int, str]:
        """One streamed chat completion: (the client's own port, the response's "id")."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        body = json.dumps({"model": "smol", "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": max_tokens, "stream": True})
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        port = conn.sock.getsockname()[1]
        response = conn.getresponse()
        assert response.status == 200
        first = next(line for line in response.read().decode().splitlines() if line.startswith("data: {"))
        conn.close()
        return port, json.loads(first[len("data: "):])["id"]

    def burst(self, n: int, max_tokens: int) -> dict[int, str]:
        """n streams at once, each its own connection: the response id by client port."""
        ids: dict[int, str] = {}

        def one(i: int) -> None:
            port, rid = self.stream(f"Story {i}: a cat and a boat.", max_tokens)
            ids[port] = rid

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return ids

    def stop(self) -> None:
        stop_process(self.proc, timeout=30)
        self.log.close()
