"""Where CPython's _PyRuntime lies in a live process: the GIL's own futex words.

CPython 3.11 keeps the GIL's condition variable and mutex (and the
forced-switch pair) inline in the _PyRuntime global (ceval.gil); every other
lock of the runtime there is a pointer to a heap semaphore (PyThread_type_lock).
So a futex word inside _PyRuntime is the GIL's: a thread waiting on the GIL's
mutex for a few microseconds, too short for the stack scan, is known as a GIL
wait by its address alone (analyzers/locks.py, docs/locks.md).

Looked up at record time, while the process exists, in the executables and
libpython libraries it maps (opened through /proc/PID/root, so a process in
a container is read from its own files).
"""

from __future__ import annotations

import os

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from inferprobe.collector.elf_symbols import elf_file
from inferprobe.collector.proc_maps import read_maps

SYMBOL = "_PyRuntime"


def _is_candidate(path: str) -> bool:
    # An interpreter binary (python3.11) or libpython3.11.so.1.0: other
    # libraries (CUDA, torch) are large and never define the symbol.
    name = os.path.basename(path)
    return name.startswith("python") or name.startswith("libpython")


def _symbol(path: str) -> tuple[int, int, bool] | None:
    """(value, size, position-independent) of SYMBOL in path's symbol tables."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for secname in (".dynsym", ".symtab"):
                sec = elf.get_section_by_name(secname)
                found = sec.get_symbol_by_name(SYMBOL) if isinstance(sec, SymbolTableSection) else None
                for sym in found or ():
                    if sym["st_info"]["type"] == "STT_OBJECT" and sym["st_value"] and sym["st_size"]:
                        return sym["st_value"], sym["st_size"], elf["e_type"] != "ET_EXEC"
    except (OSError, ELFError, ValueError):
        return None
    return None


def runtime_range(pid: int) -> tuple[int, int] | None:
    """[start, end) of _PyRuntime in pid's address space, or None (not CPython)."""
    maps = [m for m in read_maps(pid) if _is_candidate(m.path)]
    for path in dict.fromkeys(m.path for m in maps):
        host_path = f"/proc/{pid}/root{path}"
        found = _symbol(host_path)
        if found is None:
            continue
        value, size, relocated = found
        bias = 0
        if relocated:
            first = min((m for m in maps if m.path == path), key=lambda m: m.start)
            elf = elf_file(host_path)
            vaddr = elf.vaddr_of_offset(first.offset) if elf is not None else None
            if vaddr is None:
                continue
            bias = first.start - vaddr
        return bias + value, bias + value + size
    return None
