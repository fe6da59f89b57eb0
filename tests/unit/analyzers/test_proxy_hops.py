"""Tying a traced proxy's hop to its traced backend, and the proxy's burst finding.

Built from Connection and Request values as the sessionizer makes them; the
kernel side (the client connection's own port) is tested end to end with
nginx and a Go gateway in tests/integration/e2e/test_proxy_hops.py."""

from __future__ import annotations

from inferprobe.analyzers import proxy_hops
from inferprobe.analyzers.report_data import headline_of
from inferprobe.collector.model.events import ConnRole, EventType
from inferprobe.collector.model.timeline import Connection, Outcome, Request

from tests.factories import _conn_event, decoded

MS = 1_000_000
PROXY, BACKEND = 200, 300


def server_conn(conn_id: int, pid: int, peer_port: int, t_open: int,
                t_close: int | None = None) -> Connection:
    return Connection(conn_id=conn_id, pid=pid, fd=5, family="ipv4", peer="127.0.0.1", peer_port=peer_port,
                      t_open_ns=t_open, t_close_ns=t_close)


def client_conn(conn_id: int, local_port: int | None, t_open: int, t_close: int | None = None) -> Connection:
    return Connection(conn_id=conn_id, pid=PROXY, fd=6, family="ipv4", peer="127.0.0.1", peer_port=8000,
                      t_open_ns=t_open, t_close_ns=t_close, role="client", local_port=local_port)


def streamed(pid: int, conn: int, t0: int, writes: list[tuple[float, int]], role: str = "server") -> Request:
    """(ms after t0, token events) per token-carrying write."""
    return Request(pid=pid, tid=pid, conn=conn, method="POST", path="/v1/chat/completions", t_ingress_ns=t0,
                   status=200, outcome=Outcome.COMPLETE, t_response_start_ns=t0 + MS,
                   token_ns=[t0 + int(ms * MS) for ms, _ in writes], token_events=[n for _, n in writes],
                   t_end_ns=t0 + int(writes[-1][0] * MS), streaming=True, role=role)


STEADY = [(5.0 + 5 * i, 1) for i in range(30)]   # the backend: a token every 5 ms
BURSTS = [(150.0, 28), (160.0, 2)]               # a buffering proxy: a page's worth, then the rest


