"""The load generator against the real server, and the demo command's one-line errors."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time

from inferprobe.demo import loadgen


def test_loadgen_agrees_with_an_independent_measurement(demo_server, tmp_path):
    """One stream at a time: each E2E sits inside the wall-clock window measured around it,
    back-to-back E2Es fill that window, and token counts match the server's own usage."""
    before = demo_server.get("/stats")["tokens_generated"]
    t0 = time.monotonic_ns()
    results, wall = loadgen.run(demo_server.url, concurrency=1, count=3, max_tokens=8)
    t1 = time.monotonic_ns()
    after = demo_server.get("/stats")["tokens_generated"]
    summary = loadgen.summarize(results, wall, loadgen.token_events)
    rows = loadgen.per_request(results)
    assert summary["completed"] == 3 and summary["errors"] == 0
    assert all(t0 <= r["t_send_ns"] < r["t_token_ns"][0] <= r["t_end_ns"] <= t1 for r in rows)
    e2e_ns = [r["t_end_ns"] - r["t_send_ns"] for r in rows]
    assert 0.8 * (t1 - t0) <= sum(e2e_ns) <= t1 - t0
    # Token counts: the client's, the server's usage chunk, the engine's counter.
    usages = [json.loads(res.events[-1])["usage"]["completion_tokens"] for res in results]
    assert [r["tokens"] for r in rows] == usages
    assert sum(usages) == summary["tokens"] == after - before
    # The summary's percentiles are those of the per-request timestamps.
    assert summary["e2e_ms_p50"] == round(statistics.median(e2e_ns) / 1e6, 3)
    ttft = [(r["t_token_ns"][0] - r["t_send_ns"]) / 1e6 for r in rows]
    assert summary["ttft_ms_p50"] == round(statistics.median(ttft), 3)
    # Request ids are decimal and echoed back by the server as the response id.
    for res in results:
        assert json.loads(res.events[0])["id"] == f"cmpl-{res.request_id}"


def test_loadgen_cli_json(demo_server, tmp_path):
    out = tmp_path / "load.json"
    proc = subprocess.run(
        [sys.executable, "-m", "inferprobe.cli.main", "demo", "--load", "2", "--count", "2",
         "--max-tokens", "4", "--url", demo_server.url, "--json", str(out)],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "p99" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["summary"]["completed"] == 2 and len(doc["requests"]) == 2
    row = doc["requests"][0]
    assert row["request_id"].isdigit() and row["tokens"] == len(row["t_token_ns"]) >= 1
    assert doc["meta"]["clock"].startswith("CLOCK_MONOTONIC")


def _one_line_error(proc: subprocess.CompletedProcess, words: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_busy_port_is_one_clear_error():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        proc = subprocess.run([sys.executable, "-m", "inferprobe.cli.main", "demo", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    _one_line_error(proc, f"port {port} on 127.0.0.1 is already in use")


def test_load_without_a_server_is_one_clear_error():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    proc = subprocess.run([sys.executable, "-m", "inferprobe.cli.main", "demo", "--load", "1", "--count", "1",
                           "--url", f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    _one_line_error(proc, "no request completed")


def test_load_options_without_load():
    proc = subprocess.run([sys.executable, "-m", "inferprobe.cli.main", "demo", "--count", "3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    _one_line_error(proc, "--count only applies with --load N")
