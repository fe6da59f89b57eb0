"""The socket probe set (bpf/sock.bpf.c): HTTP request boundaries from syscalls."""

from __future__ import annotations

import ctypes

from inferprobe.collector import targets as target_procs
from inferprobe.collector.probe_sets import ProbeSet, TargetContext

# The tail-call chain of sock.bpf.c, in enum classify_prog order.
CLASSIFIER_PROGRAMS = [
    "classify_read",
    "classify_write",
    "scan_header_block",
    "finish_headers",
    "scan_body",
    "finish_body",
]


class SocketProbes(ProbeSet):
    name = "sockets"
    source = "sock.bpf.c"
    description = "HTTP/1.x requests, responses and SSE token writes from socket syscalls"
    state_maps = ("socks", "pending", "pending_accept")

    def __init__(self) -> None:
        self.preexisting_sockets = 0

    def after_load(self, bpf, ctx: TargetContext) -> None:
        import bcc

        prog_array = bpf[b"classifiers"]
        for index, name in enumerate(CLASSIFIER_PROGRAMS):
            fn = bpf.load_func(name.encode(), bcc.BPF.TRACEPOINT)
            prog_array[ctypes.c_int(index)] = ctypes.c_int(fn.fd)

        # Sockets open before we started (keep-alive connections of a running
        # server): give them ids now; the kernel counts on from there.
        socks = bpf[b"socks"]
        next_id = 1
        for pid in ctx.pids:
            for fd in target_procs.socket_fds(pid):
                socks[socks.Key(pid=pid, fd=fd)] = socks.Leaf(conn_id=next_id, http_seen=0)
                next_id += 1
        bpf[b"next_conn_id"][ctypes.c_int(0)] = ctypes.c_uint64(next_id)
        self.preexisting_sockets = next_id - 1
