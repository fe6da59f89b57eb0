"""Proxy hops: one client request seen at every traced process it passes.

Behind a reverse proxy (nginx, Envoy, an LLM gateway) a streamed completion
is served twice: the proxy reads the client's request and writes its
response, and meanwhile calls the backend, which serves it again. Recorded
together (`record --all`, or `-p` on both), each hop is measured right, but
counted as they come the client's 12 requests are 24 served, and the hops'
token gaps pooled hide what the client got.

Hops are tied by the socket, not by timing: a client connection's own port
(the kernel's, from its TCP handshake: bpf/sock.bpf.c) is the peer port of
the connection its server accepted. Where both ends are traced processes of
one recording (one host, one network namespace), the server's connection is
an inner hop: what it serves goes to a traced proxy, not to a user. The
requests users were served (the headline's) are the others.

What a proxy does to a stream is read from the two hops side by side: the
token events each of its writes carries, against the backend's writes, and
the gaps between them. A proxy that buffers the response (nginx's default
`proxy_buffering on`) delivers tokens in bursts: the client sees long gaps
and a late first token, while the backend streamed steadily.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from inferprobe.analyzers.cadence import Distribution
from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.units import ms
from inferprobe.collector.model.timeline import Connection, Request

ANCHOR = "analyzer-proxy-hops"
# A proxy is said to bunch tokens where its writes carry at least this many times the token
# events of the backend's writes: a proxy that passes a stream through writes what it read,
# and reads merge two of the backend's writes only where they came close together.
BURST_FACTOR = 2.0
# A token written by the backend and read by the proxy this much later waited in the kernel:
# between two processes of one host it moves in microseconds (0.1 ms here).
HELD_NS = 5_000_000


@dataclass(frozen=True)
class Tie:
    """A traced proxy's upstream connection and the traced backend's end of it."""

    proxy_conn: int
    proxy_pid: int
    backend_conn: int
    backend_pid: int


def ties(connections: Iterable[Connection], requests: Sequence[Request]) -> list[Tie]:
    """The client connections of a proxy (a target that served requests) whose other end a
    traced process accepted: same port on both sides (the client's own, the server's peer),
    and both open at once (a port is reused only after its connection closed). A target
    that only calls out (an application, a load generator) is the user: the server it
    calls serves it, and those requests are the headline's."""
    conns = list(connections)
    serving = {r.pid for r in requests if r.role == "server"}
    accepted: dict[int, list[Connection]] = {}
    for c in conns:
        if c.role == "server" and c.peer_port is not None:
            accepted.setdefault(c.peer_port, []).append(c)
    found = []
    for client in conns:
        if client.role != "client" or client.local_port is None or client.pid not in serving:
            continue
        for server in accepted.get(client.local_port, ()):
            if _overlap(client, server):
                found.append(Tie(client.conn_id, client.pid, server.conn_id, server.pid))
                break
    return found


def _overlap(a: Connection, b: Connection) -> bool:
    start_a, start_b = a.t_open_ns or 0, b.t_open_ns or 0
    end_a, end_b = a.t_close_ns or 2**63, b.t_close_ns or 2**63
    return start_a <= end_b and start_b <= end_a


def user_facing(requests: Sequence[Request], tied: Sequence[Tie]) -> list[Request]:
    """The requests served to users: every server request except those on an inner hop."""
    inner = {t.backend_conn for t in tied}
    return [r for r in requests if r.role == "server" and r.conn not in inner]


def engine_side(requests: Sequence[Request], tied: Sequence[Tie]) -> list[Request]:
    """The served requests whose time is spent where they are served: all but a proxy's own
    (a proxy waits on its backend; the verdict on queueing and decode is the backend's)."""
    proxies = {t.proxy_pid for t in tied}
    return [r for r in requests if r.role == "server" and r.pid not in proxies]


