"""Naming user-space code addresses of a live process, at record time.

Why not bcc's BPF.sym: it picks the nearest preceding symbol without checking
its size, so an address in a static libc function (no .symtab in distribution
builds) comes out as the exported function before it, e.g. a wait inside
__futex_abstimed_wait_common is named "pthread_cond_signal+0x9f". Here every
address is first placed in its function using .eh_frame_hdr (every function
the compiler emitted has an unwind entry, named or not), and only a symbol
that starts that function names it; otherwise the frame is "module+0xSTART".

Also decides whether a word found on the stack is a return address: the
bytes before it must decode as a call instruction (E8 rel32, or FF /2 in one
of its register, memory, displacement forms). pyelftools reads the ELF
files; the instruction check is a few byte patterns, not worth a
disassembler dependency.

Reads /proc/PID/maps and the mapped files; runs while the target is alive
(`record`), so a recording carries names and `report` needs no access to
the traced host.
"""

from __future__ import annotations

import bisect
import io
import mmap
import os
import struct
from dataclasses import dataclass, field
from functools import lru_cache

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int
    path: str
    executable: bool


def read_maps(pid: int) -> list[Mapping]:
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.readlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        out.append(Mapping(lo, hi, int(parts[2], 16), parts[5].strip(), "x" in parts[1]))
    return out


def executable_ranges(pids: list[int]) -> list[tuple[int, int]]:
    """Merged executable file mappings of the targets (what a return address can point into)."""
    ranges = sorted((m.start, m.end) for pid in pids for m in read_maps(pid) if m.executable)
    merged: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _eh_frame_hdr_starts(elf: ELFFile) -> list[int]:
    """Function start addresses from .eh_frame_hdr's sorted search table."""
    sec = elf.get_section_by_name(".eh_frame_hdr")
    if sec is None:
        return []
    data = sec.data()
    if len(data) < 12 or data[0] != 1:
        return []
    table_enc = data[3]
    if table_enc != 0x3B:  # datarel | sdata4: what GNU ld writes; anything else: give up
        return []
    # eh_frame_ptr and fde_count have their own encodings; fde_count is udata4 (0x03) in practice
    pos = 4
    ptr_enc, count_enc = data[1], data[2]
    pos += 4 if (ptr_enc & 0x0F) in (0x03, 0x0B) else 8
    if (count_enc & 0x0F) not in (0x03, 0x0B):
        return []
    (count,) = struct.unpack_from("<I", data, pos)
    pos += 4
    base = sec["sh_addr"]
    starts = []
    for i in range(count):
        rel, _fde = struct.unpack_from("<ii", data, pos + 8 * i)
        starts.append(base + rel)
    return starts


