"""Reads the CUPTI shim's dump file (INFERPROBE_CUPTI_DUMP) into the records a recording would hold.

The dump is for GPU hosts without BPF tooling (benchmarks/gpu_check.py):
the shim writes each probe's arguments as one line, and this turns the lines
into the same GpuApiRecord, GpuActivityRecord, ... that bpf/gpu.bpf.c's
events decode to, so analyzers/gpu_execution.py reads either alike. The
api line carries the calling thread's tid and CLOCK_MONOTONIC, which BPF
would otherwise stamp. A recording never needs this file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from inferprobe.collector.model.events import (
    EventType,
    GpuActivityKind,
    GpuActivityRecord,
    GpuApiRecord,
    GpuClockRecord,
    GpuKernelNameRecord,
    GpuShimRecord,
    GpuShimStatus,
    GpuShimStatusRecord,
)


def parse_lines(lines: Iterable[str], pid: int) -> list[GpuShimRecord]:
    """pid: the process that wrote them (the dump does not repeat it). Unknown or cut lines (a process
    killed mid-write) are skipped."""
    out: list[GpuShimRecord] = []
    for line in lines:
        kind, _, rest = line.rstrip("\n").partition(" ")
        try:
            if kind == "api":
                corr, cbid, domain, tid, ts = map(int, rest.split())
                out.append(GpuApiRecord(EventType.GPU_API, pid, tid, ts, corr, cbid, domain))
            elif kind == "activity":
                k, start, end, corr, device, stream, shape, name_id = map(int, rest.split())
                out.append(GpuActivityRecord(EventType.GPU_ACTIVITY, pid, 0, 0, GpuActivityKind(k), start,
                                             end, corr, device, stream, shape, name_id))
            elif kind == "clock":
                cupti, before, after = map(int, rest.split())
                out.append(GpuClockRecord(EventType.GPU_CLOCK, pid, 0, before, cupti, before, after))
            elif kind == "name":
                number, _, name = rest.partition(" ")
                out.append(GpuKernelNameRecord(EventType.GPU_KERNEL_NAME, pid, 0, 0, int(number), name))
            elif kind == "status":
                code, result, text = rest.split(" ", 2)
                out.append(GpuShimStatusRecord(EventType.GPU_SHIM_STATUS, pid, 0, 0, GpuShimStatus(int(code)),
                                               int(result), text))
        except ValueError:
            continue
    return out


def read_dump(path: Path, pid: int) -> list[GpuShimRecord]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_lines(f, pid)
