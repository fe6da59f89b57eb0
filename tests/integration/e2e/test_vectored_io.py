"""Requests and token chunks through vectored I/O (recvmsg, writev, sendmsg).

tests/servers/vectored_sse.py writes each token chunk as three iovecs and
ends every response with the chunked terminator split across two iovecs,
on a keep-alive connection: the tracer must count every token and see each
response end where the server's last write returned, not at the next
request or the close.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from tests.support.kernel import needs_root
from tests.support.paths import SERVERS
from tests.support.processes import Recorder, inferprobe_cmd

pytestmark = [pytest.mark.bpf, needs_root]

REQUESTS = 3
TOKENS = 5  # vectored_sse.TOKENS
END_TOLERANCE_NS = 2_000_000  # the tracer's end (exit of the last write) vs the server's clock after it


def test_vectored_writes_count_tokens_and_end_responses(tmp_path):
    server = subprocess.Popen([sys.executable, str(SERVERS / "vectored_sse.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline().split()[1])
        recording = tmp_path / "vectored.ipr"
        rec = Recorder([server.pid], recording, "--no-usdt")
        with socket.create_connection(("127.0.0.1", port)) as client:
            for i in range(REQUESTS):
                client.sendall(f"GET /stream/{i} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                got = b""
                while not got.endswith(b"\r\n0\r\n\r\n"):
                    got += client.recv(4096)
                time.sleep(0.05)  # a gap before the next request on the same connection
            time.sleep(0.3)
            rec.stop()
        out, _ = server.communicate("", timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    ends = json.loads(out.strip().splitlines()[-1])["ends_ns"]
    report = json.loads(subprocess.run(inferprobe_cmd("report", str(recording), "--format", "json"),
                                       capture_output=True, text=True, check=True).stdout)
    requests = sorted(report["requests"], key=lambda r: r["t_ingress_ns"])
    assert [r["path"] for r in requests] == [f"/stream/{i}" for i in range(REQUESTS)]
    for r, server_end in zip(requests, ends, strict=True):
        assert r["outcome"] == "complete", r
        assert r["streaming"] is True
        assert len(r["token_ns"]) == TOKENS, r["token_chunk_events"]
        assert r["t_done_ns"] is not None
        # ended by the split chunked terminator, before the client's next request
        assert abs(r["t_end_ns"] - server_end) <= END_TOLERANCE_NS, (r["t_end_ns"], server_end)