class _MmapFile(io.RawIOBase):
    """A seekable read-only file over an mmap, for ELFFile."""

    def __init__(self, data: mmap.mmap):
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else (self._pos + pos if whence == 1 else len(self._data) + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        chunk = self._data[self._pos : end]
        self._pos += len(chunk)
        return chunk


@dataclass
class ElfFunctions:
    """The functions of one ELF file, in its own virtual addresses."""

    path: str
    starts: list[int] = field(default_factory=list)  # sorted function starts (unwind table)
    names: dict[int, str] = field(default_factory=dict)  # start -> symbol
    sym_starts: list[int] = field(default_factory=list)  # sorted symbol starts
    sym_ends: dict[int, int] = field(default_factory=dict)
    segments: list[tuple[int, int, int, int]] = field(default_factory=list)  # offset, filesz, vaddr, memsz
    data: bytes | mmap.mmap = b""

    def vaddr_of_offset(self, file_offset: int) -> int | None:
        for off, filesz, vaddr, _memsz in self.segments:
            if off <= file_offset < off + filesz:
                return file_offset - off + vaddr
        return None

    def bytes_before(self, file_offset: int, n: int) -> bytes:
        return self.data[max(0, file_offset - n) : file_offset]

    def function_of(self, vaddr: int) -> tuple[int | None, str | None]:
        """(start, name) of the function holding vaddr; name None when unnamed."""
        i = bisect.bisect_right(self.sym_starts, vaddr) - 1
        if i >= 0:
            s = self.sym_starts[i]
            if vaddr < self.sym_ends[s]:
                return s, self.names[s]
        j = bisect.bisect_right(self.starts, vaddr) - 1
        if j >= 0:
            return self.starts[j], self.names.get(self.starts[j])
        return None, None


@lru_cache(maxsize=64)
def elf_functions(path: str) -> ElfFunctions | None:
    try:
        # mapped, not read: large libraries (CUDA, torch) are gigabytes, and
        # only their headers, symbol tables and a few bytes per address are used
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        elf = ELFFile(_MmapFile(data))
        funcs = ElfFunctions(path=path, data=data)
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD":
                funcs.segments.append((seg["p_offset"], seg["p_filesz"], seg["p_vaddr"], seg["p_memsz"]))
        for secname in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(secname)
            if sec is None:
                continue
            for sym in sec.iter_symbols():
                if sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC") or not sym["st_value"]:
                    continue
                start = sym["st_value"]
                # prefer the unversioned, shortest public name for aliases
                name = sym.name.split("@")[0]
                old = funcs.names.get(start)
                if old is None or (old.startswith("_") and not name.startswith("_")):
                    funcs.names[start] = name
                funcs.sym_ends[start] = max(funcs.sym_ends.get(start, 0), start + max(sym["st_size"], 1))
        funcs.sym_starts = sorted(funcs.sym_ends)
        funcs.starts = _eh_frame_hdr_starts(elf)
        return funcs
    except (OSError, ELFError, ValueError, struct.error):
        return None


def _is_after_call(before: bytes) -> bool:
    """Do the bytes just before a return address end with a call instruction?"""
    n = len(before)
    if n >= 5 and before[-5] == 0xE8:
        return True
    for k in (2, 3, 4, 6, 7):  # FF /2 with register, [reg], disp8, SIB, disp32 / rip-relative
        if n >= k and before[-k] == 0xFF and ((before[-k + 1] >> 3) & 7) == 2:
            return True
    return False


@dataclass(frozen=True)
class Frame:
    addr: int
    module: str  # file name of the mapping, "?" when not file-backed
    function: str  # symbol, or module+0xSTART for an unnamed function, or "[unknown]"
    offset: int  # addr - function start
    after_call: bool  # the bytes before addr are a call (it can be a return address)

    def as_dict(self) -> dict:
        return {"addr": self.addr, "module": self.module, "function": self.function,
                "offset": self.offset, "after_call": self.after_call}


class ProcessSymbols:
    """Per-pid cache: maps read once, each ELF parsed once (elf_functions)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.maps = read_maps(pid)
        self._starts = [m.start for m in self.maps]
        self._cache: dict[int, Frame] = {}

    def resolve(self, addr: int) -> Frame:
        frame = self._cache.get(addr)
        if frame is None:
            frame = self._cache[addr] = self._resolve(addr)
        return frame

    def _resolve(self, addr: int) -> Frame:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0 or addr >= self.maps[i].end:
            return Frame(addr, "?", "[unknown]", 0, False)
        m = self.maps[i]
        module = os.path.basename(m.path)
        file_offset = addr - m.start + m.offset
        funcs = elf_functions(m.path)
        if funcs is None:
            return Frame(addr, module, f"{module}+{file_offset:#x}", 0, False)
        vaddr = funcs.vaddr_of_offset(file_offset)
        after_call = _is_after_call(funcs.bytes_before(file_offset, 7))
        if vaddr is None:
            return Frame(addr, module, "[unknown]", 0, after_call)
        start, name = funcs.function_of(vaddr)
        if start is None:
            return Frame(addr, module, f"{module}+{vaddr:#x}", 0, after_call)
        return Frame(addr, module, name or f"{module}+{start:#x}", vaddr - start, after_call)
