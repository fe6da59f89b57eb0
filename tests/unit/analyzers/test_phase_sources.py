"""The report says where each request's phases and the gauges came from."""

from __future__ import annotations

from pathlib import Path

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.engine_metrics_ttft import summary_of
from inferprobe.collector.ingest.llama_view import build_llama_view
from inferprobe.collector.model.events import EventType, LlamaRunRecord, LlamaStepPhase, LlamaStepRecord
from inferprobe.collector.model.recording import Recording
from inferprobe.collector.model.timeline import Outcome, Request
from inferprobe.reports.sections.phase_sources import build

MS = 1_000_000


def _req(conn: int, t_ms: int) -> Request:
    return Request(pid=7, tid=1, conn=conn, method="POST", path="/completion", t_ingress_ns=t_ms * MS,
                   status=200, outcome=Outcome.COMPLETE, t_end_ns=(t_ms + 500) * MS)


def test_engine_uprobe_requests_and_socket_only_ones_are_counted_apart():
    steps = [LlamaStepRecord(EventType.LLAMA_STEP, 7, 8, 100 * MS, LlamaStepPhase.ENTER, 5,
                             (LlamaRunRecord(0, 0, 5, True),), False, 0, 1),
             LlamaStepRecord(EventType.LLAMA_STEP, 7, 8, 110 * MS, LlamaStepPhase.RETURN, 0, (), False, 0, 0)]
    tied, untied = _req(1, 50), _req(2, 700)
    build_llama_view(steps, [tied, untied])
    section = build(AnalysisInput(recording=Recording(path=Path("r.ipr"), meta={}), requests=[tied, untied],
                                  events=steps))
    assert section is not None
    by_source = {row[0]: row[1] for row in section.tables[0].rows}
    assert by_source == {"engine_uprobes": "1", "sockets only": "1"}
    gauges = dict(section.tables[1].rows)
    assert gauges["batch_stall_duration_seconds"] == "engine_uprobes"
    assert gauges["token_occupancy_ratio"] == "none"  # llama.cpp's steps do not say it


def test_occupancy_comes_from_an_engine_that_publishes_its_kv_use():
    samples = [["vllm:kv_cache_usage_perc", {"engine": "0"}, 0.42], ["vllm:num_requests_waiting", {}, 1.0]]
    scrapes = [{"t_ns": t, "url": "http://h:8000/metrics", "samples": samples} for t in (1, 2)]
    recording = Recording(path=Path("r.ipr"), meta={}, engine_scrapes=scrapes)
    section = build(AnalysisInput(recording=recording, requests=[_req(1, 50)], events=[],
                                  engine_metrics=summary_of(recording)))   # as report_data.build hands it
    assert section is not None
    gauges = dict(section.tables[1].rows)
    assert gauges["token_occupancy_ratio"] == "engine_metrics"
    assert gauges["scheduler_queue_length, running requests"] == "engine_metrics"


def test_the_verdict_names_the_queue_phase_as_the_engine_uprobes_measure_it():
    from inferprobe.analyzers.breakdown import break_down
    from inferprobe.analyzers.ttft_percentiles import requests_at_ttft_percentiles
    from inferprobe.analyzers.verdict import ttft_phase_finding

    steps = [LlamaStepRecord(EventType.LLAMA_STEP, 7, 8, 400 * MS, LlamaStepPhase.ENTER, 5,
                             (LlamaRunRecord(0, 0, 5, True),), False, 0, 1),
             LlamaStepRecord(EventType.LLAMA_STEP, 7, 8, 410 * MS, LlamaStepPhase.RETURN, 0, (), False, 0, 0)]
    req = _req(1, 50)
    req.streaming, req.t_response_start_ns, req.token_ns, req.token_events = True, 60 * MS, [420 * MS], [1]
    build_llama_view(steps, [req])
    decomp = break_down([req], requests_at_ttft_percentiles([req]))
    finding = ttft_phase_finding(decomp, None, {"llama": "", "sockets": ""})
    assert finding is not None and "queue phase" in finding.sentence
    assert "to its sequence's first llama.cpp engine step" in finding.sentence
