"""The socket probe set (bpf/sock.bpf.c): HTTP request boundaries from syscalls.

Its object also holds the TLS, network and host-wide sets' programs (their
part_of is "sockets"): it is configured here first, then by each of them."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from inferprobe.collector.attach.kernel_version import kernel_at_least
from inferprobe.collector.attach.libbpf import BpfObject
from inferprobe.collector.attach.libbpf_library import BTF_VMLINUX
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.model.layout_generated import LocalIpc
from inferprobe.collector.processes import targets as target_procs
from inferprobe.collector.processes.unix_peers import self_paired_fds

# The tail-call chain of sock.bpf.c, in enum classify_prog order. The
# kernel's verifier takes most of start-up on these: the chain is split into
# one group per CPU by VERIFY_MS and verified at once (BpfObject.load_apart).
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
    "scan_event_stream",
    "scan_zmtp",
]
# The chain programs TLS plaintext can reach: never the iovec gatherers (a
# library call has one buffer), so their copies (*_tls) are not loaded.
TLS_CHAIN_PROGRAMS = ("classify_request", "classify_response", "scan_header_block", "scan_body",
                      "scan_fields", "scan_trace_context", "h2_frames", "scan_event_stream")
# What the verifier takes for each, in ms, loaded one at a time on the test VM
# (Linux 6.18, 2026-12-06; less the ~24 ms any load of the object costs). In
# sock.bpf.o the scans run on bpf_loop and the iovec gatherers' step per iovec
# is a global function, verified once (gather_step); sock_hash.bpf.o inlines both.
VERIFY_MS = {
    "sock.bpf.o": {"classify_request": 7, "classify_response": 1, "scan_header_block": 19, "scan_body": 12,
                   "gather_iovecs": 7, "gather_window": 12, "scan_fields": 78, "scan_trace_context": 67,
                   "h2_frames": 35, "scan_event_stream": 56, "scan_zmtp": 15},
    "sock_hash.bpf.o": {"classify_request": 58, "classify_response": 1, "scan_header_block": 87,
                        "scan_body": 111, "gather_iovecs": 37, "gather_window": 48, "scan_fields": 385,
                        "scan_trace_context": 241, "h2_frames": 32,
                        "scan_event_stream": 160, "scan_zmtp": 1},
}
# The read syscalls' entry programs: unloaded where reads are taken at their exit.
READ_ENTRY_PROGRAMS = ("sys_enter_read", "sys_enter_readv", "sys_enter_recvfrom", "sys_enter_recvmsg")
# Programs of the other sets that live in sock.bpf.o: off unless their set turns them on.
NETWORK_PROGRAMS = ("sock_send_length", "sock_recv_length", "tcp_probe", "tcp_retransmit_skb",
                    "net_dev_queue", "net_dev_xmit")


def is_tls_program(name: str) -> bool:
    """The TLS set's uprobes (tls_*) and its copy of the chain (*_tls)."""
    return name.startswith("tls_") or name.endswith("_tls")


def chain_groups(programs: list[str], workers: int, core_object: str = "sock.bpf.o") -> list[list[str]]:
    """The chain's programs in `workers` groups of about equal verifier cost
    in `core_object` (the costliest first, each to the group with least so far)."""
    cost = VERIFY_MS[core_object]
    groups: list[list[str]] = [[] for _ in range(max(1, workers))]
    totals = [0] * len(groups)
    for program in sorted(programs, key=lambda p: -cost[p.removesuffix("_tls")]):
        least = totals.index(min(totals))
        groups[least].append(program)
        totals[least] += cost[program.removesuffix("_tls")]
    return [group for group in groups if group]


