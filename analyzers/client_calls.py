"""Outbound calls: a process's attempts grouped into the calls its code made, and why each took long.

An application's SDK turns one call into attempts: with `timeout=10,
max_retries=2` a first attempt that gets no byte for 10 s is closed by the
client, the SDK backs off and tries again, and the caller sees one long
call. From the kernel, each attempt is one client Request (the collector's
client role) on a connection the process connect()ed, or reused.

Grouping, in this order (each attempt says which rule grouped it):
1. "retry header": the request carried `x-stainless-retry-count` (every
   Stainless-generated SDK sends it: openai, anthropic), its value counted
   in the kernel; an attempt with a count above 0 continues the last call
   of the same thread to the same method, path and peer.
2. "after a failed attempt": without the header, an attempt by the same
   thread to the same method, path and peer that starts within
   RETRY_WINDOW_NS of the end of an attempt that failed (aborted, or a
   status a client retries: 408, 409, 429, 5xx).
Anything else starts a call of its own ("first attempt").

The explanation is a sum: the call's time, attempt by attempt, connect
(where a new connection was opened for it), the wait for the first
response byte, the first token, the streaming, and the backoff between
attempts, each from the kernel's own timestamps.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.units import duration
from inferprobe.collector.ingest.sessionizer import ERROR_BODY_UNREAD
from inferprobe.collector.model.timeline import Connection, Outcome, Request

ANCHOR = "analyzer-client-calls"  # the report section (reports/sections/client_calls.py)
RETRY_WINDOW_NS = 60_000_000_000
RETRIED_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))
# What a client is told by each status an SDK retries on.
TURNED_AWAY = {429: "throttled: a rate limit or quota", 503: "overloaded", 529: "overloaded",
               502: "a bad gateway", 504: "a gateway timeout", 408: "a request timeout"}


@dataclass(frozen=True)
class Attempt:
    request: Request
    connection: Connection | None
    call: int  # the logical call's id, shared by its attempts
    number: int  # 1, 2, ...
    grouped_by: str  # "first attempt", "retry header" or "after a failed attempt"
    # the connection had carried an earlier request, or was open before the recording
    # began (a pool's, kept alive): no connect for this one
    reused: bool
    # The connection was opened before an earlier attempt of the call, or of the
    # same thread, ended (a pool that connects ahead, as Node's undici does): its
    # connect and handshake were not this attempt's time (_opened_ahead).
    opened_ahead: bool = False

    @property
    def _connected_for_it(self) -> Connection | None:
        return None if self.reused or self.opened_ahead else self.connection

    @property
    def t_connect_start_ns(self) -> int | None:
        conn = self._connected_for_it
        return None if conn is None else conn.t_open_ns

    @property
    def t_connect_end_ns(self) -> int | None:
        conn = self._connected_for_it
        return None if conn is None else conn.t_connect_end_ns

    @property
    def t_tls_done_ns(self) -> int | None:
        conn = self._connected_for_it
        return None if conn is None else conn.t_tls_done_ns

    @property
    def timed_out(self) -> bool:
        """Closed by the client while it waited for the first byte: the SDK's timeout, most likely."""
        return self.request.outcome == Outcome.ABORTED and self.request.t_response_start_ns is None

    @property
    def t_start_ns(self) -> int:
        start = self.t_connect_start_ns
        return start if start is not None else self.request.t_ingress_ns

    @property
    def t_end_ns(self) -> int:
        r = self.request
        ends = [t for t in (r.t_end_ns, r.token_ns[-1] if r.token_ns else None, r.t_response_start_ns) if t]
        return max(ends, default=r.t_ingress_ns)

    @property
    def failed(self) -> bool:
        r = self.request
        return r.outcome == Outcome.ABORTED or (r.status is not None and r.status in RETRIED_STATUSES)

    def explain(self) -> str:
        r = self.request
        parts = []
        if self.t_connect_start_ns is not None and self.t_connect_end_ns is not None:
            parts.append(f"connect {duration(self.t_connect_end_ns - self.t_connect_start_ns)}")
            ready = self.t_connect_end_ns
            if self.t_tls_done_ns is not None:
                parts.append(f"TLS handshake {duration(self.t_tls_done_ns - ready)}")
                ready = self.t_tls_done_ns
            label = ("TLS handshake and request set-up" if r.transport == "tls" and self.t_tls_done_ns is None
                     else "request set-up")
            parts.append(f"{label} {duration(r.t_ingress_ns - ready)}")
        if r.t_response_start_ns is None:
            end = r.t_end_ns if r.t_end_ns is not None else self.t_end_ns
            why = ("closed by the client (its timeout?)" if r.outcome == Outcome.ABORTED
                   else "still open when the recording ended")
            parts.append(f"{duration(end - r.t_ingress_ns)} waiting for the first byte, {why}")
            return ", ".join(parts)
        if r.t_first_token_ns is not None:
            parts.append(f"first token {duration(r.t_first_token_ns - r.t_ingress_ns)}")
            if r.t_end_ns is not None:
                parts.append(f"streaming {duration(r.t_end_ns - r.t_first_token_ns)}")
        else:
            parts.append(f"first byte {duration(r.t_response_start_ns - r.t_ingress_ns)}")
            if r.end_reason == ERROR_BODY_UNREAD:
                parts.append("body left unread")
            elif r.t_end_ns is not None:
                parts.append(f"body {duration(r.t_end_ns - r.t_response_start_ns)}")
        if r.status is not None and r.status >= 400:
            meaning = TURNED_AWAY.get(r.status)
            parts.append(f"status {r.status}" + (f" ({meaning})" if meaning else ""))
        elif r.outcome == Outcome.ABORTED:
            parts.append("closed by the client before the end")
        if r.stream_error is not None:
            parts.append(f"the stream ended in {r.stream_error}"
                         + (" (throttled)" if "throttl" in r.stream_error.lower() else ""))
        return ", ".join(parts)


