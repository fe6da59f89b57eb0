"""The kernel's detach of our probes, left to a child once the recording is written.

Why: a tracepoint or uprobe program that libbpf attached through a perf event
is taken off its probe when the last reference to that event goes, and the
kernel then waits for RCU grace periods before it returns (one per event, ~50 ms
on the test VM, serialised by its event mutex: threads do not help). The socket
set alone has ~40 such events, so closing them held `record` ~2 s after the
recording was complete.

How: a forked child keeps a reference to every BPF and perf-event file and
nothing else (no pipes: a caller reading our output until EOF must not wait for
it; no sockets: the metrics port is free at once). The recorder then closes its
own references, which costs nothing, and exits; the child notices that (its
end of a pipe reaches EOF) and exits too, and its exit does the kernel's part.
libbpf disables each perf event before closing it, so no probe fires for us
after the recorder has closed it: the child only waits out the grace periods.
"""

from __future__ import annotations

import os

# What /proc/self/fd/N links to for the files the kernel must release itself
# (anon_inode:bpf-map, bpf-prog, bpf_link, ...; anon_inode:[perf_event]).
_KERNEL_OBJECTS = ("anon_inode:bpf", "anon_inode:[perf_event]")


def _is_kernel_object(fd: int) -> bool:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    return target.startswith(_KERNEL_OBJECTS)


def hand_over_probes() -> int | None:
    """Forks the child that outlives this process holding its BPF and perf
    files. Returns the child's pid, or None when it could not fork (then the
    caller detaches as before)."""
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:   # the child: only os calls from here to _exit (other threads are gone)
        try:
            os.setsid()   # out of the terminal's process group: Ctrl-C again does not reach it
            for name in os.listdir("/proc/self/fd"):
                fd = int(name)
                if fd != read_end and not _is_kernel_object(fd):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            os.read(read_end, 1)   # EOF: the recorder has exited (or was killed)
        finally:
            os._exit(0)
    os.close(read_end)
    # write_end stays open until this process exits; os.pipe() files are not
    # inherited by programs it starts.
    return pid
