"""The engine-metrics scraper against a real HTTP endpoint on loopback: parsing, caps, discovery."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferprobe.collector.attach.engine_scrape import Scraper, discover, parse_exposition, parse_url, probe

FIXTURE = (Path(__file__).parents[3] / "fixtures" / "engine_metrics" / "vllm.prom").read_text()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the scraper expects
    body = FIXTURE
    hits: list[int] = []

    def do_GET(self):  # noqa: N802 - the stdlib's name
        _Handler.hits.append(self.client_address[1])
        if self.path != "/metrics":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = _Handler.body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args):
        pass


@pytest.fixture
def endpoint() -> Iterator[int]:
    _Handler.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_scrapes_on_one_keep_alive_connection_at_the_interval(endpoint):
    scraper = Scraper(f"http://127.0.0.1:{endpoint}/metrics", interval_s=0.05)
    t0 = time.monotonic_ns()
    scraper.start()
    time.sleep(0.5)
    scrapes = scraper.stop()
    t1 = time.monotonic_ns()
    assert 5 <= len(scrapes) <= 12, len(scrapes)
    assert all(t0 <= s["t_ns"] <= t1 for s in scrapes)
    names = {name for name, _labels, _v in scrapes[0]["samples"]}
    assert "vllm:num_requests_waiting" in names and "vllm:time_to_first_token_seconds_bucket" in names
    # one connection: every request came from the one local port the scraper recorded
    assert set(_Handler.hits) == set(scrapes[-1]["local_ports"]) and len(set(_Handler.hits)) == 1


def test_series_and_sample_caps_are_counted(endpoint):
    scraper = Scraper(f"http://127.0.0.1:{endpoint}/metrics", max_series=5, max_samples=12)
    first = scraper.scrape_once()
    assert first is not None and len(first["samples"]) == 5
    assert scraper.stats.series_dropped == len(parse_exposition(FIXTURE)[0]) - 5
    assert scraper.scrape_once() is not None  # 10 samples kept
    assert scraper.scrape_once() is None  # 15 would pass the cap of 12
    assert scraper.stats.scrapes_dropped == 1 and scraper.stats.samples == 10


def test_a_failing_endpoint_is_counted_with_its_reason(endpoint):
    scraper = Scraper(f"http://127.0.0.1:{endpoint}/nothing-here")
    assert scraper.scrape_once() is None
    assert scraper.stats.failures == 1 and "HTTP 404" in (scraper.stats.last_error or "")


def test_text_that_is_not_prometheus_is_refused():
    with pytest.raises(ValueError):
        parse_exposition("<html>hello</html>\n")


def test_discovery_finds_metrics_on_a_listening_port(endpoint):
    assert probe(f"http://127.0.0.1:{endpoint}/metrics")
    assert discover(["unix /tmp/x.sock", f"tcp 0.0.0.0:{endpoint}"]) == f"http://127.0.0.1:{endpoint}/metrics"
    assert discover(["tcp 127.0.0.1:1"]) is None


@pytest.mark.parametrize("bad", ["ftp://host/metrics", "http://", "http://host:99999/metrics"])
def test_bad_urls_are_one_sentence(bad):
    with pytest.raises(ValueError):
        parse_url(bad)