def proxied(n: int, proxy_writes: list[tuple[float, int]]) -> tuple[list[Request], list[Connection]]:
    """n client requests through the proxy: its front connection, its upstream connection (own
    port 41000 + i) and the backend's end of it (peer port the same)."""
    requests, conns = [], []
    for i in range(n):
        t0 = i * 1000 * MS
        front, up, back = 10 * i + 1, 10 * i + 2, 10 * i + 3
        conns += [server_conn(front, PROXY, 50000 + i, t0 - MS), client_conn(up, 41000 + i, t0),
                  server_conn(back, BACKEND, 41000 + i, t0 + MS // 2)]
        requests += [streamed(PROXY, front, t0, proxy_writes),
                     streamed(PROXY, up, t0 + MS // 4, STEADY, "client"),
                     streamed(BACKEND, back, t0 + MS // 2, STEADY)]
    return requests, conns


def test_the_backend_end_of_a_proxys_connection_is_tied_by_its_port_and_counted_once():
    requests, conns = proxied(3, BURSTS)
    tied = proxy_hops.ties(conns, requests)
    assert {(t.proxy_conn, t.backend_conn) for t in tied} == {(2, 3), (12, 13), (22, 23)}
    headline = headline_of(requests, tied)
    assert len(headline) == 3 and {r.pid for r in headline} == {PROXY}
    # the verdict on queueing and decode reads where the requests are served: the backend
    assert {r.pid for r in proxy_hops.engine_side(requests, tied)} == {BACKEND}
    # without the ties, every served request counts (as before hops were known)
    assert len(headline_of(requests, [])) == 6


def test_a_port_is_not_tied_across_connections_that_were_never_open_together():
    early = client_conn(2, 41000, t_open=0, t_close=10 * MS)
    later = server_conn(3, BACKEND, 41000, t_open=20 * MS)   # the port reused by another client
    unknown = client_conn(4, None, t_open=20 * MS)            # no handshake seen: no port
    serving = [streamed(PROXY, 1, 0, STEADY)]
    assert proxy_hops.ties([early, later, unknown], serving) == []
    assert len(proxy_hops.ties([client_conn(2, 41000, t_open=15 * MS), later], serving)) == 1


def test_a_caller_that_serves_nothing_is_the_user_not_a_proxy():
    """An application or a load generator traced with the server it calls: the server's
    requests are the headline's, and nothing is tied."""
    requests, conns = proxied(2, BURSTS)
    caller_only = [r for r in requests if not (r.pid == PROXY and r.role == "server")]
    assert proxy_hops.ties(conns, caller_only) == []
    assert {r.pid for r in headline_of(caller_only, [])} == {BACKEND}
    assert proxy_hops.analyze(caller_only, conns, {}) is None


def test_a_buffering_proxy_is_a_finding_with_both_hops_figures():
    requests, conns = proxied(4, BURSTS)
    hops = proxy_hops.analyze(requests, conns, {PROXY: "nginx", BACKEND: "backend"})
    assert hops is not None
    front, back = hops.hops
    assert (front.pid, front.behind, back.pid, back.behind) == (PROXY, (), BACKEND, (PROXY,))
    assert front.events_per_write == 15.0 and back.events_per_write == 1.0
    (finding,) = hops.findings
    assert finding.kind == "proxy.bursts" and "nginx (pid 200)" in finding.sentence
    assert "15.0 token events" in finding.sentence and "proxy_buffering off" in finding.recommendation
    # the proxy's first token at 150 ms, the backend's at 4.5 ms after the proxy saw the request
    assert finding.share is not None and 0.95 < finding.share < 1.0


def test_a_proxy_that_passes_the_stream_through_is_no_finding():
    passed = [(ms + 0.3, n) for ms, n in STEADY]
    hops = proxy_hops.analyze(*proxied(4, passed), {})
    assert hops is not None and hops.findings == ()
    assert hops.hops[0].name == f"pid {PROXY}"


def test_without_a_traced_backend_there_are_no_hops():
    requests, conns = proxied(2, BURSTS)
    alone = [c for c in conns if c.pid == PROXY]
    assert proxy_hops.analyze([r for r in requests if r.pid == PROXY], alone, {}) is None


def test_the_connected_event_carries_the_clients_own_port():
    e = _conn_event(EventType.CONN_CONNECTED, 9, PROXY, 1000, role=ConnRole.CLIENT)
    e.local_port = 41234
    (record,) = decoded(bytes(e))
    assert record.local_port == 41234


def test_the_sessionizer_keeps_the_port_on_the_client_connection():
    from inferprobe.collector.ingest.pipeline import ingest

    from tests.factories import conn_open

    connected = _conn_event(EventType.CONN_CONNECTED, 9, PROXY, 2000, fd=-1, role=ConnRole.CLIENT)
    connected.local_port = 41234
    ingested = ingest([conn_open(9, pid=PROXY, port=8000, ts=1000, role=ConnRole.CLIENT), bytes(connected)])
    conn = ingested.connections[9]
    seen = (conn.role, conn.peer_port, conn.local_port, conn.t_connect_end_ns)
    assert seen == ("client", 8000, 41234, 2000)


def test_a_first_token_held_between_the_hops_is_measured_per_exchange_and_named():
    """The proxy's call reads the backend's first token 38 ms after the backend wrote it, on
    reused connections (all but each first exchange): a finding with those figures."""
    requests, conns = [], [server_conn(1, PROXY, 50000, 0), client_conn(2, 41000, 0),
                           server_conn(3, BACKEND, 41000, MS // 2)]
    for i in range(5):
        t0 = i * 1000 * MS
        held = 0.1 if i == 0 else 38.0
        requests += [streamed(PROXY, 1, t0, [(ms + held + 1.5, n) for ms, n in STEADY]),
                     streamed(PROXY, 2, t0 + MS // 4, [(ms + held + 1.0, n) for ms, n in STEADY], "client"),
                     streamed(BACKEND, 3, t0 + MS // 2, [(ms + 0.5, n) for ms, n in STEADY])]
    hops = proxy_hops.analyze(requests, conns, {PROXY: "gateway"})
    assert hops is not None
    (held,) = hops.held_ns
    # the backend read 0.25 ms after the call was sent: each token read `held` + 0.25 ms after its write
    assert [round(h / MS, 2) for h in held] == [0.35, 38.25, 38.25, 38.25, 38.25]
    (finding,) = hops.findings
    assert finding.kind == "proxy.held_between_hops" and "On 4 of 5 calls" in finding.sentence
    assert finding.figures["held_p50_ns"] == held[1] and "TCP_NODELAY" in finding.recommendation


def test_http2_exchanges_pair_by_stream_id_not_order():
    tie = proxy_hops.Tie(2, PROXY, 3, BACKEND)
    calls = [streamed(PROXY, 2, 0, STEADY, "client"), streamed(PROXY, 2, MS, STEADY, "client")]
    served = [streamed(BACKEND, 3, MS // 2, STEADY), streamed(BACKEND, 3, MS // 4, STEADY)]
    calls[0].h2_stream, calls[1].h2_stream = 1, 3
    served[0].h2_stream, served[1].h2_stream = 1, 3   # the backend read stream 3's head first
    pairs = proxy_hops.exchanges(tie, proxy_hops.by_connection(calls + served))
    assert [(c.h2_stream, s.h2_stream) for c, s in pairs] == [(1, 1), (3, 3)]
