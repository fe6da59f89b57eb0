"""Where CPython's _PyRuntime lies in a live process, and which version it is.

The Python frame walk (collector/binaries/python_threads.py) starts from _PyRuntime:
its interpreter list leads to every thread state. The locks set uses its
extent, for this reason:

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
import re
from dataclasses import dataclass

from inferprobe.collector.binaries.elf_symbols import data_symbols_matching, elf_file, position_independent
from inferprobe.collector.processes.proc_maps import read_maps

SYMBOL = "_PyRuntime"
VERSION_SYMBOL = "Py_Version"  # const unsigned long, PY_VERSION_HEX (3.11+)
_VERSION_IN_NAME = re.compile(r"python(\d)\.(\d+)")


@dataclass(frozen=True)
class Interpreter:
    """The CPython a process runs, as its mappings and ELF symbols tell."""

    path: str  # the executable or libpython defining _PyRuntime (as the process sees it)
    runtime: int  # address of _PyRuntime in the process
    runtime_size: int
    version_addr: int | None  # address of Py_Version, where the build exports it
    name_version: tuple[int, int] | None  # the version in the file's name (python3.11, libpython3.11.so)


def _is_candidate(path: str) -> bool:
    # An interpreter binary (python3.11) or libpython3.11.so.1.0: other
    # libraries (CUDA, torch) are large and never define the symbol.
    name = os.path.basename(path)
    return name.startswith("python") or name.startswith("libpython")


def _symbols(path: str) -> tuple[dict[str, tuple[int, int]], bool] | None:
    """{name: (value, size)} of SYMBOL and VERSION_SYMBOL in path, and whether it is position-independent."""
    relocated = position_independent(path)
    if relocated is None:
        return None
    found: dict[str, tuple[int, int]] = {}
    for sym in data_symbols_matching(path, f"^({SYMBOL}|{VERSION_SYMBOL})$"):
        if sym.size:
            found.setdefault(sym.name, (sym.value, sym.size))
    return (found, relocated) if SYMBOL in found else None


def candidate_files(pid: int) -> list[str]:
    """The files pid maps that could define _PyRuntime (python*, libpython*), as it sees them."""
    return list(dict.fromkeys(m.path for m in read_maps(pid) if _is_candidate(m.path)))


def find_interpreter(pid: int) -> Interpreter | None:
    """The CPython in pid's address space, or None (not CPython, or its symbols are stripped)."""
    maps = [m for m in read_maps(pid) if _is_candidate(m.path)]
    for path in dict.fromkeys(m.path for m in maps):
        host_path = f"/proc/{pid}/root{path}"
        found = _symbols(host_path)
        if found is None:
            continue
        symbols, relocated = found
        bias = 0
        if relocated:
            first = min((m for m in maps if m.path == path), key=lambda m: m.start)
            elf = elf_file(host_path)
            vaddr = elf.vaddr_of_offset(first.offset) if elf is not None else None
            if vaddr is None:
                continue
            bias = first.start - vaddr
        value, size = symbols[SYMBOL]
        version = symbols.get(VERSION_SYMBOL)
        named = _VERSION_IN_NAME.search(os.path.basename(path))
        return Interpreter(path, bias + value, size, bias + version[0] if version else None,
                           (int(named.group(1)), int(named.group(2))) if named else None)
    return None


def image_of(pid: int) -> tuple[str, str] | None:
    """What find_interpreter's answer for pid depends on, read cheaply (two small /proc files,
    where find_interpreter reads the maps and scans symbol tables: tens of ms): the executable
    (an exec changes it) and the size of its mapped library code (VmLib: the dynamic loader
    mapping libpython, or a dlopen, changes it). None when pid is gone.

    A negative answer (no CPython in the process yet) holds only while this stays the same: a
    process caught between fork and exec, or before the dynamic loader mapped libpython (a
    shared build, pyenv's), has no _PyRuntime at that moment and has one a moment later. On a
    loaded host that moment lasts seconds (measured here: 1.3 s for a pyenv python3 started at
    nice 15 beside two busy loops)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    try:
        with open(f"/proc/{pid}/status") as f:
            vmlib = next((line.split(":", 1)[1].strip() for line in f if line.startswith("VmLib:")), "")
    except OSError:
        return None
    return exe, vmlib


def runtime_range(pid: int) -> tuple[int, int] | None:
    """[start, end) of _PyRuntime in pid's address space, or None (not CPython)."""
    interp = find_interpreter(pid)
    return (interp.runtime, interp.runtime + interp.runtime_size) if interp is not None else None
