"""Attaches a uprobe through tracefs over an event a killed tracer of the same pid left behind.

Run without CAP_SYS_ADMIN (Linux 6.16+ then refuses perf uprobes, so bcc writes
the probe into tracefs' uprobe_events under a name ending in "_bcc_<its pid>").
Before attaching, this process writes an entry of exactly that name itself, as
an agent killed with SIGKILL leaves one behind for the next agent with its pid
(pid 1 of a restarted container). It then attaches a uprobe on libc's getpid()
through collector/bcc_uprobes.py, calls getpid() CALLS times and prints one JSON
line: whether the stale entry was there before, whether the attach used tracefs
(our entry exists while attached), the hits the probe counted, and whether the
entry is gone after detaching.
"""

from __future__ import annotations

import ctypes
import json
import os

from bcc import BPF

from inferprobe.collector import bcc_uprobes

CALLS = 100
UPROBE_EVENTS = "/sys/kernel/tracing/uprobe_events"
PROGRAM = b"""
BPF_ARRAY(hits, u64, 1);
int on_getpid(void *ctx) {
    int zero = 0;
    u64 *n = hits.lookup(&zero);
    if (n) __sync_fetch_and_add(n, 1);
    return 0;
}
"""


def entries() -> list[str]:
    with open(UPROBE_EVENTS) as events:
        return [line.split()[0].split("/", 1)[1] for line in events if line.strip()]


def main() -> None:
    bcc_uprobes.install()
    pid = os.getpid()
    path, addr = BPF._check_path_symbol(b"c", b"getpid", None, pid)
    name = (bcc_uprobes.short_event_name(b"p", path, addr, pid) + b"_bcc_%d" % pid).decode()
    events = os.open(UPROBE_EVENTS, os.O_WRONLY | os.O_APPEND)   # (tracefs refuses the seek of open("a"))
    os.write(events, f"p:uprobes/{name} {path.decode()}:0x{addr:x}\n".encode())   # a killed tracer's
    os.close(events)
    stale_before = name in entries()
    bpf = BPF(text=PROGRAM)
    bpf.attach_uprobe(name=path, addr=addr, fn_name=b"on_getpid", pid=pid)
    through_tracefs = name in entries()
    libc = ctypes.CDLL(None)
    for _ in range(CALLS):
        libc.getpid()
    hits = bpf[b"hits"][ctypes.c_int(0)].value
    bpf.cleanup()
    print(json.dumps({"stale_before": stale_before, "through_tracefs": through_tracefs, "hits": hits,
                      "calls": CALLS, "gone_after": name not in entries()}))


if __name__ == "__main__":
    main()
