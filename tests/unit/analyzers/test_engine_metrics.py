"""The engines' documented metric names -> the design card's gauges, and the TTFT finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferprobe.analyzers.engine_metrics import OCCUPANCY, QUEUE, RUNNING, gauge_values, summarize
from inferprobe.analyzers.engine_metrics_ttft import ttft_disagreement
from inferprobe.collector.attach.engine_scrape import parse_exposition
from inferprobe.collector.model.timeline import Outcome, Request

FIXTURES = Path(__file__).parents[2] / "fixtures" / "engine_metrics"
MS = 1_000_000


def _samples(name: str) -> list[list]:
    samples, dropped = parse_exposition((FIXTURES / name).read_text())
    assert dropped == 0
    return samples


@pytest.mark.parametrize("fixture, expected", [
    ("vllm.prom", {QUEUE: ("vllm:num_requests_waiting", 3), RUNNING: ("vllm:num_requests_running", 8),
                   OCCUPANCY: ("vllm:kv_cache_usage_perc", 0.42)}),
    ("sglang.prom", {QUEUE: ("sglang:num_queue_reqs", 12), RUNNING: ("sglang:num_running_reqs", 5),
                     OCCUPANCY: ("sglang:token_usage", 0.28)}),
    ("tgi.prom", {QUEUE: ("tgi_queue_size", 7), RUNNING: ("tgi_batch_current_size", 4)}),
])
def test_each_engines_names_map_onto_the_card_gauges(fixture, expected):
    assert gauge_values(_samples(fixture)) == expected


def test_series_of_several_models_are_summed_and_occupancy_is_the_highest():
    samples = [["vllm:num_requests_waiting", {"model_name": "a"}, 2.0],
               ["vllm:num_requests_waiting", {"model_name": "b"}, 5.0],
               ["vllm:kv_cache_usage_perc", {"model_name": "a"}, 0.2],
               ["vllm:kv_cache_usage_perc", {"model_name": "b"}, 0.7]]
    assert gauge_values(samples) == {QUEUE: ("vllm:num_requests_waiting", 7.0),
                                     OCCUPANCY: ("vllm:kv_cache_usage_perc", 0.7)}


def _scrape(t_ms: int, samples: list[list]) -> dict:
    return {"t_ns": t_ms * MS, "url": "http://127.0.0.1:8000/metrics", "samples": samples,
            "local_ports": [40000]}


def _with_ttft_count(samples: list[list], factor: float) -> list[list]:
    """The same histogram with every count scaled (an earlier scrape)."""
    return [[n, lab, v * factor if n.endswith(("_bucket", "_count", "_sum")) else v] for n, lab, v in samples]


def _requests(ttft_ms: float, n: int, t0_ms: int = 100) -> list[Request]:
    out = []
    for i in range(n):
        t = (t0_ms + i * 10) * MS
        out.append(Request(pid=1, tid=1, conn=i, method="POST", path="/v1/completions", t_ingress_ns=t,
                           status=200, outcome=Outcome.COMPLETE, token_ns=[t + int(ttft_ms * MS)],
                           token_events=[1], t_end_ns=t + int(ttft_ms * MS) + MS, streaming=True))
    return out


def test_summary_series_and_the_ttft_delta_between_first_and_last_scrape():
    last = _samples("vllm.prom")
    first = _with_ttft_count(last, 0.5)
    s = summarize([_scrape(0, first), _scrape(1000, last)])
    assert s is not None and s.engine == "vllm" and s.scrapes == 2
    assert s.peak(QUEUE) == 3 and s.series[QUEUE].metric == "vllm:num_requests_waiting"
    assert s.ttft is not None and s.ttft.count == 10  # 20 at the end - 10 at the start
    lo, hi = s.ttft.quantile_bounds(0.5)
    assert (lo, hi) == (0.01, 0.02)  # cumulative halves: 1, 5, 9, 10 -> the median's bucket
    assert s.scraper_ports == {40000}
    assert s.path == "/metrics"


def test_a_wire_ttft_outside_the_engines_bucket_is_a_finding_and_inside_is_not():
    last = _samples("vllm.prom")
    s = summarize([_scrape(0, _with_ttft_count(last, 0.5)), _scrape(2000, last)])
    assert s is not None
    far = ttft_disagreement(s, _requests(ttft_ms=85, n=10))
    assert far is not None and far.kind == "engine_metrics.ttft_disagrees"
    assert "below" in far.sentence and far.share is not None and 0.7 < far.share < 1.0
    assert ttft_disagreement(s, _requests(ttft_ms=15, n=10)) is None
    # requests outside the scraped window are not compared
    assert ttft_disagreement(s, _requests(ttft_ms=85, n=10, t0_ms=5000)) is None


def test_no_scrape_means_no_summary():
    assert summarize([]) is None


def test_scrapes_round_trip_through_a_recording_into_every_output(tmp_path):
    import io

    from rich.console import Console

    from inferprobe.analyzers import report_data
    from inferprobe.collector.model.recording import RecordingWriter, read_recording
    from inferprobe.reports.json_report import to_json
    from inferprobe.reports.terminal import render_text

    last = _samples("sglang.prom")
    w = RecordingWriter(tmp_path / "r.ipr", {"probe_sets": {"active": {"sockets": ""}, "inactive": {}}})
    w.add_engine_scrape(_scrape(0, _with_ttft_count(last, 0.0)))
    w.add_engine_scrape(_scrape(250, last))
    w.close({"duration_s": 1.0, "engine_metrics": {"scrapes": 2, "series_dropped": 3}})
    rec = read_recording(tmp_path / "r.ipr")
    assert len(rec.engine_scrapes) == 2
    data = report_data.build(rec)
    assert data.engine_metrics is not None and data.engine_metrics.engine == "sglang"
    out = to_json(data)["engine_metrics"]
    assert out["gauges"]["scheduler_queue_length"]["metric"] == "sglang:num_queue_reqs"
    assert out["gauges"]["scheduler_queue_length"]["max"] == 12
    assert out["ttft"]["count"] == 4
    from inferprobe.reports.sections.registry import sections_of

    section = next(s for s in sections_of(data) if s.anchor == "analyzer-engine-metrics")
    assert any("3 series past the per-scrape cap" in n for n in section.notes)
    buf = io.StringIO()
    render_text(data, Console(file=buf, width=150))
    text = buf.getvalue()
    assert "sglang:num_queue_reqs" in text and "Engine metrics" in text
    from inferprobe.reports.html import render_html
    from inferprobe.reports.markdown import render_markdown

    for page in (render_html(data), render_markdown(data)):
        assert "sglang:num_queue_reqs" in page and "Engine metrics" in page
