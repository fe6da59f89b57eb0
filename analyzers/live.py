"""The live view's model: a sliding window over a stream of decoded events.

`inferprobe top` feeds every event here as it arrives and asks for a
LiveSnapshot once a second; the terminal widgets only draw snapshots. No I/O,
no bcc, no clock of its own: callers pass `now_ns` (CLOCK_MONOTONIC, the
kernel's event clock), so tests drive it with made-up times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from inferprobe.analyzers.cadence import percentile
from inferprobe.collector.events import ConnRecord, Event, IoRecord, UsdtProbe, UsdtRecord
from inferprobe.collector.sessionizer import Sessionizer
from inferprobe.collector.timeline import Request


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


class LiveWindow:
    def __init__(self, window_s: float = 10.0) -> None:
        self.window_ns = int(window_s * 1e9)
        self._sessions = Sessionizer()
        self._open: list[tuple[Request, int]] = []  # (request, token times already counted)
        self._arrivals: deque[int] = deque()
        self._ttft: deque[tuple[int, int]] = deque()  # (time observed, value)
        self._itl: deque[tuple[int, int]] = deque()
        self._e2e: deque[tuple[int, int]] = deque()
        self.total_requests = 0
        self.events = 0
        self.queue: tuple[int, int] | None = None
        self.kv: float | None = None

    def feed(self, ev: Event) -> None:
        self.events += 1
        if isinstance(ev, UsdtRecord):
            if ev.probe == UsdtProbe.QUEUE_DEPTH and len(ev.args) >= 2:
                self.queue = (int(ev.args[0]), int(ev.args[1]))
            elif ev.probe == UsdtProbe.KV_USAGE and len(ev.args) >= 2 and ev.args[1] > 0:
                self.kv = ev.args[0] / ev.args[1]
            return
        if isinstance(ev, ConnRecord | IoRecord):
            self._sessions.feed(ev)

    def _collect(self) -> None:
        """Moves what the sessionizer built since the last call into the windows."""
        for req in self._sessions.requests:
            self.total_requests += 1
            self._arrivals.append(req.t_ingress_ns)
            self._open.append((req, 0))
        self._sessions.requests.clear()  # the sessionizer keeps its own references while open
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
        )
