"""Prometheus metrics from Request timelines and USDT events."""

from __future__ import annotations

import shutil
import socket
import subprocess

import pytest
from prometheus_client import generate_latest

from inferprobe.collector.model.events import EventType, UsdtProbe, UsdtRecord
from inferprobe.collector.model.timeline import Outcome, Request
from inferprobe.exporters.metrics import MAX_MODELS, Metrics

from tests.support.processes import inferprobe_cmd

MS = 1_000_000


def _req(ttft_ms: int, tokens: int, status: int = 200) -> Request:
    t0 = 1_000 * MS
    return Request(pid=10, tid=10, conn=1, method="POST", path="/v1/completions", t_ingress_ns=t0,
                   status=status, outcome=Outcome.COMPLETE, t_response_start_ns=t0 + MS,
                   token_ns=[t0 + (ttft_ms + 3 * i) * MS for i in range(tokens)], token_events=[1] * tokens,
                   t_end_ns=t0 + (ttft_ms + 3 * tokens) * MS, streaming=True)


def _usdt(probe: UsdtProbe, ts_ms: int, *args: int) -> UsdtRecord:
    return UsdtRecord(type=EventType.USDT, pid=10, tid=10, ts_ns=ts_ms * MS, probe=probe, args=args)


def _sample(m: Metrics, name: str, **labels) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_requests_histograms_counters_and_usdt_gauges():
    m = Metrics({10: "server"})
    labels = {"endpoint": "POST /v1/completions", "model": "", "status_class": "2xx", "target": "server"}
    for ttft in (5, 30, 300):
        m.request_started(10)
        m.request_finished(_req(ttft, 4))
    m.request_started(10)
    assert _sample(m, "inferprobe_requests_total", **labels) == 3
    assert _sample(m, "inferprobe_in_flight_requests", target="server") == 1
    assert _sample(m, "gen_ai_server_time_to_first_token_seconds_bucket", le="0.04", **labels) == 2
    assert _sample(m, "gen_ai_server_time_to_first_token_seconds_count", **labels) == 3
    assert _sample(m, "inferprobe_inter_token_latency_seconds_count", **labels) == 9
    assert _sample(m, "gen_ai_server_time_per_output_token_seconds_sum", **labels) == pytest.approx(0.009)
    assert _sample(m, "inferprobe_token_chunks_total", **labels) == 12
    m.observe_usdt(_usdt(UsdtProbe.QUEUE_DEPTH, 1, 7, 3))
    m.observe_usdt(_usdt(UsdtProbe.KV_USAGE, 1, 900, 1000))
    # request 5 gets a token in step 1 and in step 2, which starts 2.5 s after step 1 ended: a stall
    m.observe_usdt(_usdt(UsdtProbe.DECODE_STEP_START, 2, 1, 3, 3))
    m.observe_usdt(_usdt(UsdtProbe.TOKEN_EMIT, 8, 5, 1))
    m.observe_usdt(_usdt(UsdtProbe.DECODE_STEP_END, 10, 1, 3, 3))
    m.observe_usdt(_usdt(UsdtProbe.DECODE_STEP_START, 2510, 2, 3, 3))
    m.observe_usdt(_usdt(UsdtProbe.TOKEN_EMIT, 2515, 5, 2))
    assert _sample(m, "scheduler_queue_length", target="server", source="usdt") == 7
    assert _sample(m, "inferprobe_running_requests", target="server", source="usdt") == 3
    assert _sample(m, "token_occupancy_ratio", target="server", source="usdt") == 0.9
    stall_s = _sample(m, "batch_stall_duration_seconds_sum", target="server", source="usdt")
    assert stall_s == pytest.approx(2.5)
    assert _sample(m, "batch_stall_duration_seconds_count", target="server", source="usdt") == 1
    m.set_totals(lost_events=4, otlp_dropped=2)
    m.set_totals(lost_events=4, otlp_dropped=5)
    assert _sample(m, "inferprobe_lost_events_total") == 4
    assert _sample(m, "inferprobe_otlp_dropped_traces_total") == 5


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed: run sudo make setup")
def test_exposition_passes_promtool_check_metrics():
    m = Metrics({10: "server"})
    m.request_started(10)
    m.request_finished(_req(20, 5))
    m.request_finished(_req(20, 1, status=503))
    m.observe_usdt(_usdt(UsdtProbe.QUEUE_DEPTH, 1, 2, 1))
    m.set_totals(3, 1)
    done = subprocess.run(["promtool", "check", "metrics"], input=generate_latest(m.registry),
                          capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_busy_prometheus_port_is_one_sentence_and_exit_2():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(inferprobe_cmd("record", "-p", "1", "--prometheus", f"127.0.0.1:{port}"),
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0], done.stderr


def test_model_label_is_the_requested_model_capped_and_tpot_uses_the_stated_count():
    m = Metrics({10: "server"})
    req = _req(10, 4)
    req.model, req.output_tokens = "qwen-7b", 7  # 4 chunks, 7 tokens: 9 ms over 6 tokens after the first
    m.request_finished(req)
    labels = {"endpoint": "POST /v1/completions", "model": "qwen-7b", "status_class": "2xx",
              "target": "server"}
    assert _sample(m, "inferprobe_requests_total", **labels) == 1
    assert _sample(m, "inferprobe_output_tokens_total", **labels) == 7
    assert _sample(m, "gen_ai_server_time_per_output_token_seconds_sum", **labels) == pytest.approx(0.009 / 6)
    for i in range(MAX_MODELS + 5):  # any client can name any model: the label set stays bounded
        r = _req(10, 2)
        r.model = f"m{i}"
        m.request_finished(r)
    models = {s.labels["model"] for s in m.registry.collect() for s in s.samples if "model" in s.labels}
    assert len(models - {"other"}) == MAX_MODELS and "other" in models


def test_the_mutex_wait_ratio_histogram_reads_the_model_analysis():
    from inferprobe.analyzers.request_analysis import RequestAnalysis

    m = Metrics({10: "server"})
    labels = {"endpoint": "POST /v1/completions", "model": "", "status_class": "2xx", "target": "server"}
    m.request_finished(_req(10, 2))  # live: no analysis, no observation
    assert _sample(m, "inferprobe_mutex_wait_ratio_count", **labels) is None
    m.request_finished(_req(10, 2), RequestAnalysis(mutex_wait_ratio=0.36))
    m.request_finished(_req(10, 2), RequestAnalysis(mutex_wait_ratio=0.38))
    assert _sample(m, "inferprobe_mutex_wait_ratio_count", **labels) == 2
    assert _sample(m, "inferprobe_mutex_wait_ratio_bucket", le="0.37", **labels) == 1  # the alert edge
