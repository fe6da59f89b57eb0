"""The agent's CPU budget: what tracing costs, measured, and a sampling ratio that holds it.

Cost = the kernel's own run time of our BPF programs (every program run on
every CPU, in whichever process's syscall it ran) + this process's CPU time
(all its threads: the ring reader, the sessionizer, the OTLP worker), over
wall-clock time. 1.0 is one CPU busy.

The kernel counts a program's run time only while BPF statistics are on.
BPF_ENABLE_STATS turns them on for as long as we hold the file descriptor it
returns, so a crash of the agent cannot leave them on for the host (the
kernel.bpf_stats_enabled sysctl would); each program's totals are read from
its fd's /proc/self/fdinfo entry (run_time_ns, run_cnt).

Above the budget the share of new connections followed in full goes down
(the kernel decides per connection, bpf/host_wide.bpf.c); well below it,
back up. Connections already followed stay followed, and what the hooks
cost on the host's other syscalls does not shrink with the ratio: that floor
is reported when even the lowest ratio cannot hold the budget.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field

SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
MIN_RATIO = 1 / 1024
# Raise the ratio only when well under the budget, so that it does not oscillate.
RAISE_BELOW = 0.6
RAISE_FACTOR = 1.5


def enable_bpf_stats() -> int | None:
    """An fd that keeps the kernel's BPF run-time statistics on while open; None if refused."""
    number = SYS_BPF.get(os.uname().machine)
    if number is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 2)(BPF_STATS_RUN_TIME, 0)
    fd = libc.syscall(number, BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
    return fd if fd >= 0 else None


def sysctl_stats_on(path: str = "/proc/sys/kernel/bpf_stats_enabled") -> bool:
    try:
        with open(path) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def bpf_run_time(pid: str = "self", proc: str = "/proc") -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs pid holds open."""
    total_ns = runs = 0
    base = f"{proc}/{pid}/fdinfo"
    try:
        names = os.listdir(base)
    except OSError:
        return 0, 0
    for name in names:
        try:
            with open(f"{base}/{name}") as f:
                text = f.read()
        except OSError:
            continue
        if "prog_id:" not in text:
            continue
        for line in text.splitlines():
            if line.startswith("run_time_ns:"):
                total_ns += int(line.split()[1])
            elif line.startswith("run_cnt:"):
                runs += int(line.split()[1])
    return total_ns, runs


@dataclass
class CpuSample:
    share: float        # (bpf + collector) CPU / wall, 1.0 = one CPU
    bpf_share: float
    collector_share: float
    ratio: float        # share of new connections followed, after this sample
    over_at_floor: bool  # over budget with the ratio already at its lowest

    def as_dict(self) -> dict:
        return {"cpu_share": round(self.share, 5), "bpf_cpu_share": round(self.bpf_share, 5),
                "collector_cpu_share": round(self.collector_share, 5),
                "follow_ratio": self.ratio, "over_budget_at_floor": self.over_at_floor}


@dataclass
class CpuBudget:
    max_share: float | None          # None: no budget, follow everything (cost still measured)
    ratio: float = 1.0
    samples: int = 0
    over_budget_samples: int = 0
    _stats_fd: int | None = None
    _last: tuple[int, int, int] = field(default=(0, 0, 0))  # wall, bpf, collector ns

    def start(self) -> bool:
        """Turns the kernel's statistics on; False when they stay off (cost then excludes BPF).

        BPF_ENABLE_STATS needs CAP_SYS_ADMIN; without it the statistics count
        only where the host already turned them on (sysctl kernel.bpf_stats_enabled=1)."""
        self._stats_fd = enable_bpf_stats()
        self._last = self._now()
        return self._stats_fd is not None or sysctl_stats_on()

    def _now(self) -> tuple[int, int, int]:
        return time.monotonic_ns(), bpf_run_time()[0], time.process_time_ns()

    def sample(self) -> CpuSample:
        """Cost since the last sample, and the ratio that follows from it."""
        wall, bpf, own = self._now()
        dt = max(1, wall - self._last[0])
        bpf_share = (bpf - self._last[1]) / dt
        own_share = (own - self._last[2]) / dt
        self._last = (wall, bpf, own)
        share = bpf_share + own_share
        self.samples += 1
        at_floor = False
        if self.max_share is not None:
            if share > self.max_share:
                self.over_budget_samples += 1
                at_floor = self.ratio <= MIN_RATIO
                self.ratio = max(MIN_RATIO, self.ratio * self.max_share / share * 0.9)
            elif share < RAISE_BELOW * self.max_share and self.ratio < 1.0:
                self.ratio = min(1.0, self.ratio * RAISE_FACTOR)
        return CpuSample(share, bpf_share, own_share, self.ratio, at_floor)

    def close(self) -> None:
        if self._stats_fd is not None:
            os.close(self._stats_fd)
            self._stats_fd = None


def parse_share(text: str) -> float:
    """'2%' or '0.02' -> 0.02 (of one CPU)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a CPU share like 2% or 0.02") from None
    if not 0 < value <= 64:
        raise ValueError(f"{text!r}: a CPU share is above 0 (100% is one CPU)")
    return value
