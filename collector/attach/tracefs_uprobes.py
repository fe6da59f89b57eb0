"""Uprobes made through tracefs, where perf_event_open() refuses them.

Since Linux 6.16 (commit ba677dbe77af, "perf: Revert to requiring
CAP_SYS_ADMIN for uprobes", also in the stable kernels of July 2025)
perf_event_open() refuses a uprobe to a process holding CAP_PERFMON only, as
the agent's DaemonSet does (docs/deploy.md). libbpf 1.1 creates uprobes that
way only. The older way still works with CAP_PERFMON: a line written to
tracefs' uprobe_events makes a trace event, which perf_event_open() opens as
a tracepoint, and a kprobe-type program attaches to it (libbpf's
attach_perf_event). bcc did the same; this is that fallback for libbpf.

Event names: the kernel refuses 64 characters or more ("Event name is too
long"), so a name is the file's base name cut to fit, a hash of its whole
path, the offset and the traced pid. They live in a group of the tracer's
own, inferprobe_uprobes_<its pid>. Each event is removed again when its
probe is detached; an agent killed with SIGKILL (an OOM kill) cannot, and
its lines stay in the kernel for good. So before its first event a tracer
removes the lines of tracers that are gone (remove_stale_events): the groups
of pids no longer running, its own pid's (a killed predecessor of the same
pid: pid 1 of a restarted container) and the old shared group
inferprobe_uprobes. The kernel refuses to remove an event a probe still
uses (EBUSY), so a live tracer's lines stay whatever is guessed about its
pid; a line that already exists (EEXIST) is removed the same way and the
write tried once more.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from inferprobe.collector.attach.perf_events import open_trace_event

GROUP = "inferprobe_uprobes"   # the old shared group, and the prefix of each tracer's: GROUP_<pid>
_OUR_GROUP = re.compile(rf"^{GROUP}(?:_(\d+))?$")
# The kernel's MAX_EVENT_NAME_LEN is 64, terminator included.
MAX_EVENT_NAME = 63
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def short_event_name(on_return: bool, path: str, offset: int, pid: int) -> str:
    """A trace event name for one probe, unique per (path, offset, pid, kind), under the kernel's limit."""
    prefix = "r" if on_return else "p"
    digest = hashlib.blake2b(os.fsencode(path), digest_size=4).hexdigest()
    tail = f"_{digest}_0x{offset:x}" + (f"_{pid}" if pid != -1 else "")
    room = MAX_EVENT_NAME - len(prefix) - 1 - len(tail)
    base = _NOT_NAME.sub("_", os.path.basename(path))[:max(room, 0)]
    return f"{prefix}_{base}{tail}"


def owner_group(pid: int | None = None) -> str:
    """The group of the events a tracer makes: its pid in it, so that the next one knows whose they are."""
    return f"{GROUP}_{os.getpid() if pid is None else pid}"


def tracefs_dir() -> Path:
    """The first tracefs mount with uprobe_events (a container may mount only one of the two)."""
    for directory in TRACEFS_DIRS:
        if (directory / "uprobe_events").exists():
            return directory
    raise OSError(errno.ENOENT, "no tracefs with uprobe_events is mounted (/sys/kernel/tracing)")


@dataclass
class TraceEventUprobe:
    """One uprobe's trace event and the perf event open on it."""

    tracefs: Path
    name: str
    perf_fd: int
    group: str

    def remove(self) -> None:
        """After the perf event is closed (its link destroyed): the event goes too."""
        _write_line(self.tracefs, f"-:{self.group}/{self.name}")


def _write_line(tracefs: Path, line: str) -> None:
    # O_APPEND: a plain write would clear every other tracer's uprobe events.
    fd = os.open(tracefs / "uprobe_events", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _running(pid: int) -> bool:
    """pid is a process that still holds its files (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


_swept = False   # remove_stale_events() ran in this process


def remove_stale_events(tracefs: Path | None = None) -> list[str]:
    """Removes the uprobe events that tracers gone without detaching left in tracefs
    (the module's docstring says which); returns them as group/name. Nothing where
    tracefs is missing or read-only."""
    global _swept
    _swept = True
    try:
        tracefs = tracefs or tracefs_dir()
        lines = (tracefs / "uprobe_events").read_text().splitlines()
    except OSError:
        return []
    removed = []
    for line in lines:
        spec = line.split(maxsplit=1)[0] if line.strip() else ""   # p:group/name path:offset
        group, _, name = spec.partition(":")[2].partition("/")
        owner = _OUR_GROUP.match(group)
        if owner is None or not name:
            continue
        if owner[1] is not None and int(owner[1]) != os.getpid() and _running(int(owner[1])):
            continue
        try:
            _write_line(tracefs, f"-:{group}/{name}")
        except OSError:   # EBUSY: a probe uses it (a live tracer's); ENOENT: removed meanwhile
            continue
        removed.append(f"{group}/{name}")
    return removed


def open_uprobe(path: str, offset: int, pid: int, on_return: bool) -> TraceEventUprobe:
    """Makes the trace event for a uprobe at offset of path and opens it in pid.
    Raises OSError with what the kernel answered."""
    tracefs = tracefs_dir()
    if not _swept:   # before this process's first event: its own pid's group is a predecessor's
        remove_stale_events(tracefs)
    group = owner_group()
    name = short_event_name(on_return, path, offset, pid)
    line = f"{'r' if on_return else 'p'}:{group}/{name} {path}:0x{offset:x}"
    for attempt in range(2):
        try:
            _write_line(tracefs, line)
            break
        except OSError as err:
            if err.errno != errno.EEXIST or attempt:
                raise OSError(err.errno,
                              f"tracefs refused the uprobe {line!r} ({err.strerror})") from None
            try:   # left by a killed tracer of the same pid: refused while a probe uses it
                _write_line(tracefs, f"-:{group}/{name}")
            except OSError:
                raise OSError(errno.EEXIST,
                              f"the uprobe event {group}/{name} is in use by another tracer") from None
    try:
        event_id = int((tracefs / "events" / group / name / "id").read_text())
        perf_fd = open_trace_event(event_id, pid)
    except OSError:
        _write_line(tracefs, f"-:{group}/{name}")
        raise
    return TraceEventUprobe(tracefs, name, perf_fd, group)
