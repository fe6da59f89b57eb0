"""elf_symbols.functions_matching: the symbol lookup the uprobe sets hook by name."""

from __future__ import annotations

import ctypes
import os
import shutil
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


def test_each_address_is_where_the_dynamic_loader_put_the_function():
    """The ELF address of sem_post and pthread_mutex_lock, plus libc's load bias in this
    process (its first mapping's start), is the address ctypes resolves them to."""
    libc_path = _libc_path()
    bias = min(m.start - m.offset for m in read_maps(os.getpid()) if m.path == libc_path)
    found = dict(functions_matching(libc_path, r"^(sem_post|pthread_mutex_lock)$"))
    assert set(found) == {"sem_post", "pthread_mutex_lock"}
    libc = ctypes.CDLL(libc_path)
    for name, vaddr in found.items():
        assert bias + vaddr == ctypes.cast(getattr(libc, name), ctypes.c_void_p).value, name


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


def test_the_running_interpreters_runtime_state_is_found_as_data():
    """_PyRuntime, a data object (what the Python walker reads), plus the load bias of the
    file that defines it, is the address the running interpreter resolves it to."""
    for m in read_maps(os.getpid()):
        symbols = data_symbols_matching(m.path, r"^_PyRuntime$") if m.offset == 0 else []
        if symbols:
            break
    else:
        pytest.skip("this interpreter's _PyRuntime is in no file with a symbol table (stripped)")
    bias = min(x.start - x.offset for x in read_maps(os.getpid()) if x.path == m.path)
    runtime = symbols[0]
    assert runtime.size > 0
    address = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    relocated = position_independent(m.path)
    assert (bias if relocated else 0) + runtime.value == address


def test_position_independence_from_the_header(tmp_path):
    assert position_independent(_libc_path()) is True
    (tmp_path / "text").write_text("not an ELF file at all")
    assert position_independent(str(tmp_path / "text")) is None
