"""The one reader of ELF files: load segments, function symbols, unwind-table function starts.

pyelftools reads each file through an mmap: large libraries (CUDA, torch)
are gigabytes, and only their headers, symbol tables and a few bytes per
address are used.

Two questions are asked of a file, and they are answered differently on purpose:

- name_at(vaddr), for flame-graph frames: the symbol whose range holds the
  address (a size-0 symbol holds it up to the next one), .symtab winning over
  .dynsym where both name an address, with separate debug symbols
  (/usr/lib/debug/.build-id) when the file has no .symtab of its own.
- function_of(vaddr), for the code addresses of lock waits, where a wrong name
  misclassifies a wait. bcc's BPF.sym picks the nearest preceding symbol
  without checking its size, so an address in a static libc function (no
  .symtab in distribution builds) comes out as the exported function before
  it, e.g. a wait inside __futex_abstimed_wait_common is named
  "pthread_cond_signal+0x9f". Here the address is first placed in its function
  using .eh_frame_hdr (every function the compiler emitted has an unwind
  entry, named or not), and only a symbol that starts that function names it;
  aliases are named by their unversioned, shortest public name.
"""

from __future__ import annotations

import bisect
import io
import mmap
import os
import re
import struct
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import IO, NamedTuple, cast

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection

FUNCTION_TYPES = ("STT_FUNC", "STT_GNU_IFUNC")
_STT_OBJECT, _STT_FUNC, _STT_GNU_IFUNC = 1, 2, 10


class FunctionSymbol(NamedTuple):
    name: str  # as written, version suffix ("@GLIBC_2.2.5") included
    value: int
    size: int
    defined: bool  # not SHN_UNDEF


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


@contextmanager
def _mapped_elf(path: str) -> Iterator[tuple[mmap.mmap, ELFFile] | None]:
    """The file mapped and opened as ELF, unmapped on the way out; None when it cannot be
    opened. ELFFile's own complaints (ELFError, ...) reach the caller."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        yield None
        return
    try:
        yield data, ELFFile(cast(IO[bytes], _MmapFile(data)))
    finally:
        data.close()


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


def _build_id(elf: ELFFile) -> str | None:
    note = elf.get_section_by_name(".note.gnu.build-id")
    if not isinstance(note, NoteSection):
        return None
    for n in note.iter_notes():
        if n["n_type"] == "NT_GNU_BUILD_ID":
            return n["n_desc"]
    return None


@dataclass
class SymbolTable:
    """Sorted (address, size, name): the flame-graph view of a file's function symbols."""

    addrs: list[int]
    sizes: list[int]
    names: list[str]

    def lookup(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self.addrs, vaddr) - 1
        if i < 0:
            return None
        size = self.sizes[i]
        if size and vaddr >= self.addrs[i] + size:
            return None  # in a gap between symbols
        return self.names[i]


@dataclass
class ElfFunctions:
    """The lock-wait view of a file's functions, in its own virtual addresses."""

    starts: list[int] = field(default_factory=list)  # sorted function starts (unwind table)
    names: dict[int, str] = field(default_factory=dict)  # start -> symbol
    sym_starts: list[int] = field(default_factory=list)  # sorted symbol starts
    sym_ends: dict[int, int] = field(default_factory=dict)

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


