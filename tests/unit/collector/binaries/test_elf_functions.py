"""elf_symbols.functions_matching: the symbol lookup the uprobe sets hook by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from inferprobe.collector.binaries.elf_symbols import (
    data_symbols_matching,
    functions_matching,
    position_independent,
)
from inferprobe.collector.processes.proc_maps import read_maps

OPENSSL = r"^SSL_(read|write)(_ex)?$|^SSL_(do_handshake|connect|accept|free)$"


def _libc_path() -> str:
    return next(m.path for m in read_maps(os.getpid()) if os.path.basename(m.path).startswith("libc.so"))


# Run in a fresh interpreter: in the suite's own process, earlier tests leave read-only
# mmaps of libc (elf_symbols.elf_file keeps the files it parsed mapped), which show in
# /proc/self/maps under libc's path, so the lowest mapping of that path is no longer the
# loaded image (a CI run: 342 MB off).
_RESOLVED = """
import ctypes, json, os, sys
maps = [line.split() for line in open("/proc/self/maps")]
libc = next(m[5] for m in maps if len(m) > 5 and os.path.basename(m[5]).startswith("libc.so"))
bias = min(int(m[0].split("-")[0], 16) - int(m[2], 16) for m in maps if len(m) > 5 and m[5] == libc)
lib = ctypes.CDLL(libc)
print(json.dumps({"libc": libc, "bias": bias,
                  "at": {n: ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in sys.argv[1:]}}))
"""


def test_each_address_is_where_the_dynamic_loader_put_the_function():
    """The ELF address of sem_post and pthread_mutex_lock, plus libc's load bias in a fresh
    process (its first mapping's start), is the address ctypes resolves them to there."""
    names = ("sem_post", "pthread_mutex_lock")
    out = subprocess.run([sys.executable, "-c", _RESOLVED, *names], capture_output=True, text=True,
                         check=True)
    child = json.loads(out.stdout)
    found = dict(functions_matching(child["libc"], r"^(sem_post|pthread_mutex_lock)$"))
    assert set(found) == set(names)
    for name, vaddr in found.items():
        assert child["bias"] + vaddr == child["at"][name], name


def test_the_same_functions_as_bccs_lookup():
    """What the probe sets asked bcc before: the same (name, address) pairs, on OpenSSL,
    libc, and a large binary's ~150,000 symbols where it has one (Node)."""
    bcc = pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is the reference here")
    cases = [(_libc_path(), r"^(sem_init|sem_post|sem_trywait)$"), (sys.executable, r"^Py_(Initialize|Main)")]
    libssl = "/usr/lib/x86_64-linux-gnu/libssl.so.3"
    if os.path.exists(libssl):
        cases.append((libssl, OPENSSL))
    if node := shutil.which("node"):
        cases += [(os.path.realpath(node), OPENSSL), (os.path.realpath(node), r"^uv_tcp_")]
    for path, pattern in cases:
        ours = sorted(functions_matching(path, pattern))
        theirs = sorted((name.decode(), address)
                        for name, address in bcc.BPF.get_user_functions_and_addresses(path.encode(), pattern))
        assert ours == theirs, path


def test_a_file_that_is_no_elf_has_no_functions(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("SSL_read\n")
    assert functions_matching(str(text), OPENSSL) == []
    assert functions_matching(str(tmp_path / "absent"), OPENSSL) == []


_RUNTIME = """
import ctypes, json
print(json.dumps({"maps": open("/proc/self/maps").read(),
                  "at": ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))}))
"""


def test_an_interpreters_runtime_state_is_found_as_data():
    """_PyRuntime, a data object (what the Python walker reads), plus the load bias of the
    file that defines it, is the address a fresh interpreter resolves it to (fresh, as
    above: no mmap of the file beside its loaded image)."""
    out = subprocess.run([sys.executable, "-c", _RUNTIME], capture_output=True, text=True, check=True)
    child = json.loads(out.stdout)
    maps = [line.split() for line in child["maps"].splitlines()]
    files = [(int(m[0].split("-")[0], 16), int(m[2], 16), m[5]) for m in maps if len(m) > 5]
    for _start, offset, path in files:
        symbols = data_symbols_matching(path, r"^_PyRuntime$") if offset == 0 else []
        if symbols:
            break
    else:
        pytest.skip("this interpreter's _PyRuntime is in no file with a symbol table (stripped)")
    bias = min(start - offset for start, offset, p in files if p == path)
    runtime = symbols[0]
    assert runtime.size > 0
    assert (bias if position_independent(path) else 0) + runtime.value == child["at"]


def test_position_independence_from_the_header(tmp_path):
    assert position_independent(_libc_path()) is True
    (tmp_path / "text").write_text("not an ELF file at all")
    assert position_independent(str(tmp_path / "text")) is None


def test_elf_file_is_kept_once_per_file_whatever_path_names_it():
    """A process's files are named through /proc/PID/root: one mapping per file, not per process."""
    from inferprobe.collector.binaries import elf_symbols

    libc = next(m.path for m in read_maps(os.getpid()) if "libc.so" in m.path)
    first = elf_symbols.elf_file(libc)
    again = elf_symbols.elf_file(f"/proc/{os.getpid()}/root{libc}")
    assert first is not None and again is first
    assert elf_symbols.elf_file("/no/such/file") is None
