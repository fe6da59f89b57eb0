"""The uprobe attaches that failed while recording, each local to one process.

A host-wide recorder attaches uprobes (TLS libraries, Go crypto/tls, USDT
probes) to each process it adopts. One of them failing (the process exited
meanwhile, its binary changed, another tracer holds a probe on the same
instruction with another semaphore offset, a capability the kernel wants)
costs that process those probes and nothing else: the probe sets record it
here, and the recorder logs each one once and counts them by probe set (the
agent's metrics, the recording's stats).

A failed attach is not retried. Every cause seen is permanent for that
process (an exited process, a replaced file, a missing capability) or lasts as
long as the other tracer holds its probe, and each try costs a tracefs write
and a kernel log line. A new process, or a new mapping of a file, is attached
afresh.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field

RECENT_KEPT = 64   # for the recording; the counts cover every failure


@dataclass(frozen=True)
class AttachFailure:
    pid: int
    probe_set: str
    target: str      # what was being attached: a file, with the functions or probes that failed
    error: str       # one line: what libbpf or the kernel answered
    t_ns: int        # CLOCK_MONOTONIC


@dataclass
class AttachFailures:
    by_set: Counter = field(default_factory=Counter)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_KEPT))
    _unsaid: list[AttachFailure] = field(default_factory=list)

    def add(self, pid: int, probe_set: str, target: str, error: str) -> AttachFailure:
        failure = AttachFailure(pid, probe_set, target, " ".join(error.split()), time.monotonic_ns())
        self.by_set[probe_set] += 1
        self.recent.append(failure)
        self._unsaid.append(failure)
        return failure

    def add_functions(self, pid: int, probe_set: str, path: str, failed: dict[str, str]) -> None:
        """One failure for the functions (or probes) of one file that could not be hooked."""
        if failed:
            names = sorted(failed)
            self.add(pid, probe_set, f"{', '.join(names)} in {path}", failed[names[0]])

    @property
    def total(self) -> int:
        return sum(self.by_set.values())

    def take_unsaid(self) -> list[AttachFailure]:
        """The failures not yet logged, each returned once."""
        unsaid, self._unsaid = self._unsaid, []
        return unsaid

    def as_dict(self) -> dict:
        return {"total": self.total, "by_probe_set": dict(self.by_set),
                "recent": [asdict(f) for f in self.recent]}


def describe(failure: AttachFailure, comm: str | None = None) -> str:
    who = f"pid {failure.pid}" + (f" ({comm})" if comm else "")
    return (f"attach failed: {failure.probe_set} in {who}: {failure.target}: {failure.error}; "
            "recording goes on without it")


def unsaid_lines(failures: AttachFailures) -> list[str]:
    """The log lines of the failures not yet said (each once), naming each process."""
    from inferprobe.collector.processes.targets import process_name

    return [describe(f, process_name(f.pid)) for f in failures.take_unsaid()]