@dataclass(frozen=True)
class ClientCall:
    id: int
    attempts: tuple[Attempt, ...]

    @property
    def t_start_ns(self) -> int:
        return self.attempts[0].t_start_ns

    @property
    def t_end_ns(self) -> int:
        return self.attempts[-1].t_end_ns

    @property
    def duration_ns(self) -> int:
        return self.t_end_ns - self.t_start_ns

    @property
    def peer(self) -> str | None:
        return self.attempts[0].request.peer

    def explain(self) -> str:
        """"12.03 s = attempt 1: ...; backoff 512.0 ms; attempt 2: ..." """
        pieces = []
        for previous, attempt in zip((None, *self.attempts[:-1]), self.attempts, strict=True):
            if previous is not None:
                pieces.append(f"backoff {duration(attempt.t_start_ns - previous.t_end_ns)}")
            pieces.append(f"attempt {attempt.number}: {attempt.explain()}")
        return f"{duration(self.duration_ns)} = " + "; ".join(pieces)


def group(requests: Sequence[Request], connections: dict[int, Connection]) -> list[ClientCall]:
    """The client requests of a recording as calls, in the order they began."""
    client = sorted((r for r in requests if r.role == "client"), key=lambda r: r.t_ingress_ns)
    seen_conns: set[int] = set()
    open_calls: dict[tuple, list[Attempt]] = {}  # (pid, tid, method, path, peer) -> the last call's attempts
    ends_by_thread: dict[tuple[int, int], list[int]] = defaultdict(list)  # sorted attempt ends
    calls: list[list[Attempt]] = []
    for r in client:
        conn = connections.get(r.conn)
        reused = r.conn in seen_conns or (conn is not None and conn.t_open_ns is None)
        seen_conns.add(r.conn)
        key = (r.pid, r.tid, r.method, r.path, r.peer)
        last = open_calls.get(key)
        rule = _continues(last[-1], r) if last else None
        ends = ends_by_thread[(r.pid, r.tid)]
        ahead = not reused and _opened_ahead(conn, r, ends, last[-1] if last and rule else None)
        if last is not None and rule is not None:
            attempt = Attempt(r, conn, last[0].call, len(last) + 1, rule, reused, opened_ahead=ahead)
            last.append(attempt)
        else:
            attempt = Attempt(r, conn, len(calls) + 1, 1, "first attempt", reused, opened_ahead=ahead)
            calls.append([attempt])
            open_calls[key] = calls[-1]
        insort(ends, attempt.t_end_ns)
    return [ClientCall(id=a[0].call, attempts=tuple(a)) for a in calls]


