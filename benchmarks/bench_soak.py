#!/usr/bin/env python3
"""Soak the agent: every protocol churned, servers restarted, the OTLP backend down a while.

    sudo .venv/bin/python benchmarks/bench_soak.py --duration 3600 --out soak.json

`inferprobe agent` runs host-wide, as on a node, for --duration seconds while
four kinds of server serve load on connections opened and closed all along:

- http1: the aiohttp SSE server (tests/servers/sse_server.py), a few
  streamed requests per connection, then a new connection;
- tls: Node's https (OpenSSL linked into node) streaming OpenAI chunks, a new
  TLS connection per request;
- grpc: a grpcio token stream, a new channel (TCP and HTTP/2 connection,
  HPACK tables) per call;
- calls: a server that calls out after each response (client calls), one
  connection per request served.

Each server is killed and started again every --restart-every seconds
(staggered), so pids churn and the agent adopts new processes. The OTLP
backend stops at --outage-at for --outage seconds and comes back on the same
port. The agent's Prometheus endpoint is scraped every 15 s all along.

Every minute it prints and keeps: the agent's RSS, its CPU (user space, and
the kernel's own run time of its BPF programs where kernel.bpf_stats_enabled
is set), requests the clients completed and the agent counted, lost events,
spans received, and the in-kernel map occupancy the agent's newest closed ring
segment states. The summary adds the RSS slope over the last 30 minutes (or
the last half of a shorter run), and exported spans against requests after
the backend came back. CI runs a short slice of it
(tests/integration/deploy/test_soak_bench.py); docs/deploy.md has an hour's.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))   # tests.support and the agent's test helpers

from bench_support import bpf_program_time, bpf_stats_enabled, proc_cpu_s  # noqa: E402

from inferprobe.collector.model.recording import read_recording  # noqa: E402
from inferprobe.collector.model.segment_ring import list_segments  # noqa: E402

from tests.integration.deploy.agent_support import Agent, OtlpSink  # noqa: E402
from tests.support.backends import free_port  # noqa: E402
from tests.support.paths import SERVERS  # noqa: E402

SCRAPE_EVERY_S = 15
SAMPLE_EVERY_S = 10
EXPORT_RESUME_S = 4.0   # the exporter's back-off after the outage, plus one batch delay
SLOPE_WINDOW_S = 1800


# -- the servers ---------------------------------------------------------------


@dataclass
class Server:
    """One kind of server, restarted now and then: its current process and port."""

    kind: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    port: int = 0
    generations: int = 0
    pids: list[tuple[int, float]] = field(default_factory=list)   # (pid, CLOCK_MONOTONIC s started)

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env={**os.environ, **self.env})
        line = self.proc.stdout.readline()
        # "LISTENING host:port", "listening port" or the port alone, by kind
        digits = line.split()[-1].rsplit(":", 1)[-1] if line.strip() else ""
        if not digits.isdigit():
            self.proc.kill()
            raise RuntimeError(f"{self.kind} server did not start: {line!r}")
        self.port = int(digits)
        self.generations += 1
        self.pids.append((self.proc.pid, time.monotonic()))

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _servers(workdir: Path, sink_port: int) -> list[Server]:
    """The four kinds; a kind whose runtime is missing here is left out, with a line saying so."""
    from tests.support.node import node_binary
    from tests.support.tls import self_signed_certificate

    py = sys.executable
    servers = [
        Server("http1", [py, str(SERVERS / "sse_server.py"), "--port", "0", "--log", os.devnull]),
        Server("grpc", [py, str(SERVERS / "grpc_token_server.py"), "--port", "0"]),
        Server("calls", [py, str(SERVERS / "serve_and_export.py"), str(sink_port)]),
    ]
    try:
        node = node_binary()
        env = self_signed_certificate(workdir)
        servers.append(Server("tls", [node, str(SERVERS / "stream_shapes.js"), os.devnull], env=env))
    except BaseException as e:   # pytest's Skipped says what is missing
        print(f"bench_soak: no TLS server: {e}", file=sys.stderr)
    return servers


class CallSink:
    """Where the 'calls' server sends its own outbound POSTs: answers 200, counts them."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        sink = self
        self.calls = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.calls += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the load ------------------------------------------------------------------


