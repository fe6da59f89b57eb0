"""Which processes to trace: the given pids, their descendants, their sockets.

Reads /proc only; the kernel side follows forks from then on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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


def _sockets(pid: int) -> dict[int, int]:
    """fd -> socket inode for every socket pid holds open: the one reader of /proc/PID/fd's
    socket links (host-wide discovery walks every process's with it)."""
    found: dict[int, int] = {}
    try:
        entries = os.scandir(PROC / str(pid) / "fd")
    except OSError:
        return found
    with entries:
        for entry in entries:
            try:
                link = os.readlink(entry.path)
            except OSError:
                continue   # closed meanwhile
            if link.startswith("socket:["):
                found[int(entry.name)] = int(link[8:-1])
    return found


def socket_inodes(pid: int) -> dict[int, int]:
    """fd -> socket inode for every socket pid holds open now."""
    return _sockets(pid)


def socket_fds(pid: int) -> list[int]:
    """File descriptors of pid that are sockets (already open at start)."""
    return sorted(_sockets(pid))


def connected_socket_fds(pid: int) -> set[int]:
    """The fds among socket_fds(pid) that are TCP connections pid opened itself:
    established, and on a local port pid does not listen on (an accepted
    connection shares its listener's port). Seeded as client connections."""
    inodes = {inode: fd for fd, inode in _sockets(pid).items()}
    if not inodes:
        return set()
    listening: set[str] = set()
    established: dict[int, str] = {}
    for _name, fields in tcp_rows(pid):
        port = fields[1].rsplit(":", 1)[1]
        if fields[3] == "0A":
            listening.add(port)
        elif fields[3] == "01" and int(fields[9]) in inodes:
            established[int(fields[9])] = port
    return {inodes[inode] for inode, port in established.items() if port not in listening}


def unix_socket_fds(pid: int) -> set[int]:
    """The fds among socket_fds(pid) that are Unix-domain sockets."""
    inodes = {inode: fd for fd, inode in _sockets(pid).items()}
    return {inodes[int(fields[6])] for fields in unix_rows(pid) if int(fields[6]) in inodes}


def tcp_connection_fds(pid: int) -> set[int]:
    """The fds among socket_fds(pid) that are TCP connections (any state but listening)."""
    inodes = {inode: fd for fd, inode in _sockets(pid).items()}
    return {inodes[int(fields[9])] for _name, fields in tcp_rows(pid)
            if fields[3] != "0A" and int(fields[9]) in inodes}


def unix_rows(pid: int) -> Iterator[list[str]]:
    """The fields of each Unix socket of pid's network namespace: Num RefCount Protocol
    Flags Type St Inode [Path] (Flags 0x10000: listening; Type 0001: stream)."""
    try:
        lines = (PROC / str(pid) / "net" / "unix").read_text().splitlines()[1:]
    except OSError:
        return
    for line in lines:
        if len(fields := line.split()) >= 7:
            yield fields


def tcp_rows(pid: int) -> Iterator[tuple[str, list[str]]]:
    """("tcp" or "tcp6", fields) for each socket row of pid's network namespace
    (fields: sl local remote state ... uid timeout inode)."""
    for name in ("tcp", "tcp6"):
        try:
            lines = (PROC / str(pid) / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9:
                yield name, fields


# x86-64 syscall numbers of the reads sock.bpf.c traces: read, readv, recvfrom, recvmsg.
READ_SYSCALLS_X86_64 = frozenset({0, 19, 45, 47})


def threads_blocked_in_reads(pid: int) -> dict[int, int]:
    """tid -> fd for each thread of pid sitting in a read-family syscall now
    (x86-64 numbers, as /proc/<pid>/task/<tid>/syscall shows a blocked
    thread's syscall and its arguments in hex; a running one shows "running")."""
    blocked: dict[int, int] = {}
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return blocked
    for task in tasks:
        try:
            fields = (task / "syscall").read_text().split()
        except OSError:
            continue   # exited meanwhile, or not ours to read
        if len(fields) >= 2 and fields[0].isdigit() and int(fields[0]) in READ_SYSCALLS_X86_64:
            blocked[int(task.name)] = int(fields[1], 16)
    return blocked


def process_name(pid: int) -> str:
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def alive(pid: int) -> bool:
    return (PROC / str(pid)).is_dir()


def _listeners(pid: int) -> dict[int, str]:
    """socket inode -> "tcp 127.0.0.1:8000" / "unix /path" for each listening TCP or Unix
    stream socket pid holds, read from /proc/<pid>/net so that a server in another network
    namespace (a container) is seen in its own namespace."""
    inodes = set(_sockets(pid).values())
    if not inodes:
        return {}
    found: dict[int, str] = {}
    for name, fields in tcp_rows(pid):
        if fields[3] == "0A" and int(fields[9]) in inodes:
            found[int(fields[9])] = f"{name} {_hex_address(fields[1])}"
    for fields in unix_rows(pid):
        if is_unix_listener(fields) and int(fields[6]) in inodes:
            found[int(fields[6])] = f"unix {fields[7] if len(fields) > 7 else '(unnamed)'}"
    return found


def is_unix_listener(fields: list[str]) -> bool:
    """A unix_rows() row of a listening stream socket."""
    return fields[4] == "0001" and bool(int(fields[3], 16) & 0x10000)


def listening_sockets(pids: list[int]) -> list[str]:
    """Listening TCP and Unix stream sockets held by pids, e.g. ["tcp 127.0.0.1:8000"]."""
    return sorted({label for pid in pids for label in _listeners(pid).values()})


ANCESTOR_NAMES = {1: "parent", 2: "grandparent"}


def _ancestors(pid: int) -> Iterator[tuple[int, str]]:
    """(ancestor pid, relation) from the parent up, init and kernel threads left out."""
    ancestor, depth = _parent_of(pid), 1
    while ancestor and ancestor > 1 and depth <= 8:
        yield ancestor, ANCESTOR_NAMES.get(depth, "ancestor")
        ancestor, depth = _parent_of(ancestor), depth + 1


def listening_ancestor(pids: list[int]) -> tuple[int, str] | None:
    """The nearest ancestor of the pids that listens, and how it is related
    ("parent", "grandparent", "ancestor"): where a user who gave a worker or a
    wrapper's pid should have pointed. None when none listens."""
    for pid in pids:
        for ancestor, relation in _ancestors(pid):
            if ancestor in pids:
                continue  # a target's own parent is no other process to point at
            if _listeners(ancestor):
                return ancestor, relation
    return None


def _is_local_listener(label: str) -> bool:
    """A Unix socket or a loopback TCP one: reachable from this host only, as an IPC is."""
    if label.startswith("unix "):
        return True
    address = label.split(" ", 1)[1].rsplit(":", 1)[0].strip("[]")
    return address.startswith("127.") or address == "::1"


def serving_parent(pids: list[int]) -> tuple[int, list[str]] | None:
    """The direct parent (not itself a target) that listens on TCP, for targets that
    listen only where this host alone reaches (Unix sockets, loopback): an engine's
    child listening for its parent's IPC, as vLLM 0.32's spawned EngineCore does (ZMQ
    on Unix sockets, torch.distributed on loopback ports). Only the parent: further up
    are shells, sshd and terminals, which listen for other reasons. Returns the parent
    and its TCP listeners, or None."""
    if not all(_is_local_listener(label) for label in listening_sockets(pids)):
        return None
    for pid in pids:
        parent = _parent_of(pid)
        if not parent or parent <= 1 or parent in pids:
            continue
        tcp = sorted(label for label in _listeners(parent).values() if label.startswith("tcp"))
        if tcp:
            return parent, tcp
    return None


def sharing_ancestor(pids: list[int]) -> tuple[int, str] | None:
    """The nearest ancestor that holds the very listening sockets the pids hold, when
    every one they hold is also its: a child forked after its parent listened keeps
    the socket open without serving it (vLLM's EngineCore and its workers, most
    multiprocessing children); a pre-fork server's workers do serve it, so this is
    only a hint, for a target that accepted nothing. None otherwise."""
    held = {inode for pid in pids for inode in _listeners(pid)}
    if not held:
        return None
    for pid in pids:
        for ancestor, relation in _ancestors(pid):
            if ancestor in pids:
                continue  # a server recorded with its children holds its own listener
            if held <= set(_sockets(ancestor).values()):
                return ancestor, relation
    return None


def serving_ancestor(pids: list[int]) -> dict | None:
    """The ancestor that serves where the targets may not: one that listens while they do not,
    one that holds the very listening sockets they only inherited ("shared"), or the parent
    that listens on TCP while they listen only locally ("listens_too": an engine's parent,
    as vLLM's API server is EngineCore's, whose own listeners are ZMQ and torch.distributed
    IPC on Unix sockets and loopback ports). A recording keeps it as "listening_ancestor"."""
    if not listening_sockets(pids):
        found = listening_ancestor(pids)
        return None if found is None else {"pid": found[0], "relation": found[1]}
    shared = sharing_ancestor(pids)
    if shared is not None:
        return {"pid": shared[0], "relation": shared[1], "shared": True}
    parent = serving_parent(pids)
    if parent is None:
        return None
    return {"pid": parent[0], "relation": "parent", "listens_too": True, "its_listening": parent[1]}


def _hex_address(field: str) -> str:
    import ipaddress
    import socket as socket_module

    addr_hex, port_hex = field.split(":")
    raw = bytes.fromhex(addr_hex)
    if len(raw) == 4:
        addr = socket_module.inet_ntop(socket_module.AF_INET, raw[::-1])
    else:
        # /proc prints IPv6 as four host-order 32-bit words
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
        addr = str(ipaddress.IPv6Address(b"".join(words)))
    return f"{addr}:{int(port_hex, 16)}"
