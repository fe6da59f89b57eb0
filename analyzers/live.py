"""The live view's model: a sliding window over a stream of decoded events.

`inferprobe top` feeds every event here as it arrives and asks for a
LiveSnapshot once a second; the terminal widgets only draw snapshots. No I/O,
no bcc, no clock of its own: callers pass `now_ns` (CLOCK_MONOTONIC, the
kernel's event clock), so tests drive it with made-up times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from inferprobe.analyzers import locks
from inferprobe.analyzers.cadence import percentile
from inferprobe.analyzers.engine_metrics import OCCUPANCY, QUEUE, RUNNING, gauge_values
from inferprobe.collector.ingest.pipeline import LiveIngest
from inferprobe.collector.model.events import (
    ConnRecord,
    Event,
    FutexWaitRecord,
    IoRecord,
    UsdtRecord,
)
from inferprobe.collector.model.timeline import Request


@dataclass(frozen=True)
class LiveSnapshot:
    window_s: float
    total_requests: int  # since attaching
    requests_per_s: float  # request lines read in the window / window
    in_flight: int  # requests read and not yet ended
    ttft_p50_ns: float | None
    ttft_p99_ns: float | None
    itl_p50_ns: float | None
    itl_p99_ns: float | None
    e2e_p50_ns: float | None
    e2e_p99_ns: float | None
    queue_waiting: int | None  # latest queue_depth probe, None without USDT
    queue_running: int | None
    kv_occupancy: float | None  # latest kv_usage probe: used / capacity
    lost_events: int
    events: int
    locks_traced: bool = False  # top --locks
    # Requests that ended in the window with mutex.wait.ratio above mutex_threshold,
    # over those judged (mutex_judged); None when none was judged or locks are not traced.
    mutex_flagged_share: float | None = None
    mutex_judged: int = 0
    mutex_threshold: float = locks.DEFAULT_MUTEX_THRESHOLD
    gauge_source: str | None = None  # where queue/running/occupancy came from: "usdt", "engine_metrics"


# A request is judged for lock waits this long after it ended: a wait reaches
# the ring buffer when it ends, and the reader polls ~10 times/s. A wait that
# overlaps the request but ends later than this is not counted live.
LOCK_SETTLE_NS = 500_000_000
# Lock waits are kept at most this long: a request open for longer (an endless
# stream, a WebSocket) is judged on its last LOCK_HISTORY_NS only.
LOCK_HISTORY_NS = 300 * 1_000_000_000
COUNTED_KINDS = (locks.WaitKind.LOCK, locks.WaitKind.GIL)  # what mutex.wait.ratio sums
# Socket events go to the ingest stage in batches of at most this many (each
# batch in completion order), so memory does not grow with --interval.
SOCKET_BATCH = 4096


class LiveLocks:
    """mutex.wait.ratio of requests as they end (analyzers/locks.py's definition,
    with the threads that read and wrote each request; the engine threads the
    report adds from USDT decode steps are not known live).

    Only lock and GIL waits are kept (handoff waits of idle workers are most
    waits and never count), and only while an open or unjudged request may
    still count them, for LOCK_HISTORY_NS at most: memory follows the load,
    not the length of the session."""

    def __init__(self, classifier: locks.WaitClassifier, threshold: float = locks.DEFAULT_MUTEX_THRESHOLD):
        self.classifier = classifier
        self.threshold = threshold
        self._new: list[FutexWaitRecord] = []
        self._waits: list[locks.ClassifiedWait] = []
        self._ended: deque = deque()  # requests ended, not yet judged
        self.flags: deque[tuple[int, bool]] = deque()  # (end time, flagged)

    def add_wait(self, wait: FutexWaitRecord) -> None:
        self._new.append(wait)

    def request_ended(self, request) -> None:
        self._ended.append(request)

    def judge(self, now_ns: int, oldest_open_ns: int | None, window_start_ns: int) -> None:
        if self._new:
            self._waits += [cw for cw in self.classifier.classify(self._new) if cw.kind in COUNTED_KINDS]
            self._new = []
        settled = now_ns - LOCK_SETTLE_NS
        ready = []
        while self._ended and self._ended[0].t_end_ns <= settled:
            ready.append(self._ended.popleft())
        if ready:
            index = locks.ThreadIndex(self._waits, ())
            for r in ready:
                self.flags.append((r.t_end_ns, locks.is_flagged(locks.span_locks(r, index), self.threshold)))
        unjudged = min((r.t_ingress_ns for r in self._ended), default=None)
        needed = [t for t in (oldest_open_ns, unjudged) if t is not None]
        keep_from = max(min(needed, default=now_ns), now_ns - LOCK_HISTORY_NS)
        self._waits = [cw for cw in self._waits if cw.wait.end_ns >= keep_from]
        while self.flags and self.flags[0][0] < window_start_ns:
            self.flags.popleft()

    @property
    def retained_waits(self) -> int:
        return len(self._waits) + len(self._new)

    def share(self) -> float | None:
        return sum(f for _, f in self.flags) / len(self.flags) if self.flags else None


class LiveWindow:
    def __init__(self, window_s: float = 10.0, lock_waits: LiveLocks | None = None) -> None:
        self.window_ns = int(window_s * 1e9)
        self._ingest = LiveIngest()
        self._socket_events: list[Event] = []  # for the ingest stage, in batches (SOCKET_BATCH)
        self._open: list[tuple[Request, int]] = []  # (request, token times already counted)
        self._arrivals: deque[int] = deque()
        self._ttft: deque[tuple[int, int]] = deque()  # (time observed, value)
        self._itl: deque[tuple[int, int]] = deque()
        self._e2e: deque[tuple[int, int]] = deque()
        self.total_requests = 0
        self.events = 0
        self.queue: tuple[int, int] | None = None
        self.kv: float | None = None
        self.locks = lock_waits
        self.gauge_source: str | None = None
        self.scraper_ports: set[int] = set()  # our own scrapes of the engine's /metrics: not traffic

    def feed(self, ev: Event) -> None:
        self.events += 1
        if isinstance(ev, FutexWaitRecord):
            if self.locks is not None:
                self.locks.add_wait(ev)
            return
        if isinstance(ev, UsdtRecord):
            if (queue := ev.queue_depth) is not None:
                self.queue = queue
                self.gauge_source = "usdt"
            elif (used := ev.kv_used) is not None:
                self.kv = used
                self.gauge_source = "usdt"
            return
        if isinstance(ev, ConnRecord | IoRecord):
            self._socket_events.append(ev)
            if len(self._socket_events) >= SOCKET_BATCH:
                self._ingest_socket_events()

    def feed_engine(self, scrape: dict) -> None:
        """One scrape of the engine's /metrics (collector/attach/engine_scrape.py). The
        server's own probes, when it fires them, win: they are exact, not sampled."""
        self.scraper_ports.update(scrape.get("local_ports") or ())
        if self.gauge_source == "usdt":
            return
        values = gauge_values(scrape["samples"])
        if QUEUE in values or RUNNING in values:
            self.queue = (int(values.get(QUEUE, ("", -1))[1]), int(values.get(RUNNING, ("", -1))[1]))
        if OCCUPANCY in values:
            self.kv = values[OCCUPANCY][1]
        if values:
            self.gauge_source = "engine_metrics"

    def _is_own_scrape(self, req: Request) -> bool:
        """By the scraper's own socket: the server's peer is our local port (never by
        path: another client's GET /metrics is counted like any request)."""
        conn = self._ingest.sessionizer.connections.get(req.conn)
        return conn is not None and conn.peer_port in self.scraper_ports

    def _ingest_socket_events(self) -> None:
        self._ingest.feed_decoded(self._socket_events)
        self._socket_events = []

    def _collect(self) -> None:
        """Moves what the ingest stage built since the last call into the windows."""
        self._ingest_socket_events()
        started, _ended = self._ingest.harvest()  # the window keeps its own references
        for req in started:
            if self.scraper_ports and self._is_own_scrape(req):
                continue
            self.total_requests += 1
            self._arrivals.append(req.t_ingress_ns)
            self._open.append((req, 0))
        still_open = []
        for req, counted in self._open:
            tokens = req.token_ns
            for i in range(counted, len(tokens)):
                if i == 0:
                    self._ttft.append((tokens[0], tokens[0] - req.t_ingress_ns))
                else:
                    self._itl.append((tokens[i], tokens[i] - tokens[i - 1]))
            if req.t_end_ns is not None:
                if req.e2e_ns is not None:
                    self._e2e.append((req.t_end_ns, req.e2e_ns))
                if self.locks is not None:
                    self.locks.request_ended(req)
            else:
                still_open.append((req, len(tokens)))
        self._open = still_open

    def _expire(self, now_ns: int) -> None:
        start = now_ns - self.window_ns
        while self._arrivals and self._arrivals[0] < start:
            self._arrivals.popleft()
        for window in (self._ttft, self._itl, self._e2e):
            while window and window[0][0] < start:
                window.popleft()

    def snapshot(self, now_ns: int, lost_events: int = 0) -> LiveSnapshot:
        self._collect()
        self._expire(now_ns)
        if self.locks is not None:
            oldest_open = min((r.t_ingress_ns for r, _ in self._open), default=None)
            self.locks.judge(now_ns, oldest_open, now_ns - self.window_ns)
        ttft = [v for _, v in self._ttft]
        itl = [v for _, v in self._itl]
        e2e = [v for _, v in self._e2e]
        window_s = self.window_ns / 1e9
        return LiveSnapshot(
            window_s=window_s,
            total_requests=self.total_requests,
            requests_per_s=len(self._arrivals) / window_s,
            in_flight=len(self._open),
            ttft_p50_ns=percentile(ttft, 50), ttft_p99_ns=percentile(ttft, 99),
            itl_p50_ns=percentile(itl, 50), itl_p99_ns=percentile(itl, 99),
            e2e_p50_ns=percentile(e2e, 50), e2e_p99_ns=percentile(e2e, 99),
            queue_waiting=self.queue[0] if self.queue else None,
            queue_running=self.queue[1] if self.queue else None,
            kv_occupancy=self.kv,
            lost_events=lost_events,
            events=self.events,
            locks_traced=self.locks is not None,
            mutex_flagged_share=None if self.locks is None else self.locks.share(),
            mutex_judged=0 if self.locks is None else len(self.locks.flags),
            mutex_threshold=locks.DEFAULT_MUTEX_THRESHOLD if self.locks is None else self.locks.threshold,
            gauge_source=self.gauge_source,
        )