def _http1(port: int) -> None:
    """Three streamed requests on one keep-alive connection, then it is closed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for _ in range(3):
            body = json.dumps({"prompt": "a b c", "max_tokens": 4, "stream": True, "interval_ms": 1})
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            if conn.getresponse().read().count(b"data:") < 4:
                raise RuntimeError("short stream")
    finally:
        conn.close()


_TLS = ssl.create_default_context()
_TLS.check_hostname = False
_TLS.verify_mode = ssl.CERT_NONE


def _tls(port: int) -> None:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=_TLS)
    try:
        body = json.dumps({"model": "soak", "prompt": "hi", "tokens": 4, "interval_ms": 1})
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        if b"[DONE]" not in conn.getresponse().read():
            raise RuntimeError("no [DONE]")
    finally:
        conn.close()


def _grpc(port: int) -> None:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = channel.unary_stream("/llm.Generator/Stream")
        ask = json.dumps({"tokens": 4, "first_delay_ms": 2, "gap_ms": 1}).encode()
        if len(list(stream(ask, timeout=10))) != 4:
            raise RuntimeError("short gRPC stream")


def _calls(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/completions", body=b"{}", headers={"Content-Type": "application/json"})
        if b"[DONE]" not in conn.getresponse().read():
            raise RuntimeError("no [DONE]")
    finally:
        conn.close()


LOAD = {"http1": (_http1, 3), "tls": (_tls, 1), "grpc": (_grpc, 1), "calls": (_calls, 1)}


@dataclass
class Load:
    """One client loop against one kind of server, paced at `per_s` calls a second."""

    server: Server
    per_s: float
    stop: threading.Event
    requests: int = 0
    failed: int = 0
    finished_ns: list[int] = field(default_factory=list)

    def run(self) -> None:
        call, requests_per_call = LOAD[self.server.kind]
        while not self.stop.is_set():
            try:
                call(self.server.port)
                self.requests += requests_per_call
                self.finished_ns.append(time.monotonic_ns())
            except Exception:   # a restart in progress: counted, and the loop goes on
                self.failed += 1
            self.stop.wait(1 / self.per_s)


# -- what is read from the agent -----------------------------------------------


def memory_parts(pid: int) -> dict[str, int]:
    """The agent's resident memory by kind of mapping, in KB: the main heap, other anonymous
    memory (malloc's per-thread arenas, Python's own arenas), BPF maps, files."""
    parts = {"heap": 0, "anon": 0, "bpf_maps": 0, "files": 0}
    kind = None
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            first = line.split(maxsplit=6)
            if len(first) >= 5 and "-" in first[0] and ":" not in first[0]:   # a mapping's header line
                name = first[5].strip() if len(first) > 5 else ""
                kind = ("heap" if name == "[heap]" else "bpf_maps" if name.startswith("anon_inode:bpf")
                        else "files" if name.startswith("/") else "anon")
            elif line.startswith("Rss:") and kind is not None:
                parts[kind] += int(line.split()[1])
    return parts


def scrape(port: int) -> dict[str, float]:
    """The agent's counters that the soak reports: sums over their label sets."""
    wanted = {"inferprobe_requests_total": "requests", "inferprobe_lost_events_total": "lost",
              "inferprobe_otlp_dropped_traces_total": "dropped_traces"}
    totals: dict = dict.fromkeys(wanted.values(), 0.0)
    by_endpoint: dict[str, float] = {}
    with urllib_open(f"http://127.0.0.1:{port}/metrics") as resp:
        for line in resp.read().decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                totals[wanted[name]] += float(line.rsplit(" ", 1)[1])
            if name == "inferprobe_requests_total" and 'endpoint="' in line:
                endpoint = line.split('endpoint="', 1)[1].split('"', 1)[0]
                by_endpoint[endpoint] = by_endpoint.get(endpoint, 0) + float(line.rsplit(" ", 1)[1])
    totals["by_endpoint"] = by_endpoint
    return totals


def urllib_open(url: str):
    import urllib.request

    return urllib.request.urlopen(url, timeout=5)


def map_occupancy(ring: Path) -> dict[str, int]:
    """In-kernel map entries as of the end of the newest closed segment (the live one is open)."""
    segments = list_segments(ring)
    for segment in reversed(segments[:-1]):
        doc = read_recording(segment.path)
        if doc.final and "map_entries" in doc.final:
            return dict(doc.final["map_entries"])
        counted = [s["map_entries"] for s in doc.stats if "map_entries" in s]
        if counted:
            return dict(counted[-1])
    return {}


def recorded_by_pid(ring: Path, span_s: int) -> dict[int, int]:
    """Requests per pid in the agent's ring over the last span_s, as `report --last` reads them."""
    from tests.support.processes import inferprobe_cmd

    argv = inferprobe_cmd("report", "--last", f"{span_s}s", "--ring", str(ring), "--format", "json")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"report --last failed: {done.stderr.strip()[-500:]}")
    counts: dict[int, int] = {}
    for request in json.loads(done.stdout)["requests"]:
        counts[request["pid"]] = counts.get(request["pid"], 0) + 1
    return counts


def adoption(servers: list[Server], recorded: dict[int, int], window_start: float) -> dict[str, list]:
    """Per kind, each server process started within the ring's window and 10 s before its end:
    [pid, requests recorded, seconds it served before the end]. One the agent did not adopt has 0."""
    now = time.monotonic()
    return {s.kind: [[pid, recorded.get(pid, 0), round(now - started)] for pid, started in s.pids
                     if window_start <= started <= now - 10] for s in servers}


