"""Ties each request the server announced (USDT) to the HTTP request on its socket.

Preferred: the server passed the socket's fd to request_start. The request
is then the oldest one read on that fd in that process before request_start
fired that is neither taken nor already answered: exact even with hundreds
of concurrent streams, because an fd names one connection at a time, and
keep-alive and pipelined requests on a connection are answered in order.

Without an fd (conn_fd = -1), two fallbacks over the requests of that
process that were read before request_start and not yet answered then;
each is marked in Request.correlated_by so a report can say how sure it is:
  "thread": exactly one of them was read by the thread that fired
            request_start (thread-per-request servers);
  "time":   exactly one of them exists at all.
When several qualify, none is chosen: no guessing.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from inferprobe.collector.ingest.server_view import ServerView
from inferprobe.collector.model.timeline import Connection, Request, ServerRequest


def correlate(requests: list[Request], connections: dict[int, Connection], view: ServerView) -> int:
    """Sets Request.server and .correlated_by; returns how many were matched."""
    by_fd: dict[tuple[int, int], list[Request]] = defaultdict(list)
    by_pid: dict[int, list[Request]] = defaultdict(list)
    for req in sorted(requests, key=lambda r: r.t_ingress_ns):
        conn = connections.get(req.conn)
        if conn is not None:
            by_fd[(req.pid, conn.fd)].append(req)
        by_pid[req.pid].append(req)
    ingress = {key: [r.t_ingress_ns for r in reqs] for key, reqs in by_fd.items()}

    first_open: dict[tuple[int, int], int] = defaultdict(int)
    matched = 0
    unresolved: list[tuple[ServerRequest, int]] = []  # (request, its start)
    for srv in sorted(view.requests.values(), key=lambda s: s.t_start_ns or 0):
        start = srv.t_start_ns
        if start is None:
            continue  # request_start was not seen (fired before recording began)
        if srv.conn_fd is not None:
            key = (srv.pid, srv.conn_fd)
            candidates = by_fd.get(key, [])
            last = bisect.bisect_right(ingress.get(key, []), start)
            # The oldest request on that fd that was read before request_start,
            # is not taken, and had not ended: keep-alive requests that were
            # answered before are past; pipelined ones are answered in order.
            # Server requests come in start order, so the skip is monotonic.
            i = first_open[key]
            while i < last and (candidates[i].server is not None or (
                    (end := candidates[i].t_end_ns) is not None and end < start)):
                i += 1
            first_open[key] = i
            if i < last:
                candidates[i].server, candidates[i].correlated_by = srv, "conn_fd"
                matched += 1
            continue
        unresolved.append((srv, start))

    for srv, start in unresolved:
        open_then = [
            r for r in by_pid.get(srv.pid, [])
            if r.server is None and r.t_ingress_ns <= start
            and (r.t_response_start_ns is None or r.t_response_start_ns >= start)
            and (r.t_end_ns is None or r.t_end_ns >= start)
        ]
        same_thread = [r for r in open_then if r.tid == srv.tid]
        if len(same_thread) == 1:
            chosen, how = same_thread[0], "thread"
        elif len(open_then) == 1:
            chosen, how = open_then[0], "time"
        else:
            continue  # ambiguous: several requests were waiting for an answer
        chosen.server, chosen.correlated_by = srv, how
        matched += 1
    return matched
