"""perf_event_open(2): one software cpu-clock event per CPU for the sampling
programs, and a tracefs event (a uprobe made through uprobe_events) per process.

Python's standard library has no perf_event_open, and the one call needs no
library beyond libc: the attribute struct is written here (its first fields,
with the size the kernel is told, PERF_ATTR_SIZE_VER5).
"""

from __future__ import annotations

import ctypes
import os
import platform

PERF_TYPE_TRACEPOINT = 2
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_CPU_CLOCK = 0
PERF_FLAG_FD_CLOEXEC = 8
PERF_ATTR_SIZE_VER5 = 112
_SYSCALL_NR = {"x86_64": 298, "aarch64": 241}


class _PerfEventAttr(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),   # bitfield: disabled, inherit, ..., freq (bit 10)
        ("rest", ctypes.c_uint8 * (PERF_ATTR_SIZE_VER5 - 48)),
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def online_cpus() -> list[int]:
    """The CPUs to sample on (/sys/devices/system/cpu/online, e.g. "0-3,6")."""
    try:
        text = open("/sys/devices/system/cpu/online").read().strip()
    except OSError:
        return list(range(os.cpu_count() or 1))
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _perf_event_open(attr: _PerfEventAttr, pid: int, cpu: int, what: str) -> int:
    number = _SYSCALL_NR.get(platform.machine())
    if number is None:
        raise OSError(f"perf_event_open: no syscall number known for {platform.machine()}")
    fd = _libc.syscall(number, ctypes.byref(attr), pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"perf_event_open({what}): {os.strerror(code)}")
    return fd


def open_trace_event(event_id: int, pid: int) -> int:
    """The tracefs event with this id (events/<group>/<name>/id), in process pid
    only, every hit: a BPF program attaches to it (attach_perf_event)."""
    attr = _PerfEventAttr(type=PERF_TYPE_TRACEPOINT, size=PERF_ATTR_SIZE_VER5, config=event_id,
                          sample_period=1)
    return _perf_event_open(attr, pid, -1 if pid >= 0 else 0, f"trace event {event_id}, pid {pid}")


def open_cpu_clock(cpu: int, period_ns: int) -> int:
    """A cpu-clock event on cpu that overflows every period_ns of CPU time, for all
    processes (the program filters by target). Software, not cycles: VMs and
    containers often have no PMU. A fixed period rather than a frequency: the
    kernel's frequency mode re-tunes the period as it goes, which skews short runs."""
    attr = _PerfEventAttr(type=PERF_TYPE_SOFTWARE, size=PERF_ATTR_SIZE_VER5, config=PERF_COUNT_SW_CPU_CLOCK,
                          sample_period=period_ns)
    return _perf_event_open(attr, -1, cpu, f"cpu-clock, cpu {cpu}")