def _opened_ahead(conn: Connection | None, r: Request, thread_ends: list[int],
                  previous: Attempt | None) -> bool:
    """Whether r's connection was opened before it was wanted: before the call's previous
    attempt ended (a backoff cannot be negative), or before another attempt of the same
    thread ended that itself ended before r began (a pool connecting ahead of the next
    call). A runtime running calls side by side on one thread (Node) may start a
    connect just before another call ends: that attempt then shows no connect phase
    rather than a pool's idle time taken for its handshake."""
    if conn is None or conn.t_open_ns is None:
        return False
    if previous is not None and conn.t_open_ns < previous.t_end_ns:
        return True
    after_open = bisect_right(thread_ends, conn.t_open_ns)
    return after_open < len(thread_ends) and thread_ends[after_open] < r.t_ingress_ns


def _continues(previous: Attempt, r: Request) -> str | None:
    """The rule by which r is the next attempt of previous's call, or None."""
    if r.retry_count is not None:
        return "retry header" if r.retry_count > 0 else None
    if previous.failed and r.t_ingress_ns - previous.t_end_ns <= RETRY_WINDOW_NS:
        return "after a failed attempt"
    return None


def attempts_by_request(calls: Sequence[ClientCall]) -> dict[int, Attempt]:
    """id(request) -> its attempt, for the per-request JSON fields."""
    return {id(a.request): a for call in calls for a in call.attempts}


def slow_calls(calls: Sequence[ClientCall], limit: int = 5) -> list[ClientCall]:
    """The calls worth explaining: every call with a retry, then the slowest others."""
    retried = [c for c in calls if len(c.attempts) > 1]
    rest = sorted((c for c in calls if len(c.attempts) == 1), key=lambda c: -c.duration_ns)
    return sorted(retried, key=lambda c: -c.duration_ns)[:limit] + rest[: max(0, limit - len(retried))]


def retry_advice(retried: list[ClientCall]) -> str:
    """Advice for what the failed attempts were: timed out waiting, or answered with a status."""
    failed = [a for c in retried for a in c.attempts[:-1]]
    timed_out = sum(1 for a in failed if a.timed_out)
    statuses: dict[int, int] = defaultdict(int)
    for a in failed:
        if a.request.status is not None and a.request.status >= 400:
            statuses[a.request.status] += 1
    advice = []
    if statuses:
        said = ", ".join(f"{n} answered {status}"
                         + (f" ({TURNED_AWAY[status]})" if status in TURNED_AWAY else "")
                         for status, n in sorted(statuses.items()))
        advice.append(f"The peer turned attempts away ({said}) and the SDK retried after its backoff: the "
                      "cure is on the peer's side (its rate limit or quota, its capacity, or spreading the "
                      "load), and the backoff is the SDK's (and the retry-after the peer sent).")
    if timed_out:
        advice.append(f"{timed_out} attempt(s) were closed by the client while waiting for the first byte: "
                      "the SDK's timeout. Compare it with the server's TTFT under load (a timeout below the "
                      "p99 TTFT retries the slowest requests), and check the peer's queue.")
    if not advice:
        advice.append("The failed attempts broke off mid-answer: look at the peer and the network.")
    return " ".join(advice)


def retries_finding(calls: Sequence[ClientCall]) -> Finding | None:
    """Retried calls as a finding: the failed attempts and the backoff are time the caller
    waited for nothing, as a share of all call time."""
    retried = [c for c in calls if len(c.attempts) > 1]
    if not retried:
        return None
    lost = sum(c.attempts[-1].t_start_ns - c.t_start_ns for c in retried)
    total = sum(c.duration_ns for c in calls)
    worst = max(retried, key=lambda c: c.duration_ns)
    return Finding(
        kind="client.retries",
        sentence=(f"{len(retried)} of {len(calls)} outbound calls were retried: their failed attempts "
                  f"and backoff took {duration(lost)}, {100 * lost / total:.0f} % of all call time "
                  f"(worst: {worst.explain()})."),
        source="client_calls",
        recommendation=retry_advice(retried),
        share=min(1.0, lost / total) if total else None,
        of="outbound call time",
        evidence=ANCHOR,
        value=float(len(retried)),
    )