@dataclass
class ElfFile:
    """What the symbolizer and the probe sets read from one ELF file."""

    path: str
    data: mmap.mmap
    segments: list[tuple[int, int, int, int]]  # PT_LOAD (offset, filesz, vaddr, memsz)
    build_id: str | None

    # The symbol and unwind tables are read when first asked for: they are most of the
    # parse (a second for a 43 MB Go binary), and the Go TLS analysis needs neither.

    @cached_property
    def symbols(self) -> dict[str, list[FunctionSymbol]]:
        """".symtab" / ".dynsym" -> its function symbols; empty where they cannot be read."""
        symbols: dict[str, list[FunctionSymbol]] = {}
        try:
            elf = ELFFile(cast(IO[bytes], _MmapFile(self.data)))
            for section_name in (".symtab", ".dynsym"):
                section = elf.get_section_by_name(section_name)
                if not isinstance(section, SymbolTableSection):
                    continue  # absent, or stripped to NOBITS in a debug file
                symbols[section_name] = [
                    FunctionSymbol(sym.name, sym["st_value"], sym["st_size"], sym["st_shndx"] != "SHN_UNDEF")
                    for sym in section.iter_symbols() if sym["st_info"]["type"] in FUNCTION_TYPES
                ]
        except (ELFError, ValueError, struct.error):
            return {}
        return symbols

    @cached_property
    def unwind_starts(self) -> list[int] | None:
        """Function starts from .eh_frame_hdr; None when it could not be read."""
        try:
            return _eh_frame_hdr_starts(ELFFile(cast(IO[bytes], _MmapFile(self.data))))
        except (ELFError, ValueError, struct.error):
            return None

    def vaddr_of_offset(self, file_offset: int) -> int | None:
        for off, filesz, vaddr, _memsz in self.segments:
            if off <= file_offset < off + filesz:
                return file_offset - off + vaddr
        return None

    def offset_of_vaddr(self, vaddr: int) -> int | None:
        """File offset of a virtual address in a loaded segment's file bytes (None past them)."""
        for off, filesz, seg_vaddr, _memsz in self.segments:
            if seg_vaddr <= vaddr < seg_vaddr + filesz:
                return vaddr - seg_vaddr + off
        return None

    def bytes_at(self, vaddr: int, size: int) -> bytes:
        """Up to size bytes of the loaded image at vaddr, not past its segment's file bytes;
        b"" outside them."""
        for off, filesz, seg_vaddr, _memsz in self.segments:
            if seg_vaddr <= vaddr < seg_vaddr + filesz:
                at = off + vaddr - seg_vaddr
                return bytes(self.data[at : at + min(size, seg_vaddr + filesz - vaddr)])
        return b""

    def bytes_before(self, file_offset: int, n: int) -> bytes:
        return self.data[max(0, file_offset - n) : file_offset]

    # -- the flame-graph view

    @cached_property
    def name_table(self) -> SymbolTable:
        entries = self._name_entries()
        if ".symtab" not in self.symbols:
            debug = _debug_file(self.build_id)
            if debug is not None:
                entries.update(debug._name_entries())
        addrs = sorted(entries)
        return SymbolTable(addrs, [entries[a][0] for a in addrs], [entries[a][1] for a in addrs])

    def _name_entries(self) -> dict[int, tuple[int, str]]:
        entries: dict[int, tuple[int, str]] = {}
        for section in (".dynsym", ".symtab"):  # .symtab wins where both name an address
            for sym in self.symbols.get(section, ()):
                if sym.name and sym.defined and sym.value:
                    entries[sym.value] = (sym.size, sym.name.split("@", 1)[0])
        return entries

    def name_at(self, vaddr: int) -> str | None:
        return self.name_table.lookup(vaddr)

    # -- the lock-wait view

    @cached_property
    def functions(self) -> ElfFunctions | None:
        if self.unwind_starts is None:
            return None
        funcs = ElfFunctions(starts=self.unwind_starts)
        for section in (".symtab", ".dynsym"):
            for sym in self.symbols.get(section, ()):
                if not sym.value:
                    continue
                start = sym.value
                # prefer the unversioned, shortest public name for aliases
                name = sym.name.split("@")[0]
                old = funcs.names.get(start)
                if old is None or (old.startswith("_") and not name.startswith("_")):
                    funcs.names[start] = name
                funcs.sym_ends[start] = max(funcs.sym_ends.get(start, 0), start + max(sym.size, 1))
        funcs.sym_starts = sorted(funcs.sym_ends)
        return funcs


