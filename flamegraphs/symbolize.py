"""Addresses to names: the only module that reads /proc/PID/maps, ELF files,
perf map files and /proc/kallsyms.

Why not bcc's resolver: it reads a process's maps when asked, so it cannot
name frames of a process that exited before the recording stopped, and it
gives no file offset for what it cannot name. Here every target's maps are
remembered while it lives (remember_process(), called at start and once a
second by the recorder) and ELF symbol tables are read with pyelftools from
the files themselves, so a frame of an exited process still resolves, and an
unresolved frame keeps its library and offset: `[unknown] libfoo.so+0x1a2b`.

Frame names carry their kind the way flamegraph.pl and bcc's folded output
do: kernel frames end in "_[k]"; CPython perf-trampoline frames start with
"py::" (that is how CPython names them in /tmp/perf-PID.map).
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

KERNEL_SUFFIX = "_[k]"
TRUNCATED = "[truncated]"
# Outermost user frames of a complete frame-pointer walk: program entry and
# thread start. A stack that reaches none of them was cut short (code built
# without frame pointers broke the chain, or the walk hit its depth limit).
STACK_ROOTS = frozenset({
    "_start", "__libc_start_main", "__libc_start_call_main", "start_thread", "clone", "clone3",
    "__clone", "__clone3", "thread_start", "__GI___clone3", "__GI___clone",
})
MAX_STACK_DEPTH = 127  # PERF_MAX_STACK_DEPTH: a walk this deep was cut by the kernel

PYTHON_EXE = re.compile(r"python3?(\.\d+)?$")
PYTHON_HOWTO = (
    "Python frames are not resolved: run the target with CPython 3.12+ and "
    "`python -X perf` or PYTHONPERFSUPPORT=1 so it writes /tmp/perf-PID.map"
)


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    offset: int
    path: str  # "" for anonymous memory

    @property
    def is_file(self) -> bool:
        return self.path.startswith("/")

    @property
    def short_name(self) -> str:
        name = self.path.removesuffix(" (deleted)")
        return os.path.basename(name) if self.is_file else (name or "[anon]")


def parse_maps(text: str) -> list[Mapping]:
    """Executable mappings of a /proc/PID/maps text, sorted by address."""
    maps = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or "x" not in parts[1]:
            continue
        start, end = (int(v, 16) for v in parts[0].split("-"))
        maps.append(Mapping(start, end, int(parts[2], 16), parts[5].strip() if len(parts) > 5 else ""))
    maps.sort(key=lambda m: m.start)
    return maps


@dataclass
class SymbolTable:
    """Sorted (address, size, name) of one ELF file, in its own virtual addresses."""

    addrs: list[int]
    sizes: list[int]
    names: list[str]
    loads: list[tuple[int, int, int]]  # PT_LOAD (p_offset, p_filesz, p_vaddr)

    def vaddr_of(self, file_offset: int) -> int | None:
        for p_offset, p_filesz, p_vaddr in self.loads:
            if p_offset <= file_offset < p_offset + p_filesz:
                return file_offset - p_offset + p_vaddr
        return None

    def lookup(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self.addrs, vaddr) - 1
        if i < 0:
            return None
        size = self.sizes[i]
        if size and vaddr >= self.addrs[i] + size:
            return None  # in a gap between symbols
        return self.names[i]


def _debug_file_for(elf) -> str | None:
    """Separate debug symbols (/usr/lib/debug/.build-id/xx/rest.debug), if installed."""
    note = elf.get_section_by_name(".note.gnu.build-id")
    if note is None:
        return None
    for n in note.iter_notes():
        if n["n_type"] == "NT_GNU_BUILD_ID":
            build_id = n["n_desc"]
            path = f"/usr/lib/debug/.build-id/{build_id[:2]}/{build_id[2:]}.debug"
            return path if os.path.exists(path) else None
    return None


def _read_symbols(path: str, loads_from: list | None = None) -> SymbolTable | None:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            loads = loads_from if loads_from is not None else [
                (seg["p_offset"], seg["p_filesz"], seg["p_vaddr"])
                for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"
            ]
            entries: dict[int, tuple[int, str]] = {}
            for section_name in (".dynsym", ".symtab"):  # .symtab wins where both name an address
                section = elf.get_section_by_name(section_name)
                if not isinstance(section, SymbolTableSection):
                    continue  # absent, or stripped to NOBITS in a debug file
                for sym in section.iter_symbols():
                    if sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC") or not sym.name:
                        continue
                    if sym["st_shndx"] == "SHN_UNDEF" or not sym["st_value"]:
                        continue
                    entries[sym["st_value"]] = (sym["st_size"], sym.name.split("@", 1)[0])
            if loads_from is None and ".symtab" not in {s.name for s in elf.iter_sections()}:
                debug = _debug_file_for(elf)
                if debug:
                    extra = _read_symbols(debug, loads_from=loads)
                    if extra:
                        for a, s, n in zip(extra.addrs, extra.sizes, extra.names, strict=True):
                            entries[a] = (s, n)
    except (OSError, ELFError, ValueError):
        return None
    addrs = sorted(entries)
    return SymbolTable(addrs, [entries[a][0] for a in addrs], [entries[a][1] for a in addrs], loads)


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


class Symbolizer:
    """Per-process maps and per-file symbol tables, kept for the whole recording."""

    def __init__(self) -> None:
        self.processes: dict[int, ProcessInfo] = {}
        self._tables: dict[tuple, SymbolTable | None] = {}
        self._kallsyms: Kallsyms | None = None

    # -- what the targets look like while they live

    def remember_process(self, pid: int) -> None:
        """Reads pid's maps, threads and perf map now (they vanish when it exits)."""
        maps_text = _read(f"/proc/{pid}/maps")
        if maps_text is None:
            return  # already gone: keep what we had
        info = self.processes.get(pid)
        comm = (_read(f"/proc/{pid}/comm") or "?").strip()
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        maps = parse_maps(maps_text)
        if info is None:
            info = ProcessInfo(pid, comm, exe, maps)
            self.processes[pid] = info
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
        perf_text = _read(f"/proc/{pid}/root/tmp/perf-{pid}.map") or _read(f"/tmp/perf-{pid}.map")
        if perf_text is not None:
            info.perf_map = PerfMap.parse(perf_text)
        for m in maps:
            if m.is_file:
                self._table_for(pid, m)  # read ELF files while /proc/PID/root still leads to them

    # -- resolution

    def _table_for(self, pid: int, m: Mapping) -> SymbolTable | None:
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
                self._tables[key] = _read_symbols(candidate)
            self._tables[(pid, m.path)] = self._tables[key]
            return self._tables[key]
        return self._tables.get((pid, m.path))

    def user_frame(self, pid: int, addr: int) -> str:
        info = self.processes.get(pid)
        if info is None:
            return f"[unknown] {addr:#x}"
        starts = [m.start for m in info.maps]
        i = bisect.bisect_right(starts, addr) - 1
        m = info.maps[i] if i >= 0 and addr < info.maps[i].end else None
        if m is None or not m.is_file:
            if info.perf_map is not None:
                name = info.perf_map.lookup(addr)
                if name:
                    return name.replace(";", ":")
            where = m.short_name if m is not None else "[anon]"
            return f"[unknown] {where}+{addr - (m.start if m else 0):#x}"
        file_offset = addr - m.start + m.offset
        table = self._table_for(pid, m)
        if table is not None:
            vaddr = table.vaddr_of(file_offset)
            name = table.lookup(vaddr) if vaddr is not None else None
            if name:
                return demangle(name).replace(";", ":")
        return f"[unknown] {m.short_name}+{file_offset:#x}"

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
