"""The HTML and Markdown reports of a real recording of the test SSE server.

One recording (module scope) of streaming load with known cadences; the
reports are rendered by the real CLI in subprocesses.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading

import pytest

from tests.servers import sse_client
from tests.support.kernel import needs_root
from tests.support.processes import Recorder, ServerProcess, inferprobe_cmd

pytestmark = [needs_root, pytest.mark.bpf]

SECTIONS = ("verdict", "decomposition", "distributions", "over-time", "analyzer-sockets",
            "analyzer-usdt", "recording")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def _body(conn: int, i: int) -> dict:
    # a slow first token on a third of the requests, and bursty streams: a
    # TTFT tail and inter-token stalls for the verdict to find
    cadence = [18.0, 2.0, 2.0, 2.0] if (conn + i) % 3 == 0 else [2.0, 2.0, 12.0, 2.0, 2.0]
    return {"prompt": "report test", "max_tokens": len(cadence), "stream": True, "interval_ms": cadence}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    server = ServerProcess(tmp / "server_log.jsonl")
    try:
        recording = tmp / "run.ipr"
        rec = Recorder([server.pid], recording, "--duration", "60")
        load = threading.Thread(target=sse_client.run_load, args=("127.0.0.1", server.port),
                                kwargs={"connections": 8, "requests_per_connection": 12,
                                        "body_factory": _body})
        load.start()
        load.join()
        rec.stop()
    finally:
        server.stop()
    html_path = tmp / "report.html"
    subprocess.run(inferprobe_cmd("report", str(recording), "-o", str(html_path)), check=True)
    md = [subprocess.run(inferprobe_cmd("report", str(recording), "--format", "md"), check=True,
                         capture_output=True, text=True).stdout for _ in range(2)]
    return {"tmp": tmp, "recording": recording, "html_path": html_path, "html": html_path.read_text(),
            "markdown": md}


def _tree(text: str):
    import lxml.html

    return lxml.html.document_fromstring(text)


def test_html_parses_with_every_section_holding_data(reports):
    from html.parser import HTMLParser

    HTMLParser().feed(reports["html"])  # the standard library's parser accepts it too
    doc = _tree(reports["html"])
    for anchor in SECTIONS:
        found = doc.get_element_by_id(anchor)
        assert found is not None, f"section {anchor} missing"
        assert found.xpath(".//table//td|.//svg|.//li"), f"section {anchor} holds no data"
    # the charts are there: stacked TTFT bars, waterfall, 3 histograms, time series
    assert len(doc.xpath("//figure/svg")) >= 6
    # this server has no USDT probes: ITL is not split, and the report says why
    assert "cannot be split by phase from the socket alone" in reports["html"]
    assert "Inter-token latency cannot be split by phase" in reports["markdown"][0]
    # the analyzer sections say which probe sources were active and which were off
    assert doc.xpath('//*[@id="analyzer-sockets"]//ul[@class="sources"]/li[@class="on"]')
    assert doc.xpath('//*[@id="analyzer-usdt"]//ul[@class="sources"]/li[@class="off"]')
    facts = doc.get_element_by_id("recording").text_content()
    for word in ("host", "kernel", "libbpf version", "target processes", "duration", "lost events",
                 "probe sets active", "command line", "inferprobe version"):
        assert word in facts


def test_html_refers_to_nothing_outside_the_file(reports):
    text = reports["html"]
    assert not re.search(r"https?://", text)
    doc = _tree(text)
    for el in doc.iter():
        for name, value in el.attrib.items():
            if name.endswith("href") or name in ("src", "srcset", "action", "data", "poster"):
                assert value.startswith("#"), f"<{el.tag} {name}={value!r}> leaves the file"
    assert not re.search(r"url\(\s*['\"]?(?!#)", text), "CSS url() to a resource"
    assert not re.search(r"""(src|href)\s*=\s*["']//""", text)
    assert "<script" not in text and "@import" not in text and "<link" not in text


def test_no_flame_graph_sections_without_stack_captures(reports):
    # recorded without --profile / --offcpu (tests/integration/reports/test_flame_sections.py has them)
    assert "analyzer-flame-" not in reports["html"]
    assert "flame graph" not in reports["markdown"][0]


def test_every_finding_has_evidence_and_matches_the_analyzer(reports):
    from inferprobe.analyzers.cadence import percentile
    from inferprobe.analyzers.report_data import build
    from inferprobe.analyzers.units import ms_text as ms
    from inferprobe.collector.model.recording import read_recording

    data = build(read_recording(reports["recording"]))
    doc = _tree(reports["html"])
    items = doc.xpath('//*[@id="verdict"]//ol[@class="findings"]/li')
    assert len(items) == len(data.findings) >= 1
    shares = [float(li.get("data-share")) for li in items]
    assert shares == sorted(shares, reverse=True)  # ranked by share explained
    for li, finding in zip(items, data.findings, strict=True):
        assert li.get("data-kind") == finding.kind
        assert abs(float(li.get("data-share")) - finding.share) < 1e-6
        assert li.text_content().startswith(f"{finding.percent} %")
        assert finding.sentence in li.text_content()
        assert doc.get_element_by_id(finding.evidence) is not None

    # the TTFT finding's numbers, recomputed from the request timelines
    ttft = next(f for f in data.findings if f.kind == "ttft.phase")
    p99_ttft = percentile([r.ttft_ns for r in data.requests if r.ttft_ns is not None], 99)
    assert p99_ttft == data.overall.ttft_ns.p99
    p99 = next(b for b in data.breakdown.ttft if b.label == "p99")
    assert p99.ttft_ns == p99_ttft
    assert sum(ns for _, ns in p99.phases) == p99_ttft
    phase, phase_ns = p99.dominant()
    assert ttft.share == pytest.approx(phase_ns / p99_ttft)
    assert f"{ms(phase_ns)} of {ms(p99_ttft)}" in ttft.sentence
    # and the same sentence is in the Markdown
    assert ttft.sentence in reports["markdown"][0]


def test_markdown_is_identical_across_runs(reports):
    first, second = reports["markdown"]
    assert first == second
    assert "## Verdict" in first and "## Recording facts" in first


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium is not installed (make setup)")
def test_chromium_renders_a_page_that_is_not_blank(reports):
    from matplotlib.image import imread

    tmp = reports["tmp"]
    shot = tmp / "shot.png"
    subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'chromium-profile'}",
                    "--window-size=1000,1400", f"--screenshot={shot}",
                    reports["html_path"].as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = imread(shot)[:, :, :3]
    not_white = (pixels < 0.9).any(axis=2).mean()
    colours = len({tuple(p) for p in (pixels[::8, ::8].reshape(-1, 3) * 255).astype(int).tolist()})
    assert not_white > 0.02, f"only {not_white:.1%} of the page is drawn"
    assert colours > 20, f"only {colours} colours: the charts did not render"
