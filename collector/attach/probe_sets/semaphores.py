"""The locks set's libc semaphore uprobes: which thread took each semaphore.

bpf/locks.bpf.c records, per process and semaphore, the thread whose
sem_trywait returned 0, until the next sem_post or sem_init on it; a futex
wait on that semaphore is then flagged SEM_OWN (the waiter took it itself:
only another thread's post can end the wait, a signal) or SEM_HELD
(another thread took it). CPython 3.11's threading.Lock is such a
semaphore, and every acquire tries sem_trywait first: that is what tells a
Condition / Event / Queue wait from a contended lock (docs/locks.md).

The uprobes go on each target's own libc (found in /proc/PID/maps, opened
through /proc/PID/root so a process in a container gets its libc, not ours)
and are attached with its pid: other processes using the same file pay
nothing. Processes that appear later (children of the targets) are attached
by LockProbes.refresh(). Each probe sits on the function's first instruction
the kernel emulates, where there is one (collector/binaries/uprobe_points.py): on
x86-64 a probe that must be single-stepped costs many times more.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from inferprobe.collector.attach.uprobe_attach import Probe, attach_probe
from inferprobe.collector.binaries.elf_symbols import code_at, functions_matching
from inferprobe.collector.binaries.uprobe_points import SCAN_BYTES, probe_offset
from inferprobe.collector.processes.proc_maps import read_maps

# glibc only: its sem_t keeps the value word, the futex a waiter sleeps on,
# at offset 0 (x86-64, aarch64), which the kernel side relies on.
LIBC_NAMES = frozenset({"libc.so.6"})
# Release probes first: a taker is only ever recorded in a process whose
# sem_post and sem_init already clear it, so a failed attach can leave a
# process without flags but never with stale ones. No sem_destroy probe: a
# semaphore made again at that address starts with sem_init, and memory
# reused for a mutex or condition variable shows in the frames
# (analyzers/locks.py ignores the flag there); it would be one more probe,
# single-stepped (it has no jump), at every CPython lock's deallocation.
RELEASE_FUNCTIONS = ("sem_post", "sem_init")
TAKE_FUNCTION = "sem_trywait"
SYMBOLS = f"^({'|'.join((*RELEASE_FUNCTIONS, TAKE_FUNCTION))})$"


@dataclass(frozen=True)
class MappedLibc:
    pid: int
    path: str  # as the process sees it (its mount namespace)
    file_key: tuple[int, int]  # (st_dev, st_ino)

    @property
    def host_path(self) -> str:
        return f"/proc/{self.pid}/root{self.path}"


def mapped_libc(pid: int) -> MappedLibc | None:
    """pid's glibc, when it maps one (a static or musl binary does not)."""
    for m in read_maps(pid):
        if not m.executable or os.path.basename(m.path) not in LIBC_NAMES:
            continue  # a replaced libc reads "libc.so.6 (deleted)": not probed
        try:
            st = os.stat(f"/proc/{pid}/root{m.path}")
        except OSError:
            return None
        return MappedLibc(pid=pid, path=m.path, file_key=(st.st_dev, st.st_ino))
    return None


def semaphore_functions(path: str) -> dict[str, int]:
    """Symbol value of each semaphore function path exports (versioned aliases share one)."""
    found: dict[str, int] = {}
    for name, address in functions_matching(path, SYMBOLS):
        found.setdefault(name, address)
    return found


def function_start(path: str, vaddr: int) -> bytes:
    """The first bytes of the code at vaddr in the ELF file (empty when not found)."""
    return code_at(path, vaddr, SCAN_BYTES)


@dataclass(frozen=True)
class ProbePoint:
    symbol: int  # the function's symbol value
    offset: int  # of the probed instruction from it

    @property
    def address(self) -> int:
        return self.symbol + self.offset


def probe_points(path: str) -> dict[str, ProbePoint]:
    """Where to probe each semaphore function: its first emulated instruction, else its entry."""
    return {name: ProbePoint(address, probe_offset(function_start(path, address)))
            for name, address in semaphore_functions(path).items()}


@dataclass
class SemAttachment:
    pid: int
    path: str
    functions: list[str] = field(default_factory=list)  # "sem_post+0xb": where each probe sits
    failed: dict[str, str] = field(default_factory=dict)  # function -> why

    @property
    def complete(self) -> bool:
        return not self.failed and any(f.startswith(TAKE_FUNCTION + "+") for f in self.functions)


class SemaphoreProbes:
    """The uprobes of every target process, attached once per (pid, libc file)."""

    def __init__(self) -> None:
        self.attachments: list[SemAttachment] = []
        # Looked at once: a uprobe attached with a pid follows the process
        # through exec (the kernel re-inserts it when the new image maps libc).
        self._seen: set[int] = set()
        self._points: dict[tuple[int, int], dict[str, ProbePoint]] = {}

    def attach(self, bpf, pids: list[int]) -> list[SemAttachment]:
        """Attaches to the pids not looked at yet; returns the new attachments."""
        new = []
        for pid in pids:
            if pid in self._seen:
                continue
            self._seen.add(pid)
            libc = mapped_libc(pid)
            if libc is None:
                continue
            att = self._attach(bpf, libc)
            self.attachments.append(att)
            new.append(att)
        return new

    def _attach(self, bpf, libc: MappedLibc) -> SemAttachment:
        att = SemAttachment(pid=libc.pid, path=libc.path)
        points = self._points.get(libc.file_key)
        if points is None:
            try:
                points = probe_points(libc.host_path)
            except Exception as err:  # ELF readers raise bare Exception for unreadable files
                att.failed["*"] = str(err)
                return att
            self._points[libc.file_key] = points
        for name in RELEASE_FUNCTIONS:
            if not self._probe(bpf, att, libc, name, points, "lock_sem_release"):
                return att  # no take recorded without every release probe (see RELEASE_FUNCTIONS)
        # return probe before entry probe: the entry records what the return reads
        if self._probe(bpf, att, libc, TAKE_FUNCTION, points, "lock_sem_trywait_return", ret=True):
            self._probe(bpf, att, libc, TAKE_FUNCTION, points, "lock_sem_trywait_enter")
        return att

    @staticmethod
    def _probe(bpf, att: SemAttachment, libc: MappedLibc, name: str, points: dict[str, ProbePoint],
               fn_name: str, ret: bool = False) -> bool:
        """One uprobe (ret: a return probe; at an offset it replaces the return
        address just as at the entry, since rsp is unchanged up to there)."""
        point = points.get(name)
        if point is None:
            att.failed[name] = "not exported"
            return False
        try:
            attach_probe(bpf, libc.host_path, libc.pid, Probe(point.address, fn_name, on_return=ret))
        except Exception as err:  # the library's error, e.g. the probe limit or a dead pid
            att.failed[name + (" (return)" if ret else "")] = str(err)
            return False
        if not ret:
            att.functions.append(f"{name}+{point.offset:#x}")
        return True

    def snapshot(self) -> list[dict]:
        return [{"pid": a.pid, "path": a.path, "functions": a.functions, "failed": a.failed}
                for a in self.attachments]
