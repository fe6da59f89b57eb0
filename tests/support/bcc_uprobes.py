"""Two defects of bcc's Python uprobe attach (0.26, and upstream still), corrected once per process.

inferprobe itself no longer uses bcc (its programs are built ahead of time and
loaded with libbpf). A few tests still use bcc as an independent reader, an
oracle written by someone else: tests/programs/usdt_trace.py reads every USDT
argument with bcc's own parser, test_go_binary_real.py probes Go functions
with it. They run beside inferprobe's recorder, which probes the same files:
with bcc's binding as it is, the two would give the kernel different USDT
semaphore offsets for one instruction, and the second would be refused.


1. libbcc's bpf_attach_uprobe() takes seven arguments, the last the offset of a
   USDT semaphore for the kernel to count (ref_ctr_offset); bcc's ctypes binding
   declares six (iovisor/bcc#5236), so the kernel receives whatever the stack
   holds there (6 with this host's libffi). The kernel keeps one ref_ctr_offset
   per probed instruction (inode, offset) and refuses, with EINVAL, a second
   probe on it with another one: two tracers of the same file, one passing the
   garbage and one passing 0 (a bpftrace, a libbpf tool, another bcc version),
   cannot both attach. It also makes the kernel increment a 16-bit value at
   that offset in every process mapping the file writable there. Passing 0 is
   right for us: bcc raises USDT semaphores itself, through /proc/<pid>/mem.

2. When perf_event_open() refuses the uprobe (since Linux 6.16, and the stable
   kernels that took commit ba677dbe77af in July 2025, it needs CAP_SYS_ADMIN;
   CAP_PERFMON is no longer enough), bcc falls back to writing the probe into
   tracefs' uprobe_events, under a name built from the whole path
   ("p__proc_123_root_usr_lib_x86_64_linux_gnu_libssl_so_3_0x35430_123_bcc_456").
   The kernel rejects event names of 64 characters or more ("Event name is too
   long", EINVAL), so the fallback failed for nearly every probe a container's
   process needs. Names here are short: the file's base name cut to fit, a hash
   of its path, the offset and the pid. A failed attach leaves no tracefs entry
   behind, and its error says what the kernel answered. One a killed tracer left
   under the same name (bcc adds its own pid: 1 for every agent restarted in a
   container) is removed, unless a probe still uses it, and the attach tried again.

install() is idempotent; each bcc-based test tool calls it before its first attach.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re

from inferprobe.collector.attach.libbpf_library import holds_cap_sys_admin

# The kernel's MAX_EVENT_NAME_LEN is 64, terminator included; bcc appends "_bcc_<its pid>".
MAX_EVENT_NAME = 63
_BCC_SUFFIX_MAX = len("_bcc_") + len(str(1 << 22))   # PID_MAX_LIMIT on 64-bit kernels
_NAME_BUDGET = MAX_EVENT_NAME - _BCC_SUFFIX_MAX
_NOT_NAME = re.compile(rb"[^a-zA-Z0-9_]")

_installed = False


def short_event_name(prefix: bytes, path: bytes, addr: int, pid: int) -> bytes:
    """A tracefs event name for one probe, unique per (path, addr, pid), that fits the kernel's limit."""
    digest = hashlib.blake2b(path, digest_size=4).hexdigest().encode()
    tail = b"_%s_0x%x" % (digest, addr) + (b"_%d" % pid if pid != -1 else b"")
    room = _NAME_BUDGET - len(prefix) - 1 - len(tail)
    base = _NOT_NAME.sub(b"_", os.path.basename(path))[:max(room, 0)]
    return b"%s_%s%s" % (prefix, base, tail)


class UprobeRefused(Exception):
    """The kernel (or tracefs) refused one uprobe; the message is one line."""


def install() -> None:
    global _installed
    if _installed:
        return
    from bcc import BPF, libbcc

    binding = libbcc.lib.bpf_attach_uprobe
    if len(binding.argtypes or ()) == 6:   # the six-argument binding: give the kernel 0, not the stack
        seven = libbcc.lib["bpf_attach_uprobe"]   # a fresh function pointer, not the cached attribute
        seven.restype = ctypes.c_int
        seven.argtypes = [*binding.argtypes, ctypes.c_uint32]
        detach = libbcc.lib.bpf_detach_uprobe

        def attach(progfd, attach_type, ev_name, path, addr, pid):
            for _ in range(2):
                ctypes.set_errno(0)
                fd = seven(progfd, attach_type, ev_name, path, addr, pid, 0)
                if fd >= 0:
                    return fd
                code = ctypes.get_errno()
                # The tracefs fallback may have left its event behind; or the event was there
                # before us (EEXIST), left by a tracer of the same pid that was killed (an agent
                # restarted as pid 1 of its container): removing it, which the kernel refuses
                # while a probe uses it, lets the second try attach.
                detach(ev_name)
                if code != errno.EEXIST:
                    break
            raise UprobeRefused(_refusal(path, addr, code))

        libbcc.lib.bpf_attach_uprobe = attach
    BPF._get_uprobe_evname = lambda _self, prefix, path, addr, pid: short_event_name(prefix, path, addr, pid)
    _installed = True


def _refusal(path: bytes, addr: int, code: int) -> str:
    why = os.strerror(code) if code else "no reason given"
    hint = ""
    if code == errno.EINVAL:
        hint = ("; another tracer may hold a probe there with another USDT semaphore offset "
                "(the kernel log says 'ref_ctr_offset mismatch'), or the file changed")
    elif not holds_cap_sys_admin():
        hint = "; without CAP_SYS_ADMIN, Linux 6.16+ refuses perf uprobes and only tracefs is left"
    return f"the kernel refused a uprobe at {os.fsdecode(path)}:0x{addr:x} ({why}{hint})"