class SocketProbes(ProbeSet):
    name = "sockets"
    core_object = "sock.bpf.o"   # or sock_hash.bpf.o (prepare)
    description = "HTTP/1.x requests, responses and SSE token writes from socket syscalls"
    state_maps: tuple[str, ...] = ("socks", "pending", "pending_accept", "pending_connect", "connecting",
                                    "peer_wanted")

    def __init__(self) -> None:
        self.preexisting_sockets = 0
        self.pending_in_task_storage = False

    def prepare(self, ctx: TargetContext) -> str | None:
        choice = (ctx.options.get("sockets") or {}).get("pending", "auto")
        # The task-storage object rebuilds a syscall already under way at attach
        # from the thread's saved registers (bpf_task_pt_regs: Linux 5.15+, x86-64),
        # and its scans run on bpf_loop (5.17+): sock_object_usable().
        self.pending_in_task_storage = choice == "task" or (choice == "auto" and sock_object_usable())
        self.core_object = "sock.bpf.o" if self.pending_in_task_storage else "sock_hash.bpf.o"
        if self.pending_in_task_storage:
            # Freed with each thread by the kernel, and not listable: nothing to watch.
            self.state_maps = ("socks", "pending_accept", "pending_connect", "connecting", "peer_wanted")
        return None

    def configure(self, core: BpfObject) -> None:
        """Everything of the other sets off (they turn their own on after this),
        and the chain left to after_load, which verifies it on every core."""
        core.set_constant("reads_at_exit", int(self.pending_in_task_storage))
        for program in core.programs():
            if (program in NETWORK_PROGRAMS or is_tls_program(program) or program in CLASSIFIER_PROGRAMS
                    or (self.pending_in_task_storage and program in READ_ENTRY_PROGRAMS)):
                core.set_autoload(program, False)

    def finish_load(self, core: BpfObject) -> None:
        """The chain's programs, and the TLS set's copy of them when it is on,
        verified on every core at once (the bulk of start-up), then put in
        the arrays their tail calls go through."""
        chains = {"classifiers": {name: name for name in CLASSIFIER_PROGRAMS}}
        if core.constants.get("tls_probes"):
            chains["classifiers_tls"] = {name: f"{name}_tls" for name in TLS_CHAIN_PROGRAMS}
        everything = [program for programs in chains.values() for program in programs.values()]
        holders = core.load_apart(chain_groups(everything, os.cpu_count() or 1, self.core_object))
        for array, programs in chains.items():
            table = core[array]
            for name, program in programs.items():
                index = CLASSIFIER_PROGRAMS.index(name)   # enum classify_prog
                table[ctypes.c_uint32(index)] = ctypes.c_uint32(holders[program].program_fd(program))
        core.close_parts()   # the arrays hold the programs now

    def after_load(self, bpf, ctx: TargetContext) -> None:
        bpf.attach_tracepoints()

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
                if fd in tcp:
                    # Their peer is named by the kernel at their next read (peer_wanted): for a
                    # client connection (a pool's, kept alive) the server it calls.
                    peer_wanted[peer_wanted.Key(pid=pid, fd=fd)] = ctypes.c_uint64(next_id)
                next_id += 1
        # Reads the targets' threads sit in now, which read_exit could not
        # otherwise tell from reads begun after attach (sock.bpf.c); only
        # where the reads have no entry program.
        if bpf.constants.get("reads_at_exit"):
            blocked = bpf[b"reads_at_attach"]
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


def task_storage_usable(release: str | None = None) -> bool:
    """Task-local storage from tracepoint programs: Linux 5.13 and later, and
    bpf_get_current_task_btf() needs the kernel's BTF."""
    return kernel_at_least((5, 13), release) and Path(BTF_VMLINUX).exists()


def task_pt_regs_usable(release: str | None = None) -> bool:
    """bpf_task_pt_regs(), and task storage with it: Linux 5.15 and later,
    on x86-64 (elsewhere a syscall's first argument is gone by its exit)."""
    return (task_storage_usable(release) and kernel_at_least((5, 15), release)
            and os.uname().machine == "x86_64")


def sock_object_usable(release: str | None = None) -> bool:
    """sock.bpf.o, the object built for current kernels: task storage with the
    saved registers, and bpf_loop() for its scans (Linux 5.17 and later).
    Elsewhere sock_hash.bpf.o, whose scans are bounded loops the verifier
    walks (slower to load, same results)."""
    return task_pt_regs_usable(release) and kernel_at_least((5, 17), release)
