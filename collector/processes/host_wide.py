"""Host-wide recording (`record --all`, `agent`): which processes serve, from /proc.

The kernel adopts a process the moment it listens or accepts
(bpf/host_wide.bpf.c). This module finds the ones already listening when
tracing starts, applies the same filters (--port, --comm, --cgroup) in user
space, and turns a --cgroup path into what the kernel compares: the cgroup
v2 id (the directory's inode number) and its depth.

A scan must stay cheap on a host with thousands of idle processes: the
listening sockets are read once per network namespace, and a process's file
descriptors are walked only when a listening socket appears that no earlier
scan attributed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from inferprobe.collector.errors import TargetProblem
from inferprobe.collector.processes import targets as target_procs
from inferprobe.collector.processes.containers import parse_proc_cgroup

PROC = Path("/proc")
MAX_PORTS = 16   # HOST_WIDE_MAX_PORTS in bpf/host_wide.bpf.c
COMM_LEN = 16    # the kernel's TASK_COMM_LEN, terminator included


@dataclass(frozen=True)
class CgroupFilter:
    path: str    # relative to the cgroup2 root, "/" first
    id: int      # the cgroup v2 id: its directory's inode number
    level: int   # its depth: 0 is the root


@dataclass(frozen=True)
class Filters:
    ports: tuple[int, ...] = ()
    comm: str | None = None
    cgroup: CgroupFilter | None = None

    def as_dict(self) -> dict:
        return {"ports": list(self.ports), "comm": self.comm,
                "cgroup": self.cgroup.path if self.cgroup else None}


def cgroup2_root(mountinfo: Path = PROC / "self/mountinfo") -> Path | None:
    """Where cgroup v2 is mounted (/sys/fs/cgroup, or .../unified on a hybrid host)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def resolve_cgroup(path: str, root: Path | None = None) -> CgroupFilter:
    """A --cgroup value (relative to the cgroup2 root, or a path under its mount).

    In a container the cgroup2 mount is usually the container's own subtree
    (a cgroup namespace): INFERPROBE_CGROUP_ROOT names a mount of the host's
    whole tree instead (the DaemonSet mounts it at /host/sys/fs/cgroup), so
    that the depth compared in the kernel counts from the real root."""
    env_root = os.environ.get("INFERPROBE_CGROUP_ROOT")
    root = root or (Path(env_root) if env_root else cgroup2_root())
    if root is None:
        raise TargetProblem("--cgroup needs cgroup v2, and no cgroup2 file system is mounted on this host")
    given = Path(path)
    relative = given.relative_to(root) if given.is_relative_to(root) else Path(path.lstrip("/"))
    directory = root / relative
    try:
        ino = directory.stat().st_ino
    except OSError:
        raise TargetProblem(f"no cgroup {path} under the cgroup2 mount {root}") from None
    if not directory.is_dir():
        raise TargetProblem(f"--cgroup {path} is not a cgroup directory under {root}")
    parts = [p for p in relative.parts if p not in ("", ".")]
    return CgroupFilter(path="/" + "/".join(parts), id=ino, level=len(parts))


def make_filters(ports: tuple[int, ...], comm: str | None, cgroup: str | None) -> Filters:
    if len(ports) > MAX_PORTS:
        raise TargetProblem(f"at most {MAX_PORTS} --port values (the kernel filter's size), got {len(ports)}")
    if comm is not None and (not comm or len(comm.encode()) >= COMM_LEN):
        raise TargetProblem(f"--comm {comm!r}: a process name is 1 to {COMM_LEN - 1} bytes "
                            "(the kernel's comm)")
    return Filters(ports=tuple(dict.fromkeys(ports)), comm=comm,
                   cgroup=resolve_cgroup(cgroup) if cgroup else None)


def process_cgroup(pid: int) -> str | None:
    """The process's cgroup v2 path ("0::" line of /proc/<pid>/cgroup, as containers.py parses it)."""
    try:
        return parse_proc_cgroup((PROC / str(pid) / "cgroup").read_text())[0]
    except OSError:
        return None


def _comm(pid: int) -> str | None:
    try:
        return (PROC / str(pid) / "comm").read_text().rstrip("\n")
    except OSError:
        return None


