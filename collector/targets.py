"""Which processes to trace: the given pids, their descendants, their sockets.

Reads /proc only; the kernel side follows forks from then on.
"""

from __future__ import annotations

import os
from pathlib import Path

from inferprobe.collector.errors import TargetProblem

PROC = Path("/proc")


def check_alive(pid: int) -> None:
    if pid <= 0:
        raise TargetProblem(f"{pid} is not a valid pid")
    if not (PROC / str(pid)).is_dir():
        raise TargetProblem(f"no process with pid {pid} (has it exited?)")
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        raise TargetProblem(f"no process with pid {pid} (has it exited?)") from None
    for line in status.splitlines():
        if line.startswith("Tgid:") and int(line.split()[1]) != pid:
            raise TargetProblem(
                f"{pid} is a thread of process {line.split()[1]}: pass the process id"
            )


def _parent_of(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def with_descendants(pids: list[int]) -> list[int]:
    """The pids and every process below them, as of now."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            parent = _parent_of(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def socket_fds(pid: int) -> list[int]:
    """File descriptors of pid that are sockets (already open at start)."""
    fds = []
    try:
        entries = list((PROC / str(pid) / "fd").iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            if os.readlink(entry).startswith("socket:"):
                fds.append(int(entry.name))
        except OSError:
            continue
    return sorted(fds)


def process_name(pid: int) -> str:
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def alive(pid: int) -> bool:
    return (PROC / str(pid)).is_dir()
