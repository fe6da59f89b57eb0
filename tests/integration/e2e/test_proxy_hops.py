"""Proxy hops, end to end: a client's streamed requests through a proxy to an LLM
backend, the proxy and the backend traced in one recording.

Three proxies under one recorder, each in front of its own backend:
- nginx (C) as a streamed route gets it by default: `proxy_buffering on`, an
  HTTP/1.0 upstream, a connection per request; in front of Go's net/http
  (stream_shapes.go);
- nginx with `proxy_buffering off` and pooled HTTP/1.1 upstream connections,
  in front of FastAPI/uvicorn;
- a Go gateway (net/http's ReverseProxy, flushing every write, pooled
  connections; sse_gateway.go), in front of FastAPI/uvicorn.

Checked against what the programs measured themselves:
- every request a backend logged came from the port (its peer port, its own
  view) of a proxy connection the recording tied to that backend;
- the headline counts each client request once, and the hops section has
  the proxy's and the backend's rows, each with the client's request count;
- the proxy hop's TTFT, per request, is the client's own (send -> first
  token event read) within CLIENT_TOLERANCE_NS;
- no token is lost between the hops: each request's token events at the
  proxy are the backend's;
- the buffering nginx is a proxy.bursts finding, the two that pass the
  stream through are not;
- where a proxy passes the stream through, the time the tracer says each
  first token spent between the backend's write and the proxy's read is
  what the programs' own clocks say it took from the backend (its log,
  before the write) to the client (its read), within CLIENT_TOLERANCE_NS;
  and a proxy is a proxy.held_between_hops finding exactly where those
  times say so (on this host uvicorn's sockets, TCP_NODELAY off, held the
  first token of each reused upstream connection ~37 ms).
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.go import build_go_program
from tests.support.kernel import needs_root
from tests.support.processes import Recorder, report_json_text, stop_process

pytestmark = needs_root

SERVERS = Path(__file__).resolve().parents[2] / "servers"
PAYLOADS = SERVERS / "stream_shapes_payloads.json"
REQUESTS = 8
TOKENS = 30
INTERVAL_MS = 5
# The proxy reads the request and writes the first token; the client wrote the request
# before and reads the token after, on loopback: well under a millisecond each way, and a
# Python client on a busy 2-core host can take a few more to be scheduled.
CLIENT_TOLERANCE_NS = 5_000_000

NGINX_BUFFERED = """
    location / {{ proxy_pass http://127.0.0.1:{backend}; }}
"""
# What nginx's documentation gives for streamed upstreams: no buffering, HTTP/1.1 with
# keep-alive to an upstream block of pooled connections.
NGINX_PASSING = """
    location / {{
        proxy_pass http://pool;
        proxy_buffering off;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
    }}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    process: subprocess.Popen
    pid: int   # the process that serves (nginx: its worker)
    port: int
    log: Path | None = None


def start_printing_port(argv: list[str], log: Path | None = None) -> Proc:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())
    except ValueError:
        stop_process(process)
        raise
    return Proc(process, process.pid, port, log)


def start_nginx(tmp: Path, name: str, backend: int, location: str) -> Proc:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.skip("nginx is not installed (Debian's nginx-light; make setup installs it)")
    home = tmp / name
    home.mkdir()
    port = free_port()
    upstream = "" if "pool" not in location else \
        f"upstream pool {{ server 127.0.0.1:{backend}; keepalive 4; }}"
    (home / "nginx.conf").write_text(f"""
worker_processes 1;
daemon off;
pid {home}/nginx.pid;
error_log {home}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {home}/body;
    proxy_temp_path {home}/proxy;
    {upstream}
    server {{
        listen 127.0.0.1:{port};
        {location.format(backend=backend)}
    }}
}}
""")
    process = subprocess.Popen([nginx, "-c", str(home / "nginx.conf"), "-p", str(home)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        workers = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        children = workers.read_text().split() if workers.exists() else []
        if children:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return Proc(process, int(children[0]), port)
            except OSError:
                pass
        if process.poll() is not None:
            raise RuntimeError(f"nginx exited: {process.stderr.read()}")
        time.sleep(0.05)
    stop_process(process)
    raise RuntimeError("nginx did not start listening within 10 s")


@dataclass
class ClientSaw:
    ttft_ns: int      # send -> the first token event read
    token_events: int
    first_ns: int     # when the first token event was read (CLOCK_MONOTONIC)


def drive(port: int) -> list[ClientSaw]:
    """REQUESTS streamed chat completions, one after another, each on a connection of its own."""
    saw = []
    for k in range(REQUESTS):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps({"model": "m", "tokens": TOKENS, "prompt": f"hop {k}", "interval_ms": INTERVAL_MS})
        sent = time.monotonic_ns()
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        first, events = None, 0
        while line := resp.readline():
            if line.startswith(b"data: {") and b'"delta"' in line:
                first = first or time.monotonic_ns()
                events += 1
        conn.close()
        assert first is not None and events == TOKENS
        saw.append(ClientSaw(first - sent, events, first))
    return saw


CASES = ("nginx-buffered", "nginx-passing", "go-gateway")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("hops")
    started: list[Proc] = []
    try:
        if shutil.which("go") is None:
            pytest.skip("Go is not installed (Debian's golang-go; make setup installs it)")
        pytest.importorskip("uvicorn", reason="FastAPI/uvicorn are not installed (the test extra has them)")
        go_backend = build_go_program(SERVERS / "stream_shapes.go", tmp)
        gateway = build_go_program(SERVERS / "sse_gateway.go", tmp)
        backends = {
            "nginx-buffered": start_printing_port([str(go_backend), str(PAYLOADS), str(tmp / "go.log")],
                                                  tmp / "go.log"),
            "nginx-passing": start_printing_port([sys.executable, str(SERVERS / "stream_shapes_fastapi.py"),
                                                  str(tmp / "fastapi-1.log")], tmp / "fastapi-1.log"),
            "go-gateway": start_printing_port([sys.executable, str(SERVERS / "stream_shapes_fastapi.py"),
                                               str(tmp / "fastapi-2.log")], tmp / "fastapi-2.log"),
        }
        started += backends.values()
        proxies = {
            "nginx-buffered": start_nginx(tmp, "buffered", backends["nginx-buffered"].port, NGINX_BUFFERED),
            "nginx-passing": start_nginx(tmp, "passing", backends["nginx-passing"].port, NGINX_PASSING),
            "go-gateway": start_printing_port([str(gateway), str(backends["go-gateway"].port)]),
        }
        started += proxies.values()
        pids = [p.pid for p in (*backends.values(), *proxies.values())]
        rec = Recorder(pids, tmp / "run.ipr", "--duration", "300")
        try:
            saw = {case: drive(proxies[case].port) for case in CASES}
            time.sleep(0.3)   # the last close() reaches the tracer
        finally:
            rec.stop()
    finally:
        for p in started:
            stop_process(p.process)
    report = json.loads(report_json_text(tmp / "run.ipr"))
    return {"report": report, "saw": saw, "proxies": proxies, "backends": backends}


def requests_of(report: dict, pid: int, role: str = "server") -> list[dict]:
    return sorted((r for r in report["requests"] if r["pid"] == pid and r["role"] == role),
                  key=lambda r: r["t_ingress_ns"])


@pytest.mark.parametrize("case", CASES)
def test_each_backend_request_is_tied_to_the_proxy_port_it_came_from(recorded, case):
    report, proxy, backend = recorded["report"], recorded["proxies"][case], recorded["backends"][case]
    logged = [json.loads(line) for line in backend.log.read_text().splitlines()]
    assert len(logged) == REQUESTS
    conns = {c["conn_id"]: c for c in report["connections"]}
    ties = [t for t in report["proxy_hops"] if t["proxy_pid"] == proxy.pid]
    assert ties and all(t["backend_pid"] == backend.pid for t in ties)
    tied_ports = {conns[t["proxy_conn"]]["local_port"] for t in ties}
    # the backend's own view of where each request came from
    assert {entry["peer_port"] for entry in logged} <= tied_ports
    # and every request the backend served in the recording is on a tied connection
    tied_backend_conns = {t["backend_conn"] for t in ties}
    assert all(r["conn"] in tied_backend_conns for r in requests_of(report, backend.pid))


def test_the_headline_counts_each_client_request_once(recorded):
    report = recorded["report"]
    assert report["summary"]["requests"] == REQUESTS * len(CASES)
    assert report["endpoints"]["POST /v1/chat/completions"]["requests"] == REQUESTS * len(CASES)


@pytest.mark.parametrize("case", CASES)
def test_the_proxy_hop_is_what_the_client_saw_and_no_token_is_lost_between_hops(recorded, case):
    report, proxy, backend = recorded["report"], recorded["proxies"][case], recorded["backends"][case]
    front, behind = requests_of(report, proxy.pid), requests_of(report, backend.pid)
    assert len(front) == len(behind) == REQUESTS
    for seen, at_proxy, at_backend in zip(recorded["saw"][case], front, behind, strict=True):
        ttft = at_proxy["t_first_token_ns"] - at_proxy["t_ingress_ns"]
        assert abs(ttft - seen.ttft_ns) <= CLIENT_TOLERANCE_NS, (case, ttft, seen.ttft_ns)
        at_each = (sum(at_proxy["token_chunk_events"]), sum(at_backend["token_chunk_events"]))
        assert at_each == (seen.token_events, seen.token_events), (case, at_each)


@pytest.mark.parametrize("case", ["nginx-passing", "go-gateway"])
def test_the_time_a_first_token_waited_between_hops_is_what_the_programs_clocks_say(recorded, case):
    report, proxy, backend = recorded["report"], recorded["proxies"][case], recorded["backends"][case]
    conns = {c["conn_id"]: c for c in report["connections"]}
    # the exchanges in time order: each connection's own are in order, connections by their opening
    ties = sorted((t for t in report["proxy_hops"] if t["proxy_pid"] == proxy.pid),
                  key=lambda t: conns[t["proxy_conn"]]["t_open_ns"] or 0)
    held = [h for t in ties for h in t["first_token_held_ns"]]
    logged = [json.loads(line) for line in backend.log.read_text().splitlines()]
    assert len(held) == len(logged) == REQUESTS
    for tracer, entry, seen in zip(held, logged, recorded["saw"][case], strict=True):
        # backend's write -> proxy's read (tracer) against backend's clock -> client's clock
        assert abs(tracer - (seen.first_ns - entry["token_ns"][0])) <= CLIENT_TOLERANCE_NS, (case, tracer)
    late = [h for h in held if h >= 5_000_000]
    expected = len(late) >= 2 and len(late) * 10 >= len(held)
    found = [f for f in report["findings"] if f["kind"] == "proxy.held_between_hops"
             and f["figures"]["proxy_pid"] == proxy.pid]
    assert bool(found) == expected, (case, held, found)
    if found:
        assert found[0]["figures"]["held_calls"] == len(late)


def test_the_buffering_proxy_is_the_finding_and_the_others_are_not(recorded):
    report, proxies = recorded["report"], recorded["proxies"]
    bursts = [f for f in report["findings"] if f["kind"] == "proxy.bursts"]
    assert [f["figures"]["proxy_pid"] for f in bursts] == [proxies["nginx-buffered"].pid], bursts
    (finding,) = bursts
    assert finding["figures"]["backend_pid"] == recorded["backends"]["nginx-buffered"].pid
    # nginx's default buffer pages hold many of the backend's one-event writes
    assert finding["figures"]["proxy_events_per_write"] >= 4 * finding["figures"]["backend_events_per_write"]
    assert "proxy_buffering off" in finding["recommendation"]
