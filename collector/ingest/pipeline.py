"""The ingest stage: raw kernel events -> decoded events, Request timelines and the server's view.

Every reader of raw events goes through here: `report` and the per-phase
flame graphs with a whole recording (ingest()), the live exporter batch by
batch (LiveIngest), and `top`'s live window (analyzers/live.py) with the
events it decoded (decode_all(), LiveIngest.feed_decoded()). The steps, in order:
decode each event (collector/model/events.py; an event that does not decode is
counted, never guessed at), order socket events by when their bytes moved
(sessionizer.effect_order), sessionize them into requests, build the
server's view from its USDT probes, and tie each request to the server's
view of it (collector/ingest/correlate.py).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from inferprobe.collector.ingest.correlate import correlate
from inferprobe.collector.ingest.engine_ipc_view import LiveEngineIpc, build_engine_ipc_view
from inferprobe.collector.ingest.llama_view import build_llama_view
from inferprobe.collector.ingest.server_view import ServerView, ServerViewBuilder, build_server_view
from inferprobe.collector.ingest.sessionizer import Sessionizer, effect_order, sessionize
from inferprobe.collector.model.events import (
    ConnRecord,
    DecodeError,
    EngineIpcRecord,
    Event,
    H2FramesRecord,
    H2HeadersRecord,
    IoRecord,
    LlamaStepRecord,
    TraceContextRecord,
    UsdtRecord,
    decode,
)
from inferprobe.collector.model.timeline import Connection, Request, SessionStats

# How long the live path keeps the server's view of a request that ended for
# its socket request to end too (a slow client can still be reading the last tokens).
SERVER_MEMORY_NS = 120 * 1_000_000_000

# How long the live path holds an event before feeding it. The ring hands
# events over as their probes return, so a write whose thread was preempted
# between its socket write and its return probe comes after reads it preceded
# (a client's request after its response's first read), often in the next
# batch. Held this long, it is still fed in its place (sessionizer.effect_order).
REORDER_WINDOW_NS = 50 * 1_000_000


def decode_all(raw_events: Iterable[bytes]) -> tuple[list[Event], int]:
    """The events that decode, in the order given, and how many did not."""
    decoded = []
    undecodable = 0
    for raw in raw_events:
        try:
            decoded.append(decode(raw))
        except DecodeError:
            undecodable += 1
    return decoded, undecodable


@dataclass(frozen=True)
class Ingested:
    """A whole recording after the ingest stage."""

    events: list[Event]  # every decoded event, in recording order
    undecodable: int
    session: SessionStats
    connections: dict[int, Connection]  # conn_id -> connection
    requests: list[Request]  # by ingress time
    server: ServerView  # empty without the server's USDT probes
    correlated: int  # requests tied to the server's view of them


def merge_views(usdt: ServerView, engine: ServerView) -> ServerView:
    """One view of both sources (a llama.cpp server that also fires USDT probes)."""
    if usdt.empty:
        return engine
    usdt.requests.update({(pid, -1 - rid): r for (pid, rid), r in engine.requests.items()})
    usdt.steps = sorted(usdt.steps + engine.steps, key=lambda s: s.t_start_ns)
    usdt.prefills = sorted(usdt.prefills + engine.prefills, key=lambda s: s.end_ns)
    usdt.queue_waits = sorted(usdt.queue_waits + engine.queue_waits, key=lambda s: s.end_ns)
    usdt.queue_depth = sorted(usdt.queue_depth + engine.queue_depth)
    usdt.probes_seen |= engine.probes_seen
    return usdt


# What the sessionizer reads: connections, HTTP/1 I/O, trace context, HTTP/2 frames and header blocks.
SESSION_RECORDS = (ConnRecord, IoRecord, TraceContextRecord, H2FramesRecord, H2HeadersRecord)


def ingest(raw_events: Iterable[bytes]) -> Ingested:
    events, undecodable = decode_all(raw_events)
    session = sessionize(ev for ev in events if isinstance(ev, SESSION_RECORDS))
    requests = sorted(session.requests, key=lambda r: r.t_ingress_ns)
    server = build_server_view(ev for ev in events if isinstance(ev, UsdtRecord))
    correlated = correlate(requests, session.connections, server)
    steps = [ev for ev in events if isinstance(ev, LlamaStepRecord)]
    if steps:  # llama.cpp through uprobes: requests the server's USDT probes did not claim
        llama, tied = build_llama_view(steps, requests, session.connections)
        server = merge_views(server, llama)
        correlated += tied
    engine_ipc = [ev for ev in events if isinstance(ev, EngineIpcRecord)]
    if engine_ipc:  # an engine's messages between its processes (vLLM): requests nothing else claimed
        engine, tied = build_engine_ipc_view(engine_ipc, [r for r in requests if r.server is None])
        server = merge_views(server, engine)
        correlated += tied
    return Ingested(events=events, undecodable=undecodable, session=session.stats,
                    connections=session.connections, requests=requests, server=server,
                    correlated=correlated)


class LiveIngest:
    """The same stage over a stream, one batch at a time (the live exporter's ticks).

    Events are fed in sessionizer.effect_order once REORDER_WINDOW_NS old, by
    `clock` (CLOCK_MONOTONIC, the kernel's event clock). harvest() hands out the requests
    that started and those that ended since the last call; ended ones are
    tied to the server's view first, then dropped with the server state and
    connections older than SERVER_MEMORY_NS, so memory stays flat over long runs.
    """

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.sessionizer = Sessionizer()
        self.server = ServerViewBuilder()
        self.engine_ipc = LiveEngineIpc(SERVER_MEMORY_NS)  # vLLM's messages between its processes
        self.undecodable = 0
        self._announced = 0  # sessionizer.requests[:_announced] were handed out as started
        self._clock = clock
        self._held: list[Event] = []  # bounded: decoded events not yet REORDER_WINDOW_NS old

    def feed(self, raw_events: Iterable[bytes]) -> list[Event]:
        """Decodes and feeds one batch; returns its decoded events in the order given."""
        decoded, undecodable = decode_all(raw_events)
        self.undecodable += undecodable
        self.feed_decoded(decoded)
        return decoded

    def feed_decoded(self, events: Iterable[Event]) -> None:
        """Feeds one batch of events decoded by decode_all() (a live view's)."""
        self._held.extend(events)
        self._release(self._clock() - REORDER_WINDOW_NS)

    def _release(self, until_ns: float) -> None:
        """Feeds the held events that took effect by until_ns, in effect order."""
        self._held.sort(key=effect_order)
        cut = bisect_right(self._held, until_ns, key=lambda ev: effect_order(ev)[0])
        ready, self._held = self._held[:cut], self._held[cut:]
        for ev in ready:
            if isinstance(ev, UsdtRecord):
                self.server.feed(ev)
            elif isinstance(ev, EngineIpcRecord):
                self.engine_ipc.feed(ev)
            else:
                self.sessionizer.feed(ev)

    def harvest(self) -> tuple[list[Request], list[Request]]:
        """(started, ended) since the last call, the ended ones correlated. Ended: a
        request with an end time, or one given up on without one (end_reason set: an
        HTTP/2 connection whose frames were no longer followed); nothing more comes for it."""
        self._release(self._clock() - REORDER_WINDOW_NS)
        s = self.sessionizer
        started = s.requests[self._announced:]
        ended, open_, last_end = [], [], 0
        for r in s.requests:
            if r.t_end_ns is None and r.end_reason is None:
                open_.append(r)
            else:
                ended.append(r)
                last_end = max(last_end, r.t_end_ns or 0)
        if ended:
            # in place: the HTTP/2 view appends to this same list (H2Streams holds it); a new
            # list left every later HTTP/2 request in the old one, never handed out and kept
            s.requests[:] = open_
            cutoff = last_end - SERVER_MEMORY_NS
            view = self.server.view
            if not view.empty:
                correlate(ended, s.connections, view)
                for req in ended:
                    if req.server is not None:
                        view.requests.pop((req.server.pid, req.server.req_id), None)
                self.server.forget_before(cutoff)
            self.engine_ipc.tie(ended, self._clock())
            closed = [cid for cid, c in s.connections.items()
                      if c.t_close_ns is not None and c.t_close_ns < cutoff]
            for cid in closed:
                del s.connections[cid]
        self._announced = len(s.requests)
        return started, ended

    def pids(self) -> set[int]:
        """The processes some state is kept for (connections, the server's view)."""
        return self.sessionizer.pids() | self.server.pids()

    def forget_processes(self, gone: Iterable[int]) -> int:
        """Those processes exited: their connections end as at a close (exit closes a
        process's sockets without a close() the kernel reports) and their server-side
        state goes; the requests ended so go out at the next harvest(). Events still
        held for them are fed first. Returns how many connections ended."""
        gone = set(gone)
        if not gone:
            return 0
        now = self._clock() - REORDER_WINDOW_NS
        self._release(now)
        ended = 0
        for pid in sorted(gone):
            ended += self.sessionizer.forget_process(pid, int(now))
            self.server.forget_process(pid)
        return ended

    def finish(self) -> list[Request]:
        """Ends the stream: the requests still open, marked incomplete."""
        self._release(float("inf"))
        leftover = self.sessionizer.finish()
        self.sessionizer.requests = []   # the stream ended: nothing is fed after this
        self._announced = 0
        return leftover
