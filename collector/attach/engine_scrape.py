"""Scrapes an engine's own Prometheus endpoint while recording.

vLLM, SGLang, llama.cpp (`--metrics`) and TGI publish their scheduler's
state on /metrics: queue length, running requests, KV-cache use, TTFT
histograms. `record` scrapes that endpoint every SCRAPE_INTERVAL_S on a
thread of its own (a slow endpoint never stalls the ring buffer) and stores
every scrape in the recording as it was parsed: which names mean what is
decided when reading (analyzers/engine_metrics.py), so a better mapping
applies to old recordings too.

Bounded: at most MAX_SERIES series kept per scrape and MAX_SAMPLES samples
per recording; what is dropped past either cap is counted in stats(), never
silently lost. The text is parsed by prometheus_client's own parser.

The scrapes are HTTP requests to the traced server: they go over one
keep-alive connection whose local port is written in every scrape record, so
the report can leave that connection's requests out of the server's traffic.
"""

from __future__ import annotations

import http.client
import queue
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from inferprobe.collector.processes.proc_maps import maps_file_named

SCRAPE_INTERVAL_S = 0.25
SCRAPE_TIMEOUT_S = 2.0
MAX_SERIES = 2000  # per scrape: an engine with thousands of label sets keeps the first ones
MAX_SAMPLES = 2_000_000  # per recording: about 40 min of a 200-series endpoint every 250 ms
MAX_BODY_BYTES = 8 << 20


class ScrapeError(Exception):
    """One scrape failed; the sentence says why."""


@dataclass(frozen=True)
class Target:
    url: str
    host: str
    port: int
    path: str
    https: bool


def parse_url(url: str) -> Target:
    """The endpoint to scrape; ValueError with one sentence for a bad URL."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"{url!r} has an invalid port") from None
    path = parts.path or "/metrics"
    if parts.query:
        path += "?" + parts.query
    return Target(urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", "")),
                  parts.hostname, port, path, parts.scheme == "https")


def parse_exposition(text: str, max_series: int = MAX_SERIES) -> tuple[list[list], int]:
    """[[name, labels, value], ...] of every sample, and how many series past
    max_series were dropped. Raises ValueError for text that is not Prometheus'."""
    # Imported here: prometheus_client's package import costs the recorder 9 MB
    # resident, and only a recording of an engine with /metrics parses any.
    from prometheus_client.parser import text_string_to_metric_families

    samples: list[list] = []
    dropped = 0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if len(samples) >= max_series:
                dropped += 1
                continue
            samples.append([s.name, dict(s.labels), float(s.value)])
    return samples, dropped


class Connection:
    """One keep-alive HTTP connection to the endpoint, reopened after an error."""

    def __init__(self, target: Target, timeout_s: float = SCRAPE_TIMEOUT_S):
        self.target = target
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self.local_ports: set[int] = set()  # every port we scraped from

    def get(self) -> str:
        t = self.target
        try:
            if self._conn is None:
                cls = http.client.HTTPSConnection if t.https else http.client.HTTPConnection
                self._conn = cls(t.host, t.port, timeout=self.timeout_s)
                self._conn.connect()
                if self._conn.sock is not None:
                    self.local_ports.add(self._conn.sock.getsockname()[1])
            self._conn.request("GET", t.path, headers={"Accept": "text/plain"})
            resp = self._conn.getresponse()
            body = resp.read(MAX_BODY_BYTES + 1)
        except (OSError, http.client.HTTPException) as err:
            self.close()
            raise ScrapeError(f"{t.url}: {err}") from None
        if resp.status != 200:
            raise ScrapeError(f"{t.url} answered HTTP {resp.status}")
        if len(body) > MAX_BODY_BYTES:
            self.close()
            raise ScrapeError(f"{t.url} sent more than {MAX_BODY_BYTES >> 20} MiB")
        return body.decode("utf-8", "replace")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def probe(url: str, timeout_s: float = 0.5) -> bool:
    """True when url answers with Prometheus text holding at least one sample."""
    conn = Connection(parse_url(url), timeout_s)
    try:
        samples, _ = parse_exposition(conn.get())
        return bool(samples)
    except (ScrapeError, ValueError):
        return False
    finally:
        conn.close()


# The engines whose /metrics the recorder looks for by itself, by the words their command
# lines hold (vllm serve, python -m sglang.launch_server, llama-server, text-generation-launcher
# and -router, ollama): any other server is not sent a GET /metrics it did not expect.
ENGINE_COMMAND = re.compile(r"vllm|sglang|llama-server|llama_cpp|text-generation|ollama", re.IGNORECASE)


def looks_like_engine(pid: int) -> bool:
    """pid runs a known inference engine: its command line names one, or it maps libllama."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return bool(ENGINE_COMMAND.search(cmdline)) or maps_file_named(pid, "libllama")


DISCOVERY_TIMEOUT_S = 2.0  # an engine busy decoding can take a while to answer its first /metrics


def discover(listening: list[str], timeout_s: float = DISCOVERY_TIMEOUT_S) -> str | None:
    """The first of the target's listening TCP sockets ("tcp 0.0.0.0:8080",
    from collector/processes/targets.listening_sockets) that serves /metrics itself."""
    for sock in listening:
        kind, _, address = sock.partition(" ")
        if not kind.startswith("tcp") or ":" not in address:
            continue
        host, _, port = address.rpartition(":")
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        url = f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"
        if probe(url, timeout_s):
            return url
    return None


@dataclass
class ScrapeStats:
    scrapes: int = 0
    failures: int = 0
    series_dropped: int = 0  # past MAX_SERIES in one scrape
    scrapes_dropped: int = 0  # past MAX_SAMPLES for the recording
    samples: int = 0
    last_error: str | None = None
    local_ports: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Scraper:
    """Scrapes on its own thread; the record loop takes the results with take()."""

    def __init__(self, url: str, interval_s: float = SCRAPE_INTERVAL_S, max_samples: int = MAX_SAMPLES,
                 max_series: int = MAX_SERIES):
        self.target = parse_url(url)
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.max_series = max_series
        self.stats = ScrapeStats()
        self._conn = Connection(self.target)
        self._out: queue.SimpleQueue[dict] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferprobe-engine-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.scrape_once()
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def scrape_once(self) -> dict | None:
        """One scrape, queued as a record; None when it failed or was over the cap."""
        st = self.stats
        before = time.monotonic_ns()
        try:
            text = self._conn.get()
            samples, dropped = parse_exposition(text, self.max_series)
        except (ScrapeError, ValueError) as err:
            st.failures += 1
            st.last_error = str(err)
            return None
        after = time.monotonic_ns()
        st.scrapes += 1
        st.series_dropped += dropped
        st.local_ports = sorted(self._conn.local_ports)
        if st.samples + len(samples) > self.max_samples:
            st.scrapes_dropped += 1
            return None
        st.samples += len(samples)
        # The engine read its state somewhere between send and answer: the midpoint,
        # on CLOCK_MONOTONIC like the kernel's event times.
        record = {"t_ns": (before + after) // 2, "url": self.target.url, "samples": samples,
                  "local_ports": st.local_ports}
        self._out.put(record)
        return record

    def take(self) -> list[dict]:
        out = []
        while True:
            try:
                out.append(self._out.get_nowait())
            except queue.Empty:
                return out

    def stop(self) -> list[dict]:
        """Stops the thread; returns the scrapes not yet taken."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(SCRAPE_TIMEOUT_S + 1)
        self._conn.close()
        return self.take()
