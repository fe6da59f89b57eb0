"""GPU execution (CUPTI shim) in the outputs: per-request analysis, spans, metrics, JSON and terminal.

One constructed decode loop (tests/unit/analyzers/test_gpu_execution.py's records) goes through
summarize_gpu and request_analysis.per_request, as report_data does, and each output is read back."""

from __future__ import annotations

import io

from rich.console import Console

from inferprobe.analyzers.gpu import summarize_gpu
from inferprobe.analyzers.request_analysis import per_request
from inferprobe.collector.model.timeline import Outcome, Request, ServerRequest
from inferprobe.exporters.metrics import Metrics
from inferprobe.exporters.spans import GPU_EXECUTION_SPAN, request_trace
from inferprobe.reports.json_gpu import gpu_json
from inferprobe.reports.terminal_gpu import render_gpu

from tests.unit.analyzers.test_gpu_execution import (
    MS,
    PID,
    US,
    clocks_over,
    decode_loop,
    kernel_name,
    status,
)

LABELS = {"endpoint": "POST /v1/completions", "model": "", "status_class": "2xx", "target": "server"}


def recorded():
    acts, apis, steps = decode_loop(10 * MS, steps=3, kernels=4, kernel_us=100, gap_us=50)
    server = ServerRequest(pid=PID, req_id=7, tid=PID, t_scheduled_ns=10 * MS, steps=steps)
    r = Request(pid=PID, tid=PID, conn=1, method="POST", path="/v1/completions", t_ingress_ns=9 * MS,
                status=200, outcome=Outcome.COMPLETE, t_response_start_ns=9 * MS + 500 * US,
                t_end_ns=14 * MS, token_ns=[10 * MS + 900 * US, 11 * MS + 900 * US], token_events=[1, 1],
                streaming=True, server=server)
    events = [*acts, *apis, *clocks_over(0, 20 * MS), kernel_name(1, "gemm_kernel"),
              kernel_name(2, "softmax"),
              status("CUPTI is recording kernel, copy and memset activity in pid 100")]
    g = summarize_gpu(events, None, [r], steps, None, "test")
    return r, g, per_request([r], None, g)[0]


def test_the_request_analysis_carries_busy_idle_and_the_busy_intervals():
    _, g, analysis = recorded()
    (x,) = g.execution.requests
    assert analysis.gpu_busy_ns == x.gpu.busy_ns == 3 * 4 * 100 * US
    assert analysis.gpu_idle_ns == x.gpu.idle_ns > 0
    assert [(w.start_ns, w.end_ns) for w in analysis.gpu_execution] == list(x.gpu.busy)


def test_gpu_execution_becomes_child_spans_and_root_attributes():
    r, _, analysis = recorded()
    root = request_trace(r, analysis=analysis)
    spans = [c for c in root.children if c.name == GPU_EXECUTION_SPAN]
    assert [(s.start_ns, s.end_ns) for s in spans] == [(w.start_ns, w.end_ns) for w in analysis.gpu_execution]
    assert all(r.t_ingress_ns <= s.start_ns and s.end_ns <= r.t_end_ns for s in spans)
    assert root.attributes["inferprobe.gpu.busy_s"] == analysis.gpu_busy_ns / 1e9
    assert root.attributes["inferprobe.gpu.idle_s"] == analysis.gpu_idle_ns / 1e9
    assert root.attributes["inferprobe.gpu_execution"] == len(spans)


def test_gpu_busy_and_idle_are_histograms_per_request():
    r, _, analysis = recorded()
    m = Metrics({PID: "server"})
    m.request_started(PID)
    m.request_finished(r, analysis)
    busy = m.registry.get_sample_value("inferprobe_request_gpu_busy_seconds_sum", LABELS)
    assert busy == analysis.gpu_busy_ns / 1e9
    assert m.registry.get_sample_value("inferprobe_request_gpu_idle_seconds_count", LABELS) == 1
    # a request without shim records observes nothing
    m2 = Metrics({PID: "server"})
    m2.request_started(PID)
    m2.request_finished(r)
    assert m2.registry.get_sample_value("inferprobe_request_gpu_busy_seconds_count", LABELS) is None


def test_json_and_terminal_show_the_execution_beside_the_cpu_calls():
    _, g, _ = recorded()
    x = gpu_json(g)["execution"]
    assert x["records"] == 12 and x["joined"] == 12 and x["without_clock"] == 0
    assert [k["name"] for k in x["kernels"]] == ["gemm_kernel", "softmax"]
    assert x["requests"][0]["busy_ns"] == 1_200_000 and x["requests"][0]["attributed_by"] == "decode_steps"
    out = io.StringIO()
    render_gpu(g, Console(file=out, width=200))
    text = out.getvalue()
    assert "CUPTI shim in pid 100: CUPTI is recording" in text
    assert "gemm_kernel" in text and "GPU execution per request" in text