@dataclass(frozen=True)
class HopStats:
    """One hop: a process's requests, user-facing or behind a proxy."""

    pid: int
    name: str
    behind: tuple[int, ...]  # the proxies it serves (empty: it serves users)
    requests: int
    ttft_ns: Distribution
    itl_ns: Distribution
    # Token events per token-carrying write, a mean over the hop's writes: a buffering proxy
    # writes a few large bursts and small remainders, whose median would say little.
    events_per_write: float | None

    @classmethod
    def of(cls, pid: int, name: str, behind: tuple[int, ...], requests: Sequence[Request]) -> HopStats:
        per_write = [e for r in requests for e in r.token_events if e > 0]
        return cls(pid, name, behind, len(requests),
                   Distribution.of(t for r in requests if (t := r.ttft_ns) is not None),
                   Distribution.of(g for r in requests for g in r.itl_ns),
                   sum(per_write) / len(per_write) if per_write else None)


def by_connection(requests: Iterable[Request]) -> dict[int, list[Request]]:
    """Each connection's requests, in the order they began."""
    found: dict[int, list[Request]] = {}
    for r in sorted(requests, key=lambda r: r.t_ingress_ns):
        found.setdefault(r.conn, []).append(r)
    return found


def exchanges(tie: Tie, on_conn: dict[int, list[Request]]) -> list[tuple[Request, Request]]:
    """(the proxy's call, the backend's request) on one tied connection (on_conn: by_connection):
    by HTTP/2 stream id where both are streams of it (the same ids at both ends), else in
    order (HTTP/1.x carries one exchange at a time)."""
    calls = [r for r in on_conn.get(tie.proxy_conn, ()) if r.role == "client"]
    served = [r for r in on_conn.get(tie.backend_conn, ()) if r.role == "server"]
    if calls and all(r.h2_stream is not None for r in (*calls, *served)):
        by_stream = {r.h2_stream: r for r in served}
        return [(c, by_stream[c.h2_stream]) for c in calls if c.h2_stream in by_stream]
    return list(zip(calls, served, strict=False))


def first_token_held(tie: Tie, on_conn: dict[int, list[Request]]) -> list[int]:
    """Per exchange on the tie, from the backend's first token write to the proxy's read that
    returned it: the time the token spent in the kernel between the two processes."""
    return [call.token_ns[0] - served.token_ns[0] for call, served in exchanges(tie, on_conn)
            if call.token_ns and served.token_ns]


@dataclass(frozen=True)
class ProxyHops:
    ties: tuple[Tie, ...]
    hops: tuple[HopStats, ...]
    findings: tuple[Finding, ...]
    held_ns: tuple[tuple[int, ...], ...] = ()   # first_token_held, per tie in `ties`


def analyze(requests: Sequence[Request], connections: Iterable[Connection],
            names: dict[int, str]) -> ProxyHops | None:
    """The hops of a recording that has a traced proxy in front of a traced backend, else None."""
    tied = ties(connections, requests)
    if not tied:
        return None
    inner = {t.backend_conn: t.proxy_pid for t in tied}
    served = [r for r in requests if r.role == "server"]
    groups: dict[tuple[int, tuple[int, ...]], list[Request]] = {}
    for r in served:
        behind = (inner[r.conn],) if r.conn in inner else ()
        groups.setdefault((r.pid, behind), []).append(r)
    hops = tuple(HopStats.of(pid, names.get(pid, f"pid {pid}"), behind, reqs)
                 for (pid, behind), reqs in sorted(groups.items(), key=lambda kv: (bool(kv[0][1]), kv[0][0])))
    on_conn = by_connection(requests)
    held = tuple(tuple(first_token_held(t, on_conn)) for t in tied)
    proxies = sorted({t.proxy_pid for t in tied})
    findings = [f for proxy in proxies if (f := _burst_finding(proxy, hops)) is not None]
    findings += [f for proxy in proxies
                 if (f := _held_finding(proxy, hops, [h for t, h in zip(tied, held, strict=True)
                                                      if t.proxy_pid == proxy])) is not None]
    return ProxyHops(tuple(tied), hops, tuple(findings), held)


def _front(proxy: int, hops: Sequence[HopStats]) -> HopStats | None:
    """The proxy's own hop: the requests it served to users."""
    return next((h for h in hops if h.pid == proxy and not h.behind), None)


