"""The four renderers of the report model (terminal, HTML, Markdown, JSON), on
recordings built in memory by tests/factories.py: no root, no kernel.

Each test builds the model once (analyzers/report_data.build) and checks that
every output shows what the model holds, and the same thing in each.
"""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from rich.console import Console

from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.network import ConnectionNetwork
from inferprobe.analyzers.report_data import ReportData, build
from inferprobe.analyzers.stack_profile import Profile
from inferprobe.analyzers.units import ms
from inferprobe.collector.model.events import GpuCopyKind, GpuFunction
from inferprobe.reports.html import render_html
from inferprobe.reports.json_report import to_json
from inferprobe.reports.markdown import render_markdown
from inferprobe.reports.sections.model import AnalyzerSection, FlameGraph, SourceState
from inferprobe.reports.terminal import render_text

from tests.factories import MS, gpu_call, gpu_launches, recording, sse_exchange

T0 = 1_000_000 * MS
REQUESTS = 12


def _streams() -> list[bytes]:
    """Request i (conn i + 1) has its first token 5 + i ms after the read, then a 30 ms stall."""
    raws = []
    for i in range(REQUESTS):
        first = 5 + i
        raws += sse_exchange(i + 1, T0 + i * 200 * MS, [first, first + 2, first + 4, first + 34, first + 36])
    return raws


@pytest.fixture(scope="module")
def model() -> ReportData:
    return build(recording(_streams()))


def _terminal(data: ReportData, sections: list[AnalyzerSection] | None = None) -> str:
    out = io.StringIO()
    render_text(data, Console(file=out, width=400), sections)  # wide: no sentence is wrapped
    return out.getvalue()