def read_elf(path: str) -> ElfFile | None:
    """Parses path once; None when it is no readable ELF file."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        elf = ELFFile(cast(IO[bytes], _MmapFile(data)))
        segments = [(seg["p_offset"], seg["p_filesz"], seg["p_vaddr"], seg["p_memsz"])
                    for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"]
        build_id = _build_id(elf)
    except (OSError, ELFError, ValueError, struct.error):
        return None
    return ElfFile(path, data, segments, build_id)


def _debug_file(build_id: str | None) -> ElfFile | None:
    """Separate debug symbols (/usr/lib/debug/.build-id/xx/rest.debug), if installed."""
    if not build_id:
        return None
    path = f"/usr/lib/debug/.build-id/{build_id[:2]}/{build_id[2:]}.debug"
    return read_elf(path) if os.path.exists(path) else None


def elf_file(path: str) -> ElfFile | None:
    """read_elf, remembered by file: for the probe sets' one-off lookups (libc, libpython).

    Callers name a process's file through its /proc/PID/root, a new path for every
    process: kept by path, an agent watching servers restart mapped the same libssl once
    per process (64 copies at the cache's bound). By (device, inode, mtime) it is once."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    identity = (st.st_dev, st.st_ino, st.st_mtime_ns)
    if identity in _ELF_FILES:
        _ELF_FILES.move_to_end(identity)
        return _ELF_FILES[identity]
    elf = _ELF_FILES[identity] = read_elf(path)
    if len(_ELF_FILES) > ELF_FILES_KEPT:   # bounded: the least recently asked for goes (and its mmap)
        _ELF_FILES.popitem(last=False)
    return elf


ELF_FILES_KEPT = 64
_ELF_FILES: OrderedDict[tuple[int, int, int], ElfFile | None] = OrderedDict()


# -- the USDT view

@lru_cache(maxsize=512)
def usdt_probes(path: str, file_key: tuple[int, int] | None = None) -> frozenset[tuple[str, str]]:
    """The (provider, name) of every USDT probe in the file's .note.stapsdt; empty
    when it has none or is no readable ELF. file_key ((st_dev, st_ino)) keeps
    the cache honest for a path that now names another file.

    Only the note section is read: where each probe sits and how its
    arguments are read, libbpf takes from the same notes when it attaches."""
    try:
        with _mapped_elf(path) as mapped:
            if mapped is None:
                return frozenset()
            _data, elf = mapped
            section = elf.get_section_by_name(".note.stapsdt")
            if not isinstance(section, NoteSection):
                return frozenset()
            address_bytes = 8 if elf.elfclass == 64 else 4
            found = set()
            for note in section.iter_notes():
                desc = note["n_desc"]
                # Owner "stapsdt" has one note type (3, which pyelftools names after GNU's build id).
                if note["n_name"] != "stapsdt" or not isinstance(desc, bytes):
                    continue
                # pc, base, semaphore addresses, then provider\0name\0arguments\0
                provider, name, *_ = desc[3 * address_bytes:].split(b"\0")
                found.add((provider.decode(errors="replace"), name.decode(errors="replace")))
            return frozenset(found)
    except (ELFError, ValueError, struct.error):
        return frozenset()


# -- the uprobe view

def code_at(path: str, vaddr: int, size: int) -> bytes:
    """Up to size bytes of the file's loaded image at virtual address vaddr, for a look at
    the first instructions of a function about to be probed; b"" outside the file's bytes
    or for a file that is no readable ELF (read_elf reads no more than the headers)."""
    elf = read_elf(path)
    return elf.bytes_at(vaddr, size) if elf is not None else b""


class ElfSymbol(NamedTuple):
    name: str
    value: int  # its ELF virtual address
    size: int


def functions_matching(path: str, pattern: str) -> list[tuple[str, int]]:
    """(name, ELF address) of each defined function symbol whose name the regular
    expression finds (symbols_matching)."""
    return [(sym.name, sym.value) for sym in symbols_matching(path, pattern)]


def symbols_matching(path: str, pattern: str,
                     types: tuple[int, ...] = (_STT_FUNC, _STT_GNU_IFUNC),
                     tables: tuple[str, ...] = (".symtab", ".dynsym"),
                     needle: bytes | None = None) -> list[ElfSymbol]:
    """Each defined symbol of these types (functions by default) in the file's .symtab
    and .dynsym whose name the regular expression finds, in table order (a name both
    tables hold comes twice); empty for a file that is no readable ELF.

    What the probe sets hook (OpenSSL's SSL_*, llama.cpp's API, CUDA's) and what the
    Python walker reads (_PyRuntime), by name. Written on the raw tables rather than
    read_elf's because only a few names are wanted from files that hold up to ~150,000
    symbols (Node's binary): unpacking the table and reading the names of the symbols of
    those types alone takes ~0.1 s there, where making a pyelftools object per symbol
    took 3.5 s. Separate debug files are not read: every symbol asked for is exported
    or in the file's own .symtab.

    tables limits the walk to some of the two; needle, a string every wanted name holds,
    skips a table whose names do not hold it without unpacking its symbols (one search of
    the string table, for names looked for in every file a process maps)."""
    regex = re.compile(pattern.encode())
    try:
        with _mapped_elf(path) as mapped:
            return _matching(*mapped, regex, types, tables, needle) if mapped is not None else []
    except (ELFError, ValueError, struct.error):
        return []


def _matching(data: mmap.mmap, elf: ELFFile, regex: re.Pattern[bytes], types: tuple[int, ...],
              tables: tuple[str, ...], needle: bytes | None) -> list[ElfSymbol]:
    """symbols_matching's walk of one mapped file's two symbol tables."""
    order = "<" if elf.little_endian else ">"
    # Elf64_Sym: name, info, other, shndx, value, size; Elf32_Sym: name, value, size, info, other, shndx
    fmt, fields = ((order + "IBBHQQ", (0, 1, 3, 4, 5)) if elf.elfclass == 64
                   else (order + "IIIBBH", (0, 3, 5, 1, 2)))
    i_name, i_info, i_shndx, i_value, i_size = fields
    found: list[ElfSymbol] = []
    for section_name in tables:
        section = elf.get_section_by_name(section_name)
        if not isinstance(section, SymbolTableSection) or section["sh_type"] == "SHT_NOBITS":
            continue
        strtab = elf.get_section(section["sh_link"])
        start, end = strtab["sh_offset"], strtab["sh_offset"] + strtab["sh_size"]
        if needle is not None and data.find(needle, start, end) < 0:
            continue   # searched in place: a copy of libtorch's names alone is ~100 MB
        names = data[start:end]
        table = data[section["sh_offset"] : section["sh_offset"] + section["sh_size"]]
        table = table[: len(table) - len(table) % struct.calcsize(fmt)]
        for sym in struct.iter_unpack(fmt, table):
            if not sym[i_value] or not sym[i_shndx] or (sym[i_info] & 0xF) not in types:
                continue
            start = sym[i_name]
            name = names[start : names.find(b"\0", start)]
            if regex.search(name):
                found.append(ElfSymbol(name.decode(errors="replace"), sym[i_value], sym[i_size]))
    return found


def data_symbols_matching(path: str, pattern: str) -> list[ElfSymbol]:
    """symbols_matching for data objects (STT_OBJECT)."""
    return symbols_matching(path, pattern, (_STT_OBJECT,))


def has_symtab(path: str) -> bool:
    """Whether the file keeps its full symbol table (.symtab: not stripped), from its
    section headers alone: a few hundred bytes read, where opening it with pyelftools
    costs a millisecond or more, for a question asked of every file a process maps."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:   # ELF64 only
                return False
            order = "<" if head[5] == 1 else ">"
            shoff, = struct.unpack(order + "Q", head[40:48])
            shentsize, shnum = struct.unpack(order + "HH", head[58:62])
            if not shoff or shentsize < 8 or not shnum:
                return False
            headers = os.pread(f.fileno(), shentsize * shnum, shoff)
    except OSError:
        return False
    return any(struct.unpack_from(order + "I", headers, at + 4)[0] == 2   # sh_type SHT_SYMTAB
               for at in range(0, len(headers) - shentsize + 1, shentsize))


def position_independent(path: str) -> bool | None:
    """Whether the file is loaded where the kernel or the dynamic loader chooses (ET_DYN:
    a library, a PIE) rather than at its own addresses (ET_EXEC); None when it is no
    readable ELF. Reads the 18 bytes of the header that say."""
    try:
        with open(path, "rb") as f:
            head = f.read(18)
    except OSError:
        return None
    if len(head) < 18 or head[:4] != b"\x7fELF":
        return None
    e_type = struct.unpack("<H" if head[5] == 1 else ">H", head[16:18])[0]
    return e_type != 2  # ET_EXEC
