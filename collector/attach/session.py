"""One loaded tracer driven until something stops it: the loop `record`, `agent` and `top` share.

Each command hands the kernel's events to its own sink (a recording file, a
ring of segments, a live window) and does its own work on a clock (record
flushes its file each second, the agent also holds its CPU budget, top
redraws). What stops them is the same: SIGTERM or SIGINT, --duration, every
target gone, or a command's own reason (top's q key). The session says why it
stopped, drains what the kernel still holds before the caller writes its last
record, and in close() detaches and gives the signals back, whatever happened.

Also here, what every recording's metadata says of the tracer and its targets
(recording_meta), since record and the agent's segments write the same.
"""

from __future__ import annotations

import importlib.metadata
import platform
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferprobe.collector.attach.event_stream import EventStream
from inferprobe.collector.attach.libbpf_library import libbpf_version
from inferprobe.collector.model.events import LAYOUT_VERSION
from inferprobe.collector.processes import targets as target_procs

POLL_MS = 100  # the longest a stop, a due task or a key press waits
DURATION = "duration"
TARGETS_EXITED = "targets exited"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class _Task:
    interval_s: float
    run: Callable[[float], None]
    due: float


class Session:
    def __init__(self, tracer, sink: Callable[[bytes], None], *, duration_s: float | None = None,
                 watch_pids: list[int] | None = None) -> None:
        """Starts reading; the caller's work is added with every() and on_signal(), then run().
        watch_pids: stop once none of them is alive (None: never, as host-wide recording)."""
        self.tracer = tracer
        self.reader = EventStream(tracer, sink)
        self.started = time.monotonic()
        self.stop_reason: str | None = None
        self._duration_s = duration_s
        self._tasks: list[_Task] = []
        self._signals: list[int] = []
        for signum in STOP_SIGNALS:
            self.on_signal(signum, lambda signum: self.stop(signal.Signals(signum).name))
        if watch_pids is not None:
            self.every(1.0, lambda _now: None if any(target_procs.alive(p) for p in watch_pids)
                       else self.stop(TARGETS_EXITED))

    def on_signal(self, signum: int, handler: Callable[[int], None]) -> None:
        signal.signal(signum, lambda sig, _frame: handler(sig))
        self._signals.append(signum)

    def every(self, interval_s: float, task: Callable[[float], None]) -> None:
        """Runs task(now) each interval_s from the start (tasks run in the order added)."""
        self._tasks.append(_Task(interval_s, task, self.started + interval_s))

    def stop(self, reason: str) -> None:
        """Ends run() at its next turn; the first reason given is the one kept."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def counters(self) -> dict[str, int]:
        """The kernel's counters, with `requests` counting HTTP/2 requests as well as HTTP/1
        request lines (h2_requests: those of them decoded here)."""
        counters = self.tracer.counters()
        counters["h2_requests"] = self.reader.h2_requests
        counters["requests"] += counters["h2_requests"]
        return counters

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def run(self, each_poll: Callable[[float], None] | None = None) -> str:
        """Polls until stopped, then drains the kernel's rings; returns why it stopped.
        each_poll(now) runs after every poll (live export's tick, a key press)."""
        while True:
            self.reader.poll(POLL_MS)
            now = time.monotonic()
            if each_poll is not None:
                each_poll(now)
            if self._duration_s is not None and now - self.started >= self._duration_s:
                self.stop(DURATION)
            if self.stop_reason is not None:
                break
            for task in self._tasks:
                if now >= task.due:
                    task.due = now + task.interval_s
                    task.run(now)
            if self.stop_reason is not None:
                break
        self.reader.drain()
        return self.stop_reason

    def close(self) -> None:
        """Detaches and restores the default signal handlers; safe after any failure."""
        try:
            self.reader.close()
        finally:
            self.tracer.close()
            for signum in self._signals:
                default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
                signal.signal(signum, default)


# In-flight state maps are counted (a key walk each) this often: their sizes
# in a recording, or in each of the agent's segments, show that nothing leaks
# on long runs.
MAP_COUNT_INTERVAL_S = 5.0


def own_rss_kb() -> int | None:
    """The recorder's own resident memory, for the recording's stats."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _clock_offset_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, to place kernel times on the wall clock."""
    before = time.monotonic_ns()
    wall = time.time_ns()
    after = time.monotonic_ns()
    return wall - (before + after) // 2


def _version_of(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def recording_meta(tracer, argv: list[str]) -> dict:
    """What a recording says of the tracer and its targets, written at its start."""
    return {
        "inferprobe_version": _version_of("inferprobe"),
        "layout_version": LAYOUT_VERSION,
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "libbpf_version": libbpf_version(),
        "targets": [{"pid": p, "comm": target_procs.process_name(p)} for p in tracer.pids],
        "command_line": argv,
        "listening": target_procs.listening_sockets(tracer.pids),
        "listening_ancestor": target_procs.serving_ancestor(tracer.pids),
        "started_monotonic_ns": time.monotonic_ns(),
        "realtime_offset_ns": _clock_offset_ns(),
        "probe_sets": {
            "active": {name: s.description for name, s in tracer.active.items()},
            "inactive": dict(tracer.inactive),
        },
        "startup_s": dict(tracer.startup_s),
    }