def _table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the rich tables in a terminal report."""
    return [[cell.strip() for cell in line.strip().strip("│").split("│")]
            for line in text.splitlines() if line.strip().startswith("│")]


def test_the_model_behind_the_renderers(model):
    # what the other tests rely on: 12 streams, TTFT 5..16 ms, a verdict with both core findings
    assert model.overall.requests == REQUESTS
    assert [model.decomposition[q].request.conn for q in (50, 90, 99)] == [6, 11, 12]
    assert {f.kind for f in model.findings} == {"ttft.phase", "itl.stalls"}
    assert len(model.per_request) == REQUESTS


def test_terminal_prints_the_summary_decomposition_and_verdict(model):
    text = _terminal(model)
    assert f"requests {REQUESTS}  (complete {REQUESTS}, aborted 0, incomplete 0)" in text
    s = model.overall.ttft_ns
    assert ms(s.p50) == "10.00"
    rows = _table_rows(text)
    assert ["TTFT (ms)", str(REQUESTS), ms(s.p50), ms(s.p90), ms(s.p99), ms(s.max)] in rows
    p50 = model.decomposition[50]
    (split,) = [r for r in rows if r[0] == "p50"]  # "Where TTFT went": the p50 request, by phase
    assert split[:2] == ["p50", ms(p50.request.ttft_ns)]
    ttft = p50.request.ttft_ns
    assert split[2:] == [f"{ms(v)} ({100 * v / ttft:.0f}%)" for v in p50.ttft_phases_ns.values()]
    for i, f in enumerate(model.findings, 1):
        assert f"{i}. {f.headline}" in text
        assert f"-> {f.recommendation}" in text
    assert "probe sets active: sockets" in text


def test_markdown_shows_the_same_numbers_and_the_same_bytes_each_time(model):
    md = render_markdown(model)
    assert md == render_markdown(model)
    s = model.overall.ttft_ns
    assert (f"| time to first token | {s.count} | {ms(s.p50)} | {ms(s.p90)} | {ms(s.p99)} | {ms(s.max)} |"
            in md)
    for i, f in enumerate(model.findings, 1):
        assert f"{i}. {f.headline}" in md
    assert "Inter-token latency cannot be split by phase" in md  # no USDT probes here
    assert "## Recording facts" in md and "factory-host" in md


def test_json_holds_the_model_in_the_documented_shape(model):
    doc = json.loads(json.dumps(to_json(model)))
    assert doc["summary"]["requests"] == REQUESTS
    assert doc["summary"]["ttft_ns"]["p50"] == model.overall.ttft_ns.p50
    p50 = doc["latency_decomposition"]["p50"]
    assert p50["conn"] == 6 and sum(p50["ttft_phases_ns"].values()) == p50["ttft_ns"]
    assert doc["itl_phase_split"] is None  # only the server's probes can split a gap
    assert [f["kind"] for f in doc["findings"]] == [f.kind for f in model.findings]
    for r in doc["requests"]:
        assert sum(r["phases_ns"].values()) == r["e2e_ns"]
        assert r["mutex_wait_ratio"] is None and r["lock_wait"] is None  # no locks set
    assert doc["network"] == {"traced": False, "sample_errors": [], "connections": [], "findings": []}
    assert doc["gpu"] is None and doc["locks"] is None


def test_html_has_every_section_and_the_ranked_findings(model):
    import lxml.html

    page = render_html(model)
    doc = lxml.html.document_fromstring(page)
    for anchor in ("verdict", "decomposition", "distributions", "over-time", "recording"):
        assert doc.get_element_by_id(anchor) is not None, anchor
    items = doc.xpath('//*[@id="verdict"]//ol[@class="findings"]/li')
    assert [li.get("data-kind") for li in items] == [f.kind for f in model.findings]
    assert all(li.text_content().startswith(f"{f.percent} %") for li, f in zip(items, model.findings,
                                                                                strict=True))
    assert "http://" not in page and "https://" not in page  # self-contained


def test_every_output_shows_the_same_request_at_a_tied_percentile():
    # Ten requests with the same TTFT, read in the order conn 10, 9, ..., 1: every output's
    # p50 row is the first one read (conn 10), whatever its connection number.
    raws = []
    for k in range(10):
        raws += sse_exchange(10 - k, T0 + k * 100 * MS, [8, 10])
    data = build(recording(raws))
    assert data.decomposition[50].request.conn == 10
    assert next(b for b in data.breakdown.ttft if b.label == "p50").request.conn == 10
    assert to_json(data)["latency_decomposition"]["p50"]["conn"] == 10
    assert "conn 10" in next(line for line in render_markdown(data).splitlines() if line.startswith("| p50 "))


def test_network_findings_are_drawn_from_the_model_not_recomputed(model):
    finding = Finding(kind="nagle_coalescing", sentence="3 small writes waited for an ACK", source="network",
                      recommendation="set TCP_NODELAY", conn_id=7, figures={"held_until_ack": 3})
    data = dataclasses.replace(model, network=[ConnectionNetwork(conn_id=7, pid=100, fd=9, peer=None,
                                                                 header_bytes=66)],
                               network_findings=[finding])
    text = _terminal(data)
    assert "nagle_coalescing conn 7: 3 small writes waited for an ACK" in text
    assert "  fix: set TCP_NODELAY" in text
    assert to_json(data)["network"]["findings"] == [{
        "kind": "nagle_coalescing", "conn_id": 7, "summary": "3 small writes waited for an ACK",
        "evidence": {"held_until_ack": 3}, "fix": "set TCP_NODELAY"}]


def _gpu_bound_cycles() -> list[bytes]:
    """Ten GPU cycles on the engine thread: 1 ms of launches, then a copy that waits 3 ms."""
    raws = []
    for k in range(10):
        t = T0 + k * 5 * MS
        raws.append(gpu_launches(t, t + MS, 50, tid=101))
        raws.append(gpu_call(GpuFunction.CUDA_MEMCPY, t + MS, t + 4 * MS, tid=101, nbytes=4,
                             copy_kind=GpuCopyKind.DTOH))
    return raws


def test_gpu_findings_reach_every_output_with_one_sentence():
    rec = recording(_streams() + _gpu_bound_cycles(),
                    active={"sockets": "HTTP", "gpu": "libcudart"})
    data = build(rec)
    (finding,) = data.gpu.findings
    assert finding.kind == "sync_bound" and finding.value == pytest.approx(0.75)
    assert f"GPU finding: {finding.sentence}" in _terminal(data)
    assert to_json(data)["gpu"]["findings"] == [{"kind": "sync_bound", "message": finding.sentence,
                                                 "value": finding.value}]
    ranked = next(f for f in data.findings if f.kind == "gpu.sync_bound")
    assert ranked.sentence == finding.sentence and ranked.share == pytest.approx(0.75)
    assert f"> {finding.sentence}" in render_markdown(data)  # a note of the GPU section


def test_flame_graphs_are_drawn_by_the_html_renderer_only(model):
    stacks = {("server (100)", "main", "burn_a"): 30, ("server (100)", "main", "burn_b"): 10}
    section = AnalyzerSection(
        anchor="analyzer-flame-cpu", title="On-CPU flame graph", summary="Where the threads ran.",
        sources=(SourceState("profile", True, "99 Hz"),),
        flame=FlameGraph(Profile("cpu", stacks, "samples", "On-CPU flame graph: server", ""), "run.ipr"))
    data, sections = model, [section]
    import lxml.html

    found = lxml.html.document_fromstring(render_html(data, sections=sections)).get_element_by_id(
        "analyzer-flame-cpu")
    (svg,) = found.xpath(".//*[local-name()='svg']")
    assert {g.get("data-name") for g in svg.iter() if g.get("class") == "f"} >= {"burn_a", "burn_b"}
    assert "`inferprobe flamegraph run.ipr --kind cpu` draws the whole graph" in found.text_content()
    md = render_markdown(data, sections)
    assert "draws this as an interactive flame graph" in md and "<svg" not in md
    assert "<svg" not in _terminal(data, sections) and "On-CPU flame graph" in _terminal(data, sections)