def _burst_finding(proxy: int, hops: Sequence[HopStats]) -> Finding | None:
    front = _front(proxy, hops)
    back = [h for h in hops if proxy in h.behind]
    if front is None or not back:
        return None
    backend = max(back, key=lambda h: h.requests)
    if front.events_per_write is None or backend.events_per_write is None or \
            front.events_per_write < BURST_FACTOR * backend.events_per_write:
        return None
    ttft = ""
    share = None
    if front.ttft_ns.p99 and backend.ttft_ns.p99 is not None:
        share = max(0.0, min(1.0, (front.ttft_ns.p99 - backend.ttft_ns.p99) / front.ttft_ns.p99))
        ttft = (f"; the first token reached its clients {_ms(front.ttft_ns.p50)} after the request (p50) "
                f"against {_ms(backend.ttft_ns.p50)} at the backend")
    return Finding(
        kind="proxy.bursts",
        sentence=(f"The proxy {front.name} (pid {front.pid}) delivers tokens in bursts: each of its writes "
                  f"to clients carries {front.events_per_write:.1f} token events on average against "
                  f"{backend.events_per_write:.1f} in the writes of its backend {backend.name} (pid "
                  f"{backend.pid}), its writes {_ms(front.itl_ns.p50)} apart (p50) while the backend's were "
                  f"{_ms(backend.itl_ns.p50)} apart{ttft}."),
        source="proxy_hops",
        recommendation=("The backend streams steadily; the proxy holds the response back. Pass "
                        "streamed responses through unbuffered: nginx `proxy_buffering off;` on the "
                        "streaming location (or the backend sends `X-Accel-Buffering: no`), and the "
                        "response buffering setting of other proxies and gateways."),
        **_ranked(share),
        value=front.events_per_write / backend.events_per_write,
        figures={"proxy_pid": front.pid, "backend_pid": backend.pid,
                 "proxy_events_per_write": front.events_per_write,
                 "backend_events_per_write": backend.events_per_write,
                 "proxy_itl_p50_ns": front.itl_ns.p50, "backend_itl_p50_ns": backend.itl_ns.p50},
    )


def _held_finding(proxy: int, hops: Sequence[HopStats], held: list[tuple[int, ...]]) -> Finding | None:
    """The backend's first token reached the proxy late: HELD_NS or more after the backend
    wrote it, on at least two calls and a tenth of them. Between two processes of one host
    that is the kernel holding bytes back, not either program."""
    values = [v for per_tie in held for v in per_tie]
    slow = sorted(v for v in values if v >= HELD_NS)
    front = _front(proxy, hops)
    if front is None or len(slow) < 2 or len(slow) * 10 < len(values):
        return None
    typical = slow[len(slow) // 2]
    share = None
    if front.ttft_ns.p99:
        share = min(1.0, slow[-1] / front.ttft_ns.p99)
    return Finding(
        kind="proxy.held_between_hops",
        sentence=(f"On {len(slow)} of {len(values)} calls from the proxy {front.name} (pid {front.pid}) to "
                  f"its backend, the backend's first token reached the proxy {_ms(typical)} after the "
                  f"backend wrote it (median of those; up to {_ms(slow[-1])}), where it took "
                  f"{_ms(min(values))} at best; its clients' first token came {_ms(front.ttft_ns.p50)} after "
                  f"the request (p50)."),
        source="proxy_hops",
        recommendation=("The token waited in the kernel between the two processes, written and not yet "
                        "read. A small write held back until the previous segment is acknowledged (Nagle's "
                        "algorithm against a delayed ACK, ~40 ms on Linux), typically on a reused "
                        "keep-alive connection, looks like this: record again with --network to see the "
                        "connection's segments, and set TCP_NODELAY on both ends of the proxy's upstream "
                        "connections."),
        **_ranked(share),
        value=float(typical),
        figures={"proxy_pid": front.pid, "calls": len(values), "held_calls": len(slow),
                 "held_p50_ns": typical, "held_max_ns": slow[-1], "held_min_ns": min(values)},
    )


def _ranked(share: float | None) -> dict:
    """A finding's place in the verdict: its share of the proxy's clients' p99 TTFT, where known."""
    if share is None:
        return {}
    return {"share": share, "of": "p99 TTFT at the proxy's clients", "evidence": ANCHOR}


def _ms(ns: float | None) -> str:
    return ms(ns, 1, unit=True)
