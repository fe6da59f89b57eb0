"""Live and replayed export into real backends, compared with the recording.

Arize Phoenix receives the OTLP traces (gRPC live, HTTP/protobuf replayed);
Debian's Prometheus scrapes `record --prometheus` every second. Delivery is
confirmed by querying the backends, never by the exporter's own result.
Phoenix returns neither resource attributes nor the OTel span kind: those
are checked on the exporter side in test_otlp_spans.py.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from datetime import UTC, datetime

import pytest

from inferprobe.collector.ingest.sessionizer import sessionize
from inferprobe.collector.model.events import ConnRecord, IoRecord, decode
from inferprobe.collector.model.recording import read_recording
from inferprobe.exporters.clock import WallClock
from inferprobe.exporters.metrics import DURATION_BUCKETS, TTFT_BUCKETS
from inferprobe.exporters.spans import TOKEN_EVENT, TOKEN_SUMMARY_EVENT, phases

from tests.servers import sse_client
from tests.support.backends import Phoenix, Prometheus, free_port
from tests.support.kernel import needs_root
from tests.support.processes import Recorder, ServerProcess, inferprobe_cmd

pytestmark = [needs_root, pytest.mark.bpf, pytest.mark.backends]

CONNECTIONS = 4
REQUESTS_PER_CONNECTION = 12
TOKENS = 6
MAX_TOKEN_EVENTS = 4


def _missing(what: str) -> None:
    reason = f"{what} is not installed: run sudo make setup"
    if os.environ.get("CI"):
        pytest.fail(reason)  # CI installs it: missing there is a broken set-up, not a reason to skip
    pytest.skip(reason)


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory):
    from tests.support.backends import PHOENIX_PYTHON

    if not PHOENIX_PYTHON.exists():
        _missing(f"Arize Phoenix ({PHOENIX_PYTHON})")
    server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    yield server
    server.stop()


def _body(conn: int, i: int) -> dict:
    return {"prompt": f"export test {conn}-{i}", "max_tokens": TOKENS, "stream": True,
            "interval_ms": [1.0 + (conn + i) % 4] * TOKENS}


def _recorded_requests(path):
    rec = read_recording(path)
    events = [ev for ev in map(decode, rec.events) if isinstance(ev, ConnRecord | IoRecord)]
    return rec, sessionize(events).requests


def _ns(iso: str) -> int:
    dt = datetime.fromisoformat(iso)
    return (dt - datetime(1970, 1, 1, tzinfo=UTC)) // (datetime.resolution) * 1000


def _roots_by_pid(spans: list[dict], pid: int) -> list[dict]:
    return [s for s in spans if s["parent_id"] is None and s["attributes"].get("inferprobe.pid") == pid]


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            assert value, f"timed out waiting for {what}"
            return value
        time.sleep(0.5)


@pytest.fixture(scope="module")
def live_run(phoenix, tmp_path_factory):
    if not os.path.exists("/usr/bin/prometheus"):
        _missing("Prometheus (Debian package prometheus)")
    tmp = tmp_path_factory.mktemp("live")
    server = ServerProcess(tmp / "server.jsonl")
    metrics_port = free_port()
    recording = tmp / "run.ipr"
    rec = Recorder([server.pid], recording, "--duration", "120", "--otlp", "--protocol", "grpc",
                   "--endpoint", phoenix.grpc_url, "--prometheus", f"127.0.0.1:{metrics_port}",
                   "--max-token-events", str(MAX_TOKEN_EVENTS))
    prom = Prometheus(tmp / "prometheus", f"127.0.0.1:{metrics_port}")
    try:
        results = sse_client.run_load("127.0.0.1", server.port, connections=CONNECTIONS,
                                      requests_per_connection=REQUESTS_PER_CONNECTION, body_factory=_body)
        expected = CONNECTIONS * REQUESTS_PER_CONNECTION
        _wait_for(lambda: prom.scalar("sum(inferprobe_requests_total)") == expected, 20,
                  "Prometheus to scrape every request")
        queries = {
            "requests": prom.scalar("sum(inferprobe_requests_total)"),
            "in_flight": prom.scalar("sum(inferprobe_in_flight_requests)"),
            "lost": prom.scalar("sum(inferprobe_lost_events_total)"),
            "token_chunks": prom.scalar("sum(inferprobe_token_chunks_total)"),
            "itl_count": prom.scalar("sum(inferprobe_inter_token_latency_seconds_count)"),
            "ttft_buckets": {r["metric"]["le"]: float(r["value"][1]) for r in prom.query(
                "sum by (le) (gen_ai_server_time_to_first_token_seconds_bucket)")},
            "duration_buckets": {r["metric"]["le"]: float(r["value"][1]) for r in prom.query(
                "sum by (le) (gen_ai_server_request_duration_seconds_bucket)")},
            "labels": [r["metric"] for r in prom.query("inferprobe_requests_total")],
        }
    finally:
        prom.stop()
        out, err = rec.stop()
        server.stop()
    recording_data, requests = _recorded_requests(recording)
    spans = _wait_for(lambda: (lambda s: s if len(_roots_by_pid(s, server.pid)) >= len(requests) else None)(
        phoenix.spans()), 30, "Phoenix to store every trace")
    return {"recording": recording_data, "requests": requests, "spans": spans, "pid": server.pid,
            "client": results, "prom": queries, "out": out + err, "path": recording}


def test_every_request_is_one_trace_in_phoenix_matching_the_recording(live_run):
    requests, spans, pid = live_run["requests"], live_run["spans"], live_run["pid"]
    completed = [r for r in live_run["client"] if r.status == 200 and not r.aborted]
    assert len(requests) == len(completed) == CONNECTIONS * REQUESTS_PER_CONNECTION
    roots = _roots_by_pid(spans, pid)
    assert len(roots) == len(requests)  # each request exactly once
    assert len({r["context"]["trace_id"] for r in roots}) == len(roots)
    children: dict[str, list[dict]] = {}
    for s in spans:
        if s["parent_id"] is not None:
            children.setdefault(s["parent_id"], []).append(s)
    clock = WallClock.from_recording(live_run["recording"].meta, live_run["recording"].stats)
    by_conn: dict[int, list[dict]] = {}
    for root in roots:
        by_conn.setdefault(root["attributes"]["inferprobe.conn_id"], []).append(root)
    matched = 0
    for req in requests:
        conn_roots = sorted(by_conn[req.conn], key=lambda s: s["start_time"])
        conn_reqs = sorted((r for r in requests if r.conn == req.conn), key=lambda r: r.t_ingress_ns)
        root = conn_roots[conn_reqs.index(req)]
        a = root["attributes"]
        assert root["name"] == "text_completion"
        assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.stream"] is True
        assert a["http.request.method"] == "POST" and a["url.path"] == "/v1/completions"
        assert a["http.response.status_code"] == 200
        assert a["server.address"] == "127.0.0.1" and a["server.port"] > 0
        assert a["inferprobe.token_chunks"] == len(req.token_ns)
        assert abs(a["gen_ai.response.time_to_first_chunk"] - req.ttft_ns / 1e9) < 1e-9
        # Phoenix keeps microseconds: durations agree to 2 us, wall times to 1 ms
        assert abs((_ns(root["end_time"]) - _ns(root["start_time"])) - req.e2e_ns) <= 2_000
        assert abs(_ns(root["start_time"]) - clock.to_wall_ns(req.t_ingress_ns)) <= 1_000_000
        kids = sorted(children[root["context"]["span_id"]], key=lambda s: s["start_time"])
        want = phases(req)
        assert [k["name"] for k in kids] == [p[0] for p in want]
        for kid, (_name, start, end, _attrs) in zip(kids, want, strict=True):
            assert kid["context"]["trace_id"] == root["context"]["trace_id"]
            assert abs((_ns(kid["end_time"]) - _ns(kid["start_time"])) - (end - start)) <= 2_000
        names = [e["name"] for e in root["events"]]
        assert names.count(TOKEN_EVENT) == min(len(req.token_ns), MAX_TOKEN_EVENTS)
        assert names.count(TOKEN_SUMMARY_EVENT) == (1 if len(req.token_ns) > MAX_TOKEN_EVENTS else 0)
        matched += 1
    assert matched == len(requests)
    assert "OTLP: " in live_run["out"] and " 0 dropped" in live_run["out"]


def test_prometheus_histograms_match_the_recording(live_run):
    q, requests = live_run["prom"], live_run["requests"]
    assert q["requests"] == len(requests)
    assert q["in_flight"] == 0
    assert q["lost"] == live_run["recording"].lost_events == 0
    assert q["token_chunks"] == sum(len(r.token_ns) for r in requests)
    assert q["itl_count"] == sum(len(r.itl_ns) for r in requests)
    for le in TTFT_BUCKETS:
        assert q["ttft_buckets"][str(le)] == sum(1 for r in requests if r.ttft_ns / 1e9 <= le), le
    assert q["ttft_buckets"]["+Inf"] == len(requests)
    for le in DURATION_BUCKETS:
        assert q["duration_buckets"][str(le)] == sum(1 for r in requests if r.e2e_ns / 1e9 <= le), le
    for labels in q["labels"]:  # bounded label set, no per-request ids (model "" is no label)
        assert set(labels) - {"__name__", "instance", "job"} == {"endpoint", "status_class", "target"}


def test_replay_over_http_protobuf_delivers_every_request_once(live_run, phoenix):
    before = {s["context"]["span_id"] for s in phoenix.spans()}
    done = subprocess.run(inferprobe_cmd("export", str(live_run["path"]), "--otlp", "--protocol",
                                         "http/protobuf", "--endpoint", phoenix.http_url),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    n = len(live_run["requests"])

    def new_roots():
        fresh = [s for s in phoenix.spans() if s["context"]["span_id"] not in before]
        roots = _roots_by_pid(fresh, live_run["pid"])
        return (roots, fresh) if len(roots) >= n else None

    roots, fresh = _wait_for(new_roots, 30, "the replayed traces")
    assert len(roots) == n
    root_ids = {r["context"]["span_id"] for r in roots}
    kids = [s for s in fresh if s["parent_id"] is not None]
    assert all(k["parent_id"] in root_ids for k in kids)
    assert len(kids) == sum(len(phases(r)) for r in live_run["requests"])
    assert sorted(r["attributes"]["inferprobe.token_chunks"] for r in roots) == sorted(
        len(r.token_ns) for r in live_run["requests"])


def test_dead_backend_costs_no_tracing_and_drops_are_counted(tmp_path):
    server = ServerProcess(tmp_path / "server.jsonl")
    metrics_port = free_port()
    recording = tmp_path / "down.ipr"
    rec = Recorder([server.pid], recording, "--duration", "120", "--otlp", "--protocol", "grpc",
                   "--endpoint", f"http://127.0.0.1:{free_port()}", "--otlp-timeout", "0.5",
                   "--prometheus", f"127.0.0.1:{metrics_port}")
    try:
        results = sse_client.run_load("127.0.0.1", server.port, connections=CONNECTIONS,
                                      requests_per_connection=REQUESTS_PER_CONNECTION, body_factory=_body)

        def dropped_metric():
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
            for line in text.decode().splitlines():
                if line.startswith("inferprobe_otlp_dropped_traces_total "):
                    return float(line.split()[1]) or None
            return None

        dropped_live = _wait_for(dropped_metric, 20, "the drop counter")
    finally:
        out, err = rec.stop()
        server.stop()
    recording_data, requests = _recorded_requests(recording)
    completed = [r for r in results if r.status == 200 and not r.aborted]
    assert len(requests) == len(completed) == CONNECTIONS * REQUESTS_PER_CONNECTION
    assert recording_data.lost_events == 0 and recording_data.complete
    assert all(r.ttft_ns is not None and len(r.token_ns) == TOKENS for r in requests)
    otlp = recording_data.final["export"]["otlp"]
    assert otlp["exported"] == 0
    assert otlp["dropped"] == otlp["submitted"] == len(requests)
    assert 0 < dropped_live <= len(requests)
    assert f"0 traces exported, {len(requests)} dropped" in out
