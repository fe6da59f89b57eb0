"""Tracing the real demo server: socket trace + its USDT probes, checked against the client.

One recording (module fixture) of the demo server under 16 concurrent
streaming connections with short generations, plus bad input and a client
that hangs up mid-stream. The client measures when it sent each request and
received each token and end, and knows, per connection, which X-Request-Id
it sent; the tracer must agree with it where both see the same moment, and
tie every request to the id the server gave it without being told (the
server passes the socket fd, not the header).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import pytest

from inferprobe.analyzers.decompose import TTFT_PHASES
from inferprobe.collector.ingest.server_view import build_server_view
from inferprobe.collector.model.events import UsdtRecord, decode
from inferprobe.collector.model.recording import read_recording
from inferprobe.demo.loadgen import RequestIds, token_events
from inferprobe.demo.sse_client import connect, request_once, run_load

from tests.support.demo import DemoServer
from tests.support.kernel import needs_root
from tests.support.processes import Recorder, inferprobe_cmd

pytestmark = [pytest.mark.bpf, needs_root]

HOST = "127.0.0.1"
STREAMS = 16
REQUESTS = 32
MAX_TOKENS = 8
# The bound: the tracer's times agree with the client's own clock
# within 2 ms per request at the median where both see the same moment (a
# write and the client's recv() of it: loopback transit and the wake-up).
MEDIAN_TOLERANCE_NS = 2_000_000


def _body(conn: int, index: int) -> dict:
    prompts = ["The capital of France is", "Write a haiku about rain:", "List three colours:",
               "Explain TCP in one sentence:"]
    return {"prompt": prompts[(conn + index) % len(prompts)], "max_tokens": MAX_TOKENS, "stream": True}


def _raw(server: DemoServer, payload: bytes) -> int:
    """A request whose body is not JSON: returns the HTTP status."""
    sock = connect(HOST, server.port, timeout=30)
    try:
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
        sock.sendall(head + payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return int(data.split(b" ", 2)[1])
    finally:
        sock.close()


class Traced(NamedTuple):
    results: list          # the load client's own measurements, one per request
    bad_json: int          # HTTP status of the request with a body that is not JSON
    aborted: object        # the request whose client hung up mid-stream
    report: dict           # `inferprobe report --format json` of the recording
    stdout: str            # what `inferprobe record` printed
    recording: Path


@pytest.fixture(scope="module")
def traced(demo_server: DemoServer, tmp_path_factory) -> Traced:
    out = tmp_path_factory.mktemp("demo-trace")
    recorder = Recorder([demo_server.proc.pid], out / "demo.ipr")
    try:
        results = run_load(HOST, demo_server.port, connections=STREAMS, total_requests=REQUESTS,
                           body_factory=_body, path="/v1/completions", timeout=180,
                           request_id=RequestIds())
        bad_json = _raw(demo_server, b"{not json")
        sock = connect(HOST, demo_server.port, timeout=60)
        aborted = request_once(sock, HOST, "/v1/completions",
                               {"prompt": "Count to fifty:", "max_tokens": 48, "stream": True},
                               str(RequestIds()(0, 0)), abort_after_events=2, timeout=60)
        time.sleep(1.0)  # let the server notice the hang-up and fire request_end
    finally:
        stdout, stderr = recorder.stop()
    report = subprocess.run(inferprobe_cmd("report", str(out / "demo.ipr"), "--format", "json"),
                            capture_output=True, text=True, check=True)
    return Traced(results, bad_json, aborted, json.loads(report.stdout), stdout, out / "demo.ipr")


def _by_client_connection(report: dict) -> dict[tuple[int, int], dict]:
    """Recorded requests keyed by (client port, index on that connection)."""
    conns = {c["conn_id"]: c for c in report["connections"]}
    per_conn: dict[int, list[dict]] = defaultdict(list)
    for r in sorted(report["requests"], key=lambda r: r["t_ingress_ns"]):
        per_conn[r["conn"]].append(r)
    out = {}
    for conn_id, reqs in per_conn.items():
        port = conns[conn_id]["peer_port"]
        for i, r in enumerate(reqs):
            out[(port, i)] = r
    return out


def _client_and_recorded(traced: Traced):
    """(what the client measured, what was recorded) for each load request, in send order."""
    recorded = _by_client_connection(traced.report)
    per_port: dict[int, int] = defaultdict(int)
    for res in sorted(traced.results, key=lambda r: r.t_send_ns):
        index = per_port[res.local_port]
        per_port[res.local_port] += 1
        yield res, recorded[(res.local_port, index)]


def _why_untied(traced: Traced, rec: dict) -> str:
    """What the recording holds around a request the correlator left untied: its
    connection's fd and times, and every request_start the server fired with that fd.
    (One CI run once saw a request left untied and could not be looked at afterwards.)"""
    conn = next(c for c in traced.report["connections"] if c["conn_id"] == rec["conn"])
    usdt = [ev for ev in map(decode, read_recording(traced.recording).events) if isinstance(ev, UsdtRecord)]
    starts = sorted((s.t_start_ns, s.req_id, s.tid) for s in build_server_view(usdt).requests.values()
                    if s.conn_fd == conn["fd"])
    fields = {k: rec[k] for k in ("conn", "tid", "t_ingress_ns", "t_response_start_ns", "t_end_ns",
                                  "outcome")}
    return f"untied request {fields} on fd {conn['fd']}; request_start with that fd (t, id, tid): {starts}"


def test_usdt_probes_were_attached_and_seen(traced):
    report = traced.report
    assert "usdt" in report["probe_sets"]["active"], traced.stdout
    sched = report["scheduler"]
    for probe in ("request_start", "request_queued", "request_scheduled", "prefill_start", "prefill_end",
                  "decode_step_start", "decode_step_end", "token_emit", "request_end", "queue_depth",
                  "kv_usage"):
        assert probe in sched["probes_seen"]
    assert report["lost_events"] == 0


def test_every_request_is_tied_to_the_id_its_client_sent(traced):
    checked = 0
    for res, rec in _client_and_recorded(traced):
        assert res.error is None and res.status == 200, res.error
        if rec["usdt_request_id"] is None:
            pytest.fail(_why_untied(traced, rec))
        assert rec["usdt_request_id"] == int(res.request_id)
        assert rec["correlated_by"] == "conn_fd"
        checked += 1
    assert checked == REQUESTS and len({res.local_port for res in traced.results}) == STREAMS


def test_phases_sum_to_what_the_client_measured(traced):
    """The phases tile the request from the server's read of it to its last
    write, and those writes are where the client saw them.

    The client's and the tracer's clocks are one (CLOCK_MONOTONIC), so each
    boundary the tracer reports is compared with the client's own time for
    it: the first token write and the end are a loopback transit and a
    recv() wake-up from the client. The start is not compared that way: a
    request waits in the socket until the server reads it, which syscalls do
    not see (docs: ingress is the read), and under this load that wait was
    1.3-1.5 ms at the median on the 2-core VM, up to 16 ms."""
    first_err, end_err = [], []
    for res, rec in _client_and_recorded(traced):
        phases = rec["phases_ns"]
        for name in ("ingress", "queue", "schedule", "prefill", "first_token", "network_flush", "decode"):
            assert name in phases, (name, phases)
        ttft = sum(v for k, v in phases.items() if k in TTFT_PHASES)
        assert rec["t_ingress_ns"] + ttft == rec["t_first_token_ns"]
        assert rec["t_ingress_ns"] + sum(phases.values()) == rec["t_end_ns"]
        assert res.t_send_ns <= rec["t_ingress_ns"]  # read after it was sent: one clock
        first_err.append(token_events(res)[0] - rec["t_first_token_ns"])
        end_err.append(res.t_end_ns - rec["t_end_ns"])
        # The server's own view: it took part in decode steps and got all its tokens.
        assert rec["decode_steps"] >= 1 and rec["output_tokens"] == MAX_TOKENS
        assert rec["server_status"] == 0
    # the client receives what was written after it was written
    assert min(first_err + end_err) > 0, (sorted(first_err), sorted(end_err))
    assert statistics.median(first_err) <= MEDIAN_TOLERANCE_NS, sorted(first_err)
    assert statistics.median(end_err) <= MEDIAN_TOLERANCE_NS, sorted(end_err)


def test_queueing_shows_in_the_gauges_and_the_decomposition(traced):
    report = traced.report
    sched = report["scheduler"]
    # 16 streams against a batch of 4: requests must have waited.
    assert sched["scheduler_queue_length"]["max"] >= 1
    assert 0 < sched["token_occupancy_ratio"]["max"] <= 1
    assert sched["batch_size"]["max"] >= 2
    assert sched["batch_stall_duration_ns"]["count"] >= 1
    queued = [r["phases_ns"]["queue"] for r in report["requests"] if r["phases_ns"].get("queue")]
    assert max(queued) > 10_000_000  # some request waited over 10 ms for a slot
    rows = report["latency_decomposition"]
    assert set(rows) == {"p50", "p90", "p99"}
    for row in rows.values():
        assert sum(row["ttft_phases_ns"].values()) == row["ttft_ns"]


def test_itl_phases_sum_to_each_streamed_requests_inter_token_time(traced):
    client_err = []
    for res, rec in _client_and_recorded(traced):
        split = rec["itl_phases_ns"]
        assert split is not None and set(split) == {"decode", "stall", "flush", "other"}, rec
        assert min(split.values()) >= 0
        assert sum(split.values()) == rec["token_ns"][-1] - rec["token_ns"][0]
        assert split["decode"] > 0  # the demo engine's decode steps produced these tokens
        # and the total agrees with the inter-token time the client saw on its side
        events = token_events(res)
        client_err.append(abs(sum(split.values()) - (events[-1] - events[0])))
    assert statistics.median(client_err) <= MEDIAN_TOLERANCE_NS, sorted(client_err)
    top = traced.report["itl_phase_split"]
    assert set(top) == {"p50", "p90", "p99"}
    for row in top.values():
        assert sum(row["phases_ns"].values()) == row["itl_ns"]


def test_bad_input_and_a_hang_up_show_in_the_recording(traced):
    report, aborted = traced.report, traced.aborted
    assert traced.bad_json == 400
    statuses = [r["status"] for r in report["requests"]]
    assert 400 in statuses
    assert aborted.aborted
    gone = [r for r in report["requests"] if r["usdt_request_id"] == int(aborted.request_id)]
    assert len(gone) == 1
    assert gone[0]["outcome"] == "aborted"
    assert gone[0]["server_status"] == 1  # the server saw the client leave and freed the request


@pytest.fixture(scope="module")
def traced_with_locks(demo_server: DemoServer, tmp_path_factory):
    """A second, shorter recording with the locks set: its futex tracing costs
    server CPU, so it stays out of the accuracy recording above."""
    out = tmp_path_factory.mktemp("demo-locks")
    recorder = Recorder([demo_server.proc.pid], out / "locks.ipr", "--locks")
    try:
        run_load(HOST, demo_server.port, connections=4, total_requests=8, body_factory=_body,
                 path="/v1/completions", timeout=180, request_id=RequestIds())
    finally:
        # At stop the locks set names every code address it saw; in a torch
        # server that means parsing libtorch's symbol tables (tens of seconds
        # on a busy 2-core machine the first time).
        recorder.stop(timeout=180)
    report = subprocess.run(inferprobe_cmd("report", str(out / "locks.ipr"), "--format", "json"),
                            capture_output=True, text=True, check=True)
    return json.loads(report.stdout)


def test_lock_ratios_cover_requests_and_scheduler_cycles(traced_with_locks):
    report = traced_with_locks
    assert "locks" in report["probe_sets"]["active"]
    ratios = [r["mutex_wait_ratio"] for r in report["requests"] if r["status"] == 200]
    assert ratios and all(0.0 <= x <= 1.0 for x in ratios)
    steps = report["lock_summary"]["decode_steps"]
    # every decode step that ended is a scheduler-cycle span
    assert steps["count"] == report["scheduler"]["decode_steps"] or steps["count"] == (
        report["scheduler"]["decode_steps"] - 1)  # the last one may still run at stop
    assert 0.0 <= steps["ratio_p50"] <= steps["ratio_p99"] <= 1.0
