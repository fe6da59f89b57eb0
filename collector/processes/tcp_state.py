"""Socket options and tcp_info of the targets' TCP connections, read from user space.

Two sources, both asked about the target's own sockets without touching the
target:

- TCP_NODELAY and TCP_CORK: a duplicate of the target's fd (pidfd_open +
  pidfd_getfd, Linux 5.6+, needs ptrace rights over the target) and
  getsockopt() on it. The duplicate is closed at once; the target's socket is
  not changed. When the duplicate cannot be made the options are None and the
  reason is kept.
- tcp_info and socket memory: the kernel's socket diagnostics (inet_diag over
  netlink, through pyroute2's DiagSocket), the interface `ss -ti` uses. A
  socket belongs to one network namespace and diagnostics answer only for
  their own, so the query runs in each target's namespace (setns() in a
  short-lived thread: setns changes only the calling thread).

Sockets are matched by inode: /proc/PID/fd names it and inet_diag reports it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading
import time

from inferprobe.collector.processes import targets as target_procs

SYS_PIDFD_OPEN = 434
SYS_PIDFD_GETFD = 438
CLONE_NEWNET = 0x40000000
TCP_CORK = 3
INET_DIAG_INFO = 2
INET_DIAG_SKMEMINFO = 7
SS_ESTABLISHED = 1  # TCP_ESTABLISHED; diagnostics take a bit mask of states
DIAG_STATES = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 8)  # ESTABLISHED, FIN_WAIT1/2, CLOSE_WAIT
TCPI_OPT_TIMESTAMPS = 1

# The tcp_info fields reported, under the names `ss -ti` prints where it has one.
TCP_INFO_FIELDS = {
    "rtt_us": "tcpi_rtt",
    "rttvar_us": "tcpi_rttvar",
    "min_rtt_us": "tcpi_min_rtt",
    "cwnd": "tcpi_snd_cwnd",
    "ssthresh": "tcpi_snd_ssthresh",
    "mss": "tcpi_snd_mss",
    "unacked": "tcpi_unacked",
    "notsent_bytes": "tcpi_notsent_bytes",
    "retrans_total": "tcpi_total_retrans",
    "bytes_sent": "tcpi_bytes_sent",
    "bytes_acked": "tcpi_bytes_acked",
    "bytes_retrans": "tcpi_bytes_retrans",
    "segs_out": "tcpi_segs_out",
    "data_segs_out": "tcpi_data_segs_out",
    "delivery_rate_Bps": "tcpi_delivery_rate",
    "rwnd_limited_us": "tcpi_rwnd_limited",
    "sndbuf_limited_us": "tcpi_sndbuf_limited",
    "busy_us": "tcpi_busy_time",
    "peer_window": "tcpi_snd_wnd",
    "options": "tcpi_options",
}
# sk_meminfo indexes (linux/sock_diag.h SK_MEMINFO_*), `ss -m` prints them as skmem:(r,rb,t,tb,f,w,...)
SKMEM_SNDBUF = 3
SKMEM_WMEM_QUEUED = 5

_libc = ctypes.CDLL(None, use_errno=True)


class SockoptReader:
    """TCP_NODELAY/TCP_CORK of another process's socket fd."""

    def __init__(self) -> None:
        self._pidfds: dict[int, int] = {}

    def _pidfd(self, pid: int) -> int:
        if pid not in self._pidfds:
            fd = _libc.syscall(SYS_PIDFD_OPEN, pid, 0)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "pidfd_open")
            self._pidfds[pid] = fd
        return self._pidfds[pid]

    def read(self, pid: int, fd: int) -> tuple[bool | None, bool | None, str | None]:
        """(nodelay, cork, why not) for fd of pid."""
        try:
            dup = _libc.syscall(SYS_PIDFD_GETFD, self._pidfd(pid), fd, 0)
            if dup < 0:
                raise OSError(ctypes.get_errno(), "pidfd_getfd")
        except OSError as err:
            return None, None, _why(err)
        sock = socket.socket(fileno=dup)
        try:
            nodelay = bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            cork = bool(sock.getsockopt(socket.IPPROTO_TCP, TCP_CORK))
        except OSError as err:
            return None, None, f"getsockopt failed: {err.strerror}"
        finally:
            sock.close()  # our duplicate only
        return nodelay, cork, None

    def close(self) -> None:
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()


