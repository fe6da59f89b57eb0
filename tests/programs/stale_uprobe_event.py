"""Attaches a uprobe through tracefs over an event a killed tracer of the same pid left behind.

Run without CAP_SYS_ADMIN (Linux 6.16+ then refuses perf uprobes, so bcc writes
the probe into tracefs' uprobe_events under a name ending in "_bcc_<its pid>").
Before attaching, this process writes an entry of exactly that name itself, as
an agent killed with SIGKILL leaves one behind for the next agent with its pid
(pid 1 of a restarted container). It then attaches a uprobe on libc's getpid()
through collector/attach/bcc_uprobes.py, calls getpid() CALLS times and prints one JSON
line: whether the stale entry was there before, whether the attach went through
tracefs (the kernel then refuses to remove the event of that name: a probe uses
it), the hits the probe counted, and whether the entry is gone
after detaching. The line is removed on every way out.
"""

from __future__ import annotations

import ctypes
import json
import os

from bcc import BPF

from inferprobe.collector.attach import bcc_uprobes

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


def write_line(line: str) -> bool:
    """Writes one line to uprobe_events; False where the kernel refused it (a removal of an event
    a probe uses: EBUSY; of one that is not there: ENOENT)."""
    events = os.open(UPROBE_EVENTS, os.O_WRONLY | os.O_APPEND)   # (tracefs refuses the seek of open("a"))
    try:
        os.write(events, line.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(events)


def main() -> None:
    bcc_uprobes.install()
    pid = os.getpid()
    path, addr = BPF._check_path_symbol(b"c", b"getpid", None, pid)
    name = (bcc_uprobes.short_event_name(b"p", path, addr, pid) + b"_bcc_%d" % pid).decode()
    line = f"p:uprobes/{name} {path.decode()}:0x{addr:x}\n"   # what a killed tracer of this pid left
    write_line(line)
    try:
        stale_before = name in entries()
        bpf = BPF(text=PROGRAM)
        bpf.attach_uprobe(name=path, addr=addr, fn_name=b"on_getpid", pid=pid)
        # Through tracefs the probe uses the event of that name, and the kernel refuses to remove
        # it; on the perf path the stale line is unused, and goes.
        through_tracefs = name in entries() and not write_line(f"-:uprobes/{name}\n")
        libc = ctypes.CDLL(None)
        for _ in range(CALLS):
            libc.getpid()
        hits = bpf[b"hits"][ctypes.c_int(0)].value
        bpf.cleanup()
        print(json.dumps({"stale_before": stale_before, "through_tracefs": through_tracefs, "hits": hits,
                          "calls": CALLS, "gone_after": name not in entries()}))
    finally:
        write_line(f"-:uprobes/{name}\n")


if __name__ == "__main__":
    main()
