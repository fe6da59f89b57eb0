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
from inferprobe.collector.timeline import Connection, Request

ANCHOR = "analyzer-proxy-hops"
# A proxy is said to bunch tokens where its writes carry at least this many times the token
# events of the backend's writes: a proxy that passes a stream through writes what it read,
# and reads merge two of the backend's writes only where they came close together.
BURST_FACTOR = 2.0


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


@dataclass(frozen=True)
class ProxyHops:
    ties: tuple[Tie, ...]
    hops: tuple[HopStats, ...]
    findings: tuple[Finding, ...]


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
    findings = tuple(f for proxy in sorted({t.proxy_pid for t in tied})
                     if (f := _burst_finding(proxy, hops)) is not None)
    return ProxyHops(tuple(tied), hops, findings)


def _burst_finding(proxy: int, hops: Sequence[HopStats]) -> Finding | None:
    front = next((h for h in hops if h.pid == proxy and not h.behind), None)
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
        share=share,
        of="p99 TTFT at the proxy's clients" if share is not None else "",
        evidence=ANCHOR if share is not None else "",
        value=front.events_per_write / backend.events_per_write,
        figures={"proxy_pid": front.pid, "backend_pid": backend.pid,
                 "proxy_events_per_write": front.events_per_write,
                 "backend_events_per_write": backend.events_per_write,
                 "proxy_itl_p50_ns": front.itl_ns.p50, "backend_itl_p50_ns": backend.itl_ns.p50},
    )


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.1f} ms"
