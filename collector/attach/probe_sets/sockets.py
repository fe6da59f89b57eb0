"""The socket probe set (bpf/sock.bpf.c): HTTP request boundaries from syscalls."""

from __future__ import annotations

import ctypes
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from inferprobe.collector.attach.preflight import BTF_VMLINUX
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.model.layout_generated import LocalIpc
from inferprobe.collector.processes import targets as target_procs
from inferprobe.collector.processes.unix_peers import self_paired_fds

# The tail-call chain of sock.bpf.c, in enum classify_prog order.
CLASSIFIER_PROGRAMS = [
    "classify_request",
    "classify_response",
    "scan_header_block",
    "scan_body",
    "gather_iovecs",
    "gather_window",
    "scan_fields",
    "scan_trace_context",
    "h2_frames",
]


class SocketProbes(ProbeSet):
    name = "sockets"
    source = "sock.bpf.c"
    description = "HTTP/1.x requests, responses and SSE token writes from socket syscalls"
    state_maps: tuple[str, ...] = ("socks", "pending", "pending_accept", "pending_connect", "connecting",
                                    "peer_wanted")

    def __init__(self) -> None:
        self.preexisting_sockets = 0
        self.pending_in_task_storage = False

    def prepare(self, ctx: TargetContext) -> str | None:
        choice = (ctx.options.get("sockets") or {}).get("pending", "auto")
        self.pending_in_task_storage = choice == "task" or (choice == "auto" and task_storage_usable())
        if self.pending_in_task_storage:
            # Freed with each thread by the kernel, and not listable: nothing to watch.
            self.state_maps = ("socks", "pending_accept", "pending_connect", "connecting", "peer_wanted")
        return None

    def cflags(self) -> list[str]:
        if not self.pending_in_task_storage:
            return []
        # Rebuilding a syscall already under way at attach reads the thread's
        # saved registers with bpf_task_pt_regs(): Linux 5.15+.
        return ["-DPENDING_IN_TASK_STORAGE"] + (["-DHAVE_TASK_PT_REGS"] if task_pt_regs_usable() else [])

    def after_load(self, bpf, ctx: TargetContext) -> None:
        import bcc

        # The kernel verifies each program as it loads: most of start-up, and
        # CPU-bound in the bpf() call, which ctypes makes without the GIL, so
        # the programs load on every core at once (2.0 s -> 1.2 s on 2 cores).
        prog_array = bpf[b"classifiers"]
        with ThreadPoolExecutor(max_workers=min(len(CLASSIFIER_PROGRAMS), os.cpu_count() or 1)) as pool:
            loaded = list(pool.map(lambda name: bpf.load_func(name.encode(), bcc.BPF.TRACEPOINT),
                                   CLASSIFIER_PROGRAMS))
        for index, fn in enumerate(loaded):
            prog_array[ctypes.c_int(index)] = ctypes.c_int(fn.fd)

        # Sockets open before we started (keep-alive connections of a running
        # server): give them ids now; the kernel counts on from there.
        socks = bpf[b"socks"]
        peer_wanted = bpf[b"peer_wanted"]
        next_id = 1
        for pid in ctx.pids:
            # The pid's own outbound connections are clients: their writes are requests.
            clients = target_procs.connected_socket_fds(pid)
            tcp = target_procs.tcp_connection_fds(pid)
            unix = target_procs.unix_socket_fds(pid)
            inodes = target_procs.socket_inodes(pid)
            self_paired = self_paired_fds(pid, {fd: inodes[fd] for fd in unix if fd in inodes})
            for fd in sorted(inodes):  # the sockets open now, each seeded once
                key = socks.Key(pid=pid, fd=fd)
                local_ipc = (LocalIpc.SELF_PAIR if fd in self_paired else
                             LocalIpc.PROCESSES if fd in unix else LocalIpc.NONE)
                socks[key] = socks.Leaf(conn_id=next_id, http_seen=0, client=int(fd in clients),
                                        local_ipc=int(local_ipc))
                if fd in tcp and fd not in clients:
                    # Their peer is named by the kernel at their next read (peer_wanted).
                    peer_wanted[peer_wanted.Key(pid=pid, fd=fd)] = ctypes.c_uint64(next_id)
                next_id += 1
        # Reads the targets' threads sit in now, which read_exit could not
        # otherwise tell from reads begun after attach (sock.bpf.c); the
        # map exists only where the reads have no entry program.
        try:
            blocked = bpf.get_table(b"reads_at_attach")
        except KeyError:
            blocked = None
        if blocked is not None:
            for pid in ctx.pids:
                for tid, fd in target_procs.threads_blocked_in_reads(pid).items():
                    blocked[ctypes.c_uint32(tid)] = ctypes.c_int32(fd)
        bpf[b"next_conn_id"][ctypes.c_int(0)] = ctypes.c_uint64(next_id)
        bpf[b"first_new_conn_id"][ctypes.c_int(0)] = ctypes.c_uint64(next_id)
        self.preexisting_sockets = next_id - 1

    def snapshot(self, bpf) -> dict:
        # Connections still open that moved bytes nothing recognised: close()
        # counts the others (COUNTER_CONNS_UNRECOGNISED, analyzers/unread_traffic.py).
        unread = [state for state in bpf[b"socks"].values()
                  if state.unrecognised and not state.http_seen and not state.tls]
        self_pairs = sum(1 for state in unread if state.local_ipc == LocalIpc.SELF_PAIR)
        local_ipc = sum(1 for state in unread if state.local_ipc == LocalIpc.PROCESSES)
        tls_no_plaintext = sum(1 for state in unread if state.tls_read_over and not state.local_ipc)
        return {"open_unrecognised": len(unread) - self_pairs - local_ipc - tls_no_plaintext,
                "open_local_ipc": local_ipc, "open_self_pairs": self_pairs,
                "open_tls_no_plaintext": tls_no_plaintext}


def kernel_at_least(minimum: tuple[int, int], release: str | None = None) -> bool:
    version = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return version is not None and tuple(map(int, version.groups())) >= minimum


def task_storage_usable(release: str | None = None) -> bool:
    """Task-local storage from tracepoint programs: Linux 5.13 and later, and
    bpf_get_current_task_btf() needs the kernel's BTF."""
    return kernel_at_least((5, 13), release) and Path(BTF_VMLINUX).exists()


def task_pt_regs_usable(release: str | None = None) -> bool:
    """bpf_task_pt_regs(), and task storage with it: Linux 5.15 and later,
    on x86-64 (elsewhere a syscall's first argument is gone by its exit)."""
    return (task_storage_usable(release) and kernel_at_least((5, 15), release)
            and os.uname().machine == "x86_64")