def server_spans(sink: OtlpSink) -> int:
    """Spans of SERVER kind the backend received: one per request served (client calls are CLIENT)."""
    return sink.spans_by_kind.get(2, 0)


def slope_kb_per_min(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, KB) points, in KB a minute."""
    if len({t for t, _ in points}) < 2:
        return 0.0
    return 60 * statistics.linear_regression([t for t, _ in points], [kb for _, kb in points]).slope


# -- the run -------------------------------------------------------------------


def soak(duration: float, restart_every: float, outage_at: float, outage: float, rate: float,
         segment: str, workdir: Path, keep_s: int = 600, without_otlp: bool = False, log=print) -> dict:
    otlp_port, metrics_port = free_port(), free_port()
    sink, call_sink = OtlpSink(otlp_port), CallSink()
    servers = _servers(workdir, call_sink.port)
    for server in servers:
        server.start()
    export = ["--otlp", "--otlp-endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces", "--otlp-timeout", "2"]
    agent = Agent(workdir / "ring", "--keep", f"{keep_s}s", "--segment", segment,
                  "--prometheus", f"127.0.0.1:{metrics_port}", *([] if without_otlp else export))
    stop = threading.Event()
    loads = [Load(server, rate, stop) for server in servers]
    threads = [threading.Thread(target=load.run, daemon=True) for load in loads]
    minutes: list[dict] = []
    rss: list[tuple[float, int]] = []
    spans_before_outage = 0
    back_ns = back_requests = back_spans = None   # served requests and server spans at the back-up mark
    restarts = 0
    counters: dict[str, float] = {}
    rc = None
    cpu0, bpf0 = proc_cpu_s(agent.pid), bpf_program_time(agent.pid)
    started = time.monotonic()
    next_restart = {s.kind: started + restart_every * (i + 1) / len(servers) for i, s in enumerate(servers)}
    next_scrape = next_sample = started
    next_minute = started + 60
    cpu_mark, bpf_mark, t_mark = cpu0, bpf0, started
    try:
        for thread in threads:
            thread.start()
        while (now := time.monotonic()) - started < duration:
            t = now - started
            for server in servers:
                if now >= next_restart[server.kind]:
                    server.restart()
                    restarts += 1
                    next_restart[server.kind] = now + restart_every
            if back_ns is None and sink is not None and t >= outage_at:
                spans_before_outage = len(sink.trace_ids)
                sink.stop()
                sink = None
                log(f"{t:7.0f}s  OTLP backend down for {outage:.0f} s")
            elif sink is None and t >= outage_at + outage:
                sink = OtlpSink(otlp_port)
                back_ns = time.monotonic_ns()
                log(f"{t:7.0f}s  OTLP backend back")
            if now >= next_scrape:
                with contextlib.suppress(OSError):
                    counters = scrape(metrics_port)
                if back_ns is not None and back_requests is None \
                        and time.monotonic_ns() >= back_ns + EXPORT_RESUME_S * 1e9:
                    back_requests, back_spans = counters.get("requests", 0), server_spans(sink)
                next_scrape = now + SCRAPE_EVERY_S
            if now >= next_sample:
                rss.append((t, agent.rss_kb()))
                next_sample = now + SAMPLE_EVERY_S
            if now >= next_minute:
                cpu, bpf = proc_cpu_s(agent.pid), bpf_program_time(agent.pid)
                span_s = now - t_mark
                row = {
                    "minute": round(t / 60), "rss_mb": round(rss[-1][1] / 1024, 1),
                    "rss_parts_mb": {k: round(v / 1024, 1) for k, v in memory_parts(agent.pid).items()},
                    "agent_cpu_pct": round(100 * (cpu - cpu_mark) / span_s, 2),
                    "bpf_cpu_pct": round(100 * (bpf[0] - bpf_mark[0]) / 1e9 / span_s, 2) if bpf[1] else None,
                    "client_requests": sum(load.requests for load in loads),
                    "client_failures": sum(load.failed for load in loads),
                    "agent_requests": int(counters.get("requests", 0)),
                    "lost": int(counters.get("lost", 0)),
                    "spans": spans_before_outage + (len(sink.trace_ids) if sink else 0),
                    "maps": map_occupancy(workdir / "ring"),
                    "server_generations": {s.kind: s.generations for s in servers},
                }
                minutes.append(row)
                log(json.dumps(row))
                cpu_mark, bpf_mark, t_mark = cpu, bpf, now
                next_minute = now + 60
            time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join(timeout=15)
        time.sleep(3)   # the last requests' spans leave in the next batch
        counters = scrape(metrics_port)
        final_spans = server_spans(sink) if sink is not None else None
        adopted = adoption(servers, recorded_by_pid(workdir / "ring", keep_s), time.monotonic() - keep_s)
        maps_end = map_occupancy(workdir / "ring")
        cpu, bpf = proc_cpu_s(agent.pid), bpf_program_time(agent.pid)
        stopping = time.monotonic()
        rc, out, err = agent.stop()
        stop_s = time.monotonic() - stopping
    finally:
        stop.set()
        if agent.proc.poll() is None and rc is None:   # interrupted: the agent is not left behind
            agent.stop()
        for server in servers:
            server.stop()
        if sink is not None:
            sink.stop()
        call_sink.stop()
    elapsed = time.monotonic() - started
    window = [p for p in rss if p[0] >= max(elapsed - SLOPE_WINDOW_S, elapsed / 2)]
    warm = [kb for t, kb in rss if t >= min(120, elapsed / 4)]
    return {
        "duration_s": round(elapsed),
        "agent_exit": rc, "agent_stderr_tail": err[-2000:], "agent_stop_s": round(stop_s, 2),
        "kinds": [s.kind for s in servers],
        "server_pids": {s.kind: [pid for pid, _ in s.pids] for s in servers},
        "adopted": adopted,
        "restarts": restarts,
        "client_requests": {load.server.kind: load.requests for load in loads},
        "client_failures": {load.server.kind: load.failed for load in loads},
        "calls_received": call_sink.calls,
        "spans_by_kind": {{1: "internal", 2: "server", 3: "client"}.get(k, str(k)): n
                          for k, n in (sink.spans_by_kind.items() if sink is not None else ())},
        "agent_requests": int(counters.get("requests", 0)),
        "agent_requests_by_endpoint": {k: int(v) for k, v in counters.get("by_endpoint", {}).items()},
        "lost_events": int(counters.get("lost", 0)),
        "dropped_traces": int(counters.get("dropped_traces", 0)),
        "maps_end": maps_end,
        "rss_kb": [kb for _, kb in rss],
        "rss_max_mb": round(max(kb for _, kb in rss) / 1024, 1),
        "rss_after_warmup_mb": [round(min(warm) / 1024, 1), round(max(warm) / 1024, 1)] if warm else None,
        "rss_slope_kb_per_min": round(slope_kb_per_min(window), 1),
        "rss_slope_window_s": round(window[-1][0] - window[0][0]) if len(window) > 1 else 0,
        "agent_cpu_pct": round(100 * (cpu - cpu0) / elapsed, 2),
        "bpf_cpu_pct": round(100 * (bpf[0] - bpf0[0]) / 1e9 / elapsed, 2) if bpf[1] else None,
        "server_spans_after_backend_back": None if back_spans is None or final_spans is None
        else final_spans - back_spans,
        "requests_after_backend_back": None if back_requests is None
        else int(counters.get("requests", 0) - back_requests),
        "minutes": minutes,
        "agent_closing_line": next((line.strip() for line in reversed(out.splitlines())
                                    if "agent stopped" in line), None),
        "agent_log_tail": out.splitlines()[-40:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3600)
    ap.add_argument("--restart-every", type=float, default=240, help="seconds between a server's restarts")
    ap.add_argument("--outage-at", type=float, default=None,
                    help="when the OTLP backend stops (default: a third in)")
    ap.add_argument("--outage", type=float, default=600, help="how long it stays down")
    ap.add_argument("--rate", type=float, default=5, help="calls a second per kind of server")
    ap.add_argument("--segment", default="1m", help="the agent's ring segment")
    ap.add_argument("--keep", type=int, default=600, help="seconds of ring the agent keeps")
    ap.add_argument("--out", type=Path, default=None, help="the summary as JSON")
    ap.add_argument("--without-heap-trim", action="store_true",
                    help="INFERPROBE_HEAP_TRIM=0 for the agent: no malloc arena cap or trim")
    ap.add_argument("--without-otlp", action="store_true",
                    help="the agent exports no spans (to tell the exporter's memory from the rest)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_soak: run as root (the agent loads BPF programs).", file=sys.stderr)
        return 2
    # SIGTERM (and SIGINT, which a background job ignores) stop the run cleanly: servers and agent too
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.without_heap_trim:
        os.environ["INFERPROBE_HEAP_TRIM"] = "0"   # the agent inherits it
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp, bpf_stats_enabled():
        outage_at = args.outage_at if args.outage_at is not None else args.duration / 3
        summary = soak(args.duration, args.restart_every, outage_at, min(args.outage, args.duration / 3),
                       args.rate, args.segment, Path(tmp), keep_s=args.keep, without_otlp=args.without_otlp)
    text = json.dumps({k: v for k, v in summary.items() if k not in ("minutes", "rss_kb")}, indent=1)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    return 0 if summary["agent_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