def passes(filters: Filters, pid: int, port: int) -> bool:
    """The user-space twin of host_wide_passes() in bpf/host_wide.bpf.c."""
    if filters.ports and port not in filters.ports:
        return False
    if filters.comm is not None and _comm(pid) != filters.comm:
        return False
    if filters.cgroup is not None:
        path = process_cgroup(pid)
        if path is None:
            return False
        inside = filters.cgroup.path.rstrip("/") or ""
        if not (path == filters.cgroup.path or path.startswith(inside + "/")):
            return False
    return True


def _listening_inodes(pid: int) -> dict[int, int]:
    """Listening socket inode -> local port (0 for Unix) in pid's network namespace."""
    found: dict[int, int] = {}
    for _name, fields in target_procs.tcp_rows(pid):
        if len(fields) > 9 and fields[3] == "0A":
            found[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    for fields in target_procs.unix_rows(pid):
        if target_procs.is_unix_listener(fields):
            found[int(fields[6])] = 0
    return found


def own_host_pid() -> int:
    """This process's pid as /proc (and so the kernel's pid_tgid, with a host /proc) names it:
    inside a pid namespace that keeps the host's /proc mounted, os.getpid() is the
    namespace's number, not the one the BPF programs see."""
    try:
        return int(os.readlink(PROC / "self"))
    except (OSError, ValueError):
        return os.getpid()


def in_host_pid_namespace() -> bool:
    """Whether this process shares the pid namespace of the /proc it reads (a hostPID pod does).

    perf_event_open() takes a pid in the caller's own namespace, so per-process
    uprobes (USDT probes, TLS libraries) of host pids cannot be attached from
    another one, even with the host's /proc mounted; tracepoints do not care."""
    # /proc/self names this process by the pid the /proc's namespace gives it; os.getpid() by ours.
    return own_host_pid() == os.getpid()


@dataclass
class ListenerScan:
    """Finds the processes holding listening stream sockets, scan after scan."""

    self_pid: int = field(default_factory=own_host_pid)
    owners: dict[int, set[int]] = field(default_factory=dict)   # listening inode -> pids holding it
    ports: dict[int, int] = field(default_factory=dict)          # listening inode -> port
    netns: dict[int, str] = field(default_factory=dict)          # pid -> its network namespace
    scans: int = 0
    fd_walks: int = 0

    def scan(self) -> dict[int, set[int]]:
        """pid -> the local ports it listens on (0: a Unix socket), for every process now."""
        self.scans += 1
        by_netns: dict[str, list[int]] = {}
        alive: dict[int, str] = {}
        for entry in os.scandir(PROC):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            netns = self.netns.get(pid)
            if netns is None:   # a process seen before keeps its namespace (setns() is rare)
                try:
                    netns = os.readlink(f"{entry.path}/ns/net")
                except OSError:
                    continue   # exited, or a kernel thread
            alive[pid] = netns
            by_netns.setdefault(netns, []).append(pid)
        self.netns = alive
        listening: dict[int, int] = {}
        unattributed: list[int] = []
        for pids in by_netns.values():
            here = {}
            for pid in pids:   # the first pid whose /proc/<pid>/net is readable speaks for the namespace
                here = _listening_inodes(pid)
                if here or (PROC / str(pid) / "net" / "tcp").exists():
                    break
            listening.update(here)
            if any(inode not in self.owners for inode in here):
                unattributed.extend(pids)
        for inode in [i for i in self.owners if i not in listening]:
            del self.owners[inode]
        if unattributed:
            self.fd_walks += 1
            new = {inode for inode in listening if inode not in self.owners}
            for inode in new:
                self.owners[inode] = set()
            for pid in unattributed:
                for inode in set(target_procs.socket_inodes(pid).values()) & new:
                    self.owners[inode].add(pid)
        self.ports = {inode: listening[inode] for inode in self.owners}
        serving: dict[int, set[int]] = {}
        for inode, holders in self.owners.items():
            for pid in holders:
                if pid != self.self_pid:
                    serving.setdefault(pid, set()).add(self.ports[inode])
        return serving


def matching_listeners(filters: Filters, serving: dict[int, set[int]]) -> list[int]:
    """The pids of serving whose listeners pass the filters."""
    return sorted(pid for pid, ports in serving.items() if any(passes(filters, pid, p) for p in ports))

