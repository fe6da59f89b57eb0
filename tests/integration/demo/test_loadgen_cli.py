"""The load generator against the real demo server (its one-line errors: tests/unit/demo)."""

from __future__ import annotations

import json
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
