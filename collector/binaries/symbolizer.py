"""Addresses to names: the one symbolizer, for flame-graph stacks and lock-wait addresses alike.

The only module that reads /proc/PID/maps, ELF files (through
collector/binaries/elf_symbols.py), perf map files and /proc/kallsyms, at record
time, so a recording carries names and `report` and `flamegraph` need no
access to the traced host.

Why not bcc's resolver: it reads a process's maps when asked, so it cannot
name frames of a process that exited before the recording stopped, and it
gives no file offset for what it cannot name. Here every target's maps are
remembered while it lives (remember_process(), called at start and once a
second by the recorder) and ELF symbol tables are read with pyelftools from
the files themselves, so a frame of an exited process still resolves, and an
unresolved frame keeps its library and offset: `[unknown] libfoo.so+0x1a2b`.

Frame names carry their kind the way flamegraph.pl and bcc's folded output
do: kernel frames end in "_[k]"; Python frames start with "py::": CPython's
perf-trampoline names from /tmp/perf-PID.map (py::function:file), or the
frames walked from the thread state (py::qualname:file:line, named by
collector/binaries/python_code.py and merged in by collector/binaries/python_stacks.py).

Lock waits ask more of an address (code_frame()): the function it is in,
placed by the unwind table (elf_symbols.ElfFunctions says why), and whether
a word found on the stack is a return address: the bytes before it must
decode as a call instruction (E8 rel32, or FF /2 in one of its register,
memory, displacement forms); the check is a few byte patterns, not worth a
disassembler dependency.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

from inferprobe.collector.binaries.elf_symbols import ElfFile, read_elf
from inferprobe.collector.model.stack_markers import TRUNCATED
from inferprobe.collector.processes import targets as target_procs
from inferprobe.collector.processes.proc_maps import Mapping, parse_maps, read_maps_text

KERNEL_SUFFIX = "_[k]"
# Outermost user frames of a complete frame-pointer walk: program entry and
# thread start. A stack that reaches none of them was cut short (code built
# without frame pointers broke the chain, or the walk hit its depth limit).
STACK_ROOTS = frozenset({
    "_start", "__libc_start_main", "__libc_start_call_main", "start_thread", "clone", "clone3",
    "__clone", "__clone3", "thread_start", "__GI___clone3", "__GI___clone",
})
MAX_STACK_DEPTH = 127  # PERF_MAX_STACK_DEPTH: a walk this deep was cut by the kernel

PYTHON_EXE = re.compile(r"python3?(\.\d+)?$")
# For a Python process whose frames were neither walked (collector/binaries/python_stacks.py:
# CPython 3.10-3.13) nor named by a perf map.
PYTHON_HOWTO = (
    "Python frames are not resolved: inferprobe walks CPython 3.10-3.13 (docs/python-frames.md); "
    "another CPython 3.12+ names them when run with `python -X perf` or PYTHONPERFSUPPORT=1"
)


# Processes a symbolizer remembers (a recording host-wide for days); exited ones go first.
MAX_PROCESSES = 4096
# Thread names kept per process (a server that starts a thread per request).
MAX_THREADS = 4096


@lru_cache(maxsize=1)
def _cxa_demangle():
    lib = ctypes.util.find_library("stdc++")
    if not lib:
        return None
    try:
        fn = ctypes.CDLL(lib).__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    return fn


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """C++ names through libstdc++'s own demangler (the one c++filt uses)."""
    if not name.startswith("_Z"):
        return name
    fn = _cxa_demangle()
    if fn is None:
        return name
    status = ctypes.c_int()
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if not ptr or status.value != 0:
        return name
    try:
        return ctypes.string_at(ptr).decode(errors="replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))


@dataclass
class PerfMap:
    """A /tmp/perf-PID.map: JIT code regions a runtime named for profilers."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> PerfMap:
        rows = []
        for line in text.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3:
                try:
                    start, size = int(parts[0], 16), int(parts[1], 16)
                except ValueError:
                    continue
                rows.append((start, start + size, parts[2].strip()))
        rows.sort()
        return cls([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])

    def lookup(self, addr: int) -> str | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.ends[i]:
            return self.names[i]
        return None


class Kallsyms:
    def __init__(self, path: str = "/proc/kallsyms"):
        rows = []
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 3 and parts[1] in "tTwW":
                        addr = int(parts[0], 16)
                        if addr:
                            rows.append((addr, parts[2]))
        except OSError:
            pass
        rows.sort()
        self.addrs = [r[0] for r in rows]
        self.names = [r[1] for r in rows]

    def lookup(self, addr: int) -> str:
        i = bisect.bisect_right(self.addrs, addr) - 1
        if i < 0:
            return f"[unknown] [kernel]+{addr:#x}{KERNEL_SUFFIX}"
        return self.names[i] + KERNEL_SUFFIX


@dataclass
class ProcessInfo:
    pid: int
    comm: str
    exe: str
    maps: list[Mapping]
    perf_map: PerfMap | None = None
    threads: dict[int, str] = field(default_factory=dict)  # tid -> thread name

    @property
    def is_python(self) -> bool:
        return bool(PYTHON_EXE.search(os.path.basename(self.exe))) or any(
            "libpython" in m.path for m in self.maps
        )

    def python_status(self) -> str | None:
        """"perf-map", "unresolved" or None (not a Python process)."""
        if not self.is_python:
            return None
        return "perf-map" if self.perf_map and any(n.startswith("py::") for n in self.perf_map.names) \
            else "unresolved"


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


@dataclass(frozen=True)
class Frame:
    """A code address as lock waits need it (code_frame())."""

    addr: int
    module: str  # file name of the mapping, "?" when not file-backed
    function: str  # symbol, or module+0xSTART for an unnamed function, or "[unknown]"
    offset: int  # addr - function start
    after_call: bool  # the bytes before addr are a call (it can be a return address)

    def as_dict(self) -> dict:
        return {"addr": self.addr, "module": self.module, "function": self.function,
                "offset": self.offset, "after_call": self.after_call}


def _is_after_call(before: bytes) -> bool:
    """Do the bytes just before a return address end with a call instruction?"""
    n = len(before)
    if n >= 5 and before[-5] == 0xE8:
        return True
    for k in (2, 3, 4, 6, 7):  # FF /2 with register, [reg], disp8, SIB, disp32 / rip-relative
        if n >= k and before[-k] == 0xFF and ((before[-k + 1] >> 3) & 7) == 2:
            return True
    return False


class Symbolizer:
    """Per-process maps and per-file symbol tables, kept for the whole recording."""

    def __init__(self, alive=None) -> None:
        # pid -> maps and threads, kept past its exit (stacks are named at stop); bounded:
        # beyond MAX_PROCESSES the longest-known exited one goes (counted in processes_evicted)
        self.processes: dict[int, ProcessInfo] = {}
        # file identity -> its symbols (bounded by the files mapped), and (pid, path) aliases: dropped
        # with the process
        self._tables: dict[tuple, ElfFile | None] = {}
        self._kallsyms: Kallsyms | None = None
        self._alive = alive if alive is not None else target_procs.alive
        self.processes_evicted = 0  # exited processes forgotten at the bound: their frames stay unnamed

    # -- what the targets look like while they live

    def remember_process(self, pid: int, read_files: bool = True) -> None:
        """Reads pid's maps, threads and perf map now (they vanish when it exits);
        with read_files, every mapped ELF file too (not needed while it lives on)."""
        maps_text = read_maps_text(pid)
        if maps_text is None:
            return  # already gone: keep what we had
        info = self.processes.get(pid)
        comm = (_read(f"/proc/{pid}/comm") or "?").strip()
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        maps = [m for m in parse_maps(maps_text) if m.executable]
        if info is None:
            info = ProcessInfo(pid, comm, exe, maps)
            self.processes[pid] = info
            if len(self.processes) > MAX_PROCESSES:
                self._evict_exited()
        else:
            # Keep mappings that were unmapped since (a dlclose'd library's
            # samples still need their names); the newest wins on overlap.
            known = {(m.start, m.path) for m in maps}
            info.maps = sorted(maps + [m for m in info.maps if (m.start, m.path) not in known
                                       and not any(n.start < m.end and m.start < n.end for n in maps)],
                               key=lambda m: m.start)
            info.comm, info.exe = comm, exe or info.exe
        for tid_dir in _listdir(f"/proc/{pid}/task"):
            name = _read(f"/proc/{pid}/task/{tid_dir}/comm")
            if name is not None:
                info.threads[int(tid_dir)] = name.strip()
        while len(info.threads) > MAX_THREADS:  # bounded: the longest-known thread names go first
            del info.threads[next(iter(info.threads))]
        perf_text = _read(f"/proc/{pid}/root/tmp/perf-{pid}.map") or _read(f"/tmp/perf-{pid}.map")
        if perf_text is not None:
            info.perf_map = PerfMap.parse(perf_text)
        for m in maps if read_files else ():
            if m.is_file:
                self._table_for(pid, m)  # read ELF files while /proc/PID/root still leads to them

    def _evict_exited(self) -> None:
        """Forgets the exited process known longest (a live one is never forgotten)."""
        for pid in self.processes:
            if not self._alive(pid):
                del self.processes[pid]
                for key in [k for k in self._tables if len(k) == 2 and k[0] == pid]:
                    del self._tables[key]
                self.processes_evicted += 1
                return

    # -- resolution

    def _table_for(self, pid: int, m: Mapping) -> ElfFile | None:
        path = m.path.removesuffix(" (deleted)")
        candidates = [f"/proc/{pid}/root{path}", path]
        if m.path.endswith(" (deleted)"):
            candidates.insert(0, f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}")
        key = None
        for candidate in candidates:
            try:
                st = os.stat(candidate)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino, st.st_mtime_ns)
            if key not in self._tables:
                self._tables[key] = read_elf(candidate)
            self._tables[(pid, m.path)] = self._tables[key]
            return self._tables[key]
        return self._tables.get((pid, m.path))

    @staticmethod
    def _mapping_of(info: ProcessInfo, addr: int) -> Mapping | None:
        starts = [m.start for m in info.maps]
        i = bisect.bisect_right(starts, addr) - 1
        return info.maps[i] if i >= 0 and addr < info.maps[i].end else None

    def user_frame(self, pid: int, addr: int) -> str:
        """A flame-graph frame: the symbol, a perf-map name, or what is known of where it is."""
        info = self.processes.get(pid)
        if info is None:
            return f"[unknown] {addr:#x}"
        m = self._mapping_of(info, addr)
        if m is None or not m.is_file:
            if info.perf_map is not None:
                name = info.perf_map.lookup(addr)
                if name:
                    return name.replace(";", ":")
            where = m.short_name if m is not None else "[anon]"
            return f"[unknown] {where}+{addr - (m.start if m else 0):#x}"
        file_offset = addr - m.start + m.offset
        elf = self._table_for(pid, m)
        if elf is not None:
            vaddr = elf.vaddr_of_offset(file_offset)
            name = elf.name_at(vaddr) if vaddr is not None else None
            if name:
                return demangle(name).replace(";", ":")
        return f"[unknown] {m.short_name}+{file_offset:#x}"

    def code_frame(self, pid: int, addr: int) -> Frame:
        """A lock wait's code address: its function, placed by the unwind table, and
        whether it follows a call (remember_process(pid) first)."""
        info = self.processes.get(pid)
        m = self._mapping_of(info, addr) if info is not None else None
        if m is None or not m.is_file:
            return Frame(addr, "?", "[unknown]", 0, False)
        module = os.path.basename(m.path)
        file_offset = addr - m.start + m.offset
        elf = self._table_for(pid, m)
        funcs = elf.functions if elf is not None else None
        if elf is None or funcs is None:
            return Frame(addr, module, f"{module}+{file_offset:#x}", 0, False)
        vaddr = elf.vaddr_of_offset(file_offset)
        after_call = _is_after_call(elf.bytes_before(file_offset, 7))
        if vaddr is None:
            return Frame(addr, module, "[unknown]", 0, after_call)
        start, name = funcs.function_of(vaddr)
        if start is None:
            return Frame(addr, module, f"{module}+{vaddr:#x}", 0, after_call)
        return Frame(addr, module, name or f"{module}+{start:#x}", vaddr - start, after_call)

    def kernel_frame(self, addr: int) -> str:
        if self._kallsyms is None:
            self._kallsyms = Kallsyms()
        return self._kallsyms.lookup(addr).replace(";", ":")

    def user_stack(self, pid: int, addrs: list[int]) -> list[str]:
        """Frames root first; "[truncated]" first when the walk did not reach a thread root."""
        frames = [self.user_frame(pid, a) for a in reversed(addrs)]
        if frames and (len(addrs) >= MAX_STACK_DEPTH or not any(f in STACK_ROOTS for f in frames[:3])):
            frames.insert(0, TRUNCATED)
        return frames

    def thread_name(self, pid: int, tid: int) -> str:
        info = self.processes.get(pid)
        return info.threads.get(tid, f"thread {tid}") if info else f"thread {tid}"


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