def _why(err: OSError) -> str:
    if err.errno == errno.ENOSYS:
        return "the kernel has no pidfd_getfd (Linux 5.6+ needed)"
    if err.errno == errno.EPERM:
        return "no ptrace rights over the target (pidfd_getfd: EPERM; run as root, check Yama ptrace_scope)"
    if err.errno in (errno.EBADF, errno.ESRCH):
        return "the socket or the process was gone when sampled"
    return f"{err.args[-1] if err.args else 'pidfd'}: {os.strerror(err.errno or 0)}"


def _decode_skmem(raw: str | None) -> list[int]:
    if not raw:
        return []
    data = bytes.fromhex(raw.replace(":", ""))
    return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data) - 3, 4)]


def _diag_entries() -> dict[int, dict]:
    """inode -> tcp_info figures for every TCP socket of the current thread's namespace."""
    from pyroute2 import DiagSocket

    found: dict[int, dict] = {}
    ext = (1 << (INET_DIAG_INFO - 1)) | (1 << (INET_DIAG_SKMEMINFO - 1))
    with DiagSocket() as diag:
        diag.bind()
        for family in (socket.AF_INET, socket.AF_INET6):
            for msg in diag.get_sock_stats(family=family, states=DIAG_STATES, extensions=ext):
                info = msg.get_attr("INET_DIAG_INFO")
                if info is None:
                    continue
                entry = {name: info.get(field) for name, field in TCP_INFO_FIELDS.items()}
                skmem = _decode_skmem(msg.get_attr("INET_DIAG_SKMEMINFO"))
                entry["snd_buf"] = skmem[SKMEM_SNDBUF] if len(skmem) > SKMEM_SNDBUF else None
                entry["wmem_queued"] = skmem[SKMEM_WMEM_QUEUED] if len(skmem) > SKMEM_WMEM_QUEUED else None
                entry["state"] = info.get("tcpi_state")
                entry["local"] = f"{msg['idiag_src']}:{msg['idiag_sport']}"
                entry["peer"] = f"{msg['idiag_dst']}:{msg['idiag_dport']}"
                found[msg["idiag_inode"]] = entry
    return found


def in_netns(ns_path: str, fn):
    """Runs fn() in the network namespace at ns_path, in a thread of its own."""
    box: dict = {}

    def run() -> None:
        try:
            ns_fd = os.open(ns_path, os.O_RDONLY)
            try:
                if _libc.setns(ns_fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {ns_path}")
            finally:
                os.close(ns_fd)
            box["value"] = fn()
        except Exception as err:  # handed to the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, name="inferprobe-netns", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def diag_by_inode(pids: list[int]) -> dict[int, dict]:
    """tcp_info figures, by socket inode, across the namespaces of pids."""
    own = os.stat("/proc/self/ns/net").st_ino
    spaces: dict[int, str] = {}
    for pid in pids:
        path = f"/proc/{pid}/ns/net"
        try:
            spaces.setdefault(os.stat(path).st_ino, path)
        except OSError:
            continue
    found: dict[int, dict] = {}
    for ino, path in spaces.items():
        found.update(_diag_entries() if ino == own else in_netns(path, _diag_entries))
    return found


class TcpStateSampler:
    """Samples the targets' TCP connections: options and tcp_info, one dict each."""

    def __init__(self) -> None:
        self.sockopts = SockoptReader()
        self.samples: list[dict] = []
        self.errors: list[str] = []

    def sample(self, pids: list[int]) -> int:
        """Appends one sample per established TCP connection of pids; returns how many."""
        now = time.monotonic_ns()
        try:
            diag = diag_by_inode(pids)
        except Exception as err:  # netlink or setns: keep recording, say why once
            message = f"socket diagnostics failed: {err}"
            if message not in self.errors:
                self.errors.append(message)
            return 0
        added = 0
        for pid in pids:
            for fd, inode in target_procs.socket_inodes(pid).items():
                entry = diag.get(inode)
                if entry is None or entry["state"] != SS_ESTABLISHED:
                    continue  # listening, Unix or not TCP
                nodelay, cork, why = self.sockopts.read(pid, fd)
                self.samples.append({
                    "t_ns": now, "pid": pid, "fd": fd, "inode": inode,
                    "nodelay": nodelay, "cork": cork, "sockopt_unreadable": why,
                    "tcp_info": {k: v for k, v in entry.items() if k != "state"},
                })
                added += 1
        return added

    def close(self) -> None:
        self.sockopts.close()
