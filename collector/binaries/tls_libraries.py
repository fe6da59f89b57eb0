"""The TLS libraries a process uses, and which of them inferprobe can read.

A process's plaintext is read where it enters and leaves its TLS library
(bpf/tls.bpf.c), so the first question about an encrypted
connection is which library it goes through:

- OpenSSL 1.1 and 3.x as a shared library, libssl.so.* (Python's _ssl,
  curl, nginx, most C and C++ servers): hooked;
- OpenSSL linked into the executable, when the executable exports its
  SSL_* functions (Node bundles OpenSSL that way): hooked;
- Go's crypto/tls, compiled into Go binaries (collector/binaries/go_binary.py): hooked
  where that module finds the probe points;
- others a process may map (GnuTLS, NSS's libssl3, wolfSSL): named, so
  doctor and the report can say why their connections stay unread, never
  hooked;
- rustls, which has no library of its own: it is compiled into each Rust
  program or Python extension that uses it (granian, hf_xet, uv, Rust LLM
  gateways). Where the file keeps its symbols (.symtab), its plaintext
  functions are found by their mangled names and hooked (`rustls_functions`,
  the programs in bpf/tls.bpf.c's "rustls"). Most shipped files are
  stripped: `linked_tls` then finds rustls by the source paths its panic
  messages leave in the file ("rustls-0.23.46/src/conn.rs"), for doctor to
  name.

Functions are found by name in the file's symbol tables
(elf_symbols.functions_matching); a file is read once however many
processes map it.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

from inferprobe.collector.binaries.elf_symbols import (
    code_at,
    functions_matching,
    has_symtab,
    symbols_matching,
)
from inferprobe.collector.processes.proc_maps import executable_files

# What each hooked OpenSSL function is, for the programs in bpf/tls.bpf.c.
OPENSSL_ENTRY_PROGRAMS = {
    "SSL_read": "tls_ssl_read_enter",
    "SSL_read_ex": "tls_ssl_read_ex_enter",
    "SSL_write": "tls_ssl_write_enter",
    "SSL_write_ex": "tls_ssl_write_ex_enter",
    "SSL_do_handshake": "tls_ssl_handshake_enter",
    "SSL_connect": "tls_ssl_handshake_enter",
    "SSL_accept": "tls_ssl_handshake_enter",
    "SSL_free": "tls_ssl_free",
}
OPENSSL_RETURN_PROGRAM = "tls_ssl_return"
# The four that move plaintext and the handshakes get a return probe too; SSL_free only its entry.
OPENSSL_RETURN_FUNCTIONS = ("SSL_read", "SSL_read_ex", "SSL_write", "SSL_write_ex", "SSL_do_handshake",
                            "SSL_connect", "SSL_accept")
_OPENSSL_PATTERN = r"^SSL_(read|write)(_ex)?$|^SSL_(do_handshake|connect|accept|free)$"

# rustls's plaintext at the application's side: <rustls::conn::Reader as
# std::io::Read>::read and <rustls::conn::Writer as std::io::Write>::write
# (rustls::conn::connection:: in 0.22 and later), by their mangled names in
# Rust's default (legacy) scheme; a build with -C symbol-mangling-version=v0
# is not matched.
RUSTLS_READ, RUSTLS_WRITE = "Reader::read", "Writer::write"
_RUSTLS_PATTERN = (r"^_ZN\d+_\$LT\$rustls\.\.(?:\w+\.\.)*"
                   r"(?:Reader\$u20\$as\$u20\$std\.\.io\.\.Read\$GT\$4read"
                   r"|Writer\$u20\$as\$u20\$std\.\.io\.\.Write\$GT\$5write)17h[0-9a-f]{16}E$")
# Each at its entry, by how the file's rustc returns their io::Result<usize>
# (rustls_abi), and at its return.
RUSTLS_ENTRY_PROGRAMS = {
    ("registers", RUSTLS_READ): "tls_rustls_read_enter",
    ("registers", RUSTLS_WRITE): "tls_rustls_write_enter",
    ("hidden-pointer", RUSTLS_READ): "tls_rustls_read_enter_sret",
    ("hidden-pointer", RUSTLS_WRITE): "tls_rustls_write_enter_sret",
}
RUSTLS_RETURN_PROGRAM = "tls_rustls_return"

LIBSSL = re.compile(r"^libssl\.so(\.[0-9]+)*$")  # OpenSSL's; NSS ships libssl3.so
UNHOOKED = {
    re.compile(r"^libgnutls\.so"): "GnuTLS",
    re.compile(r"^libssl3\.so"): "NSS",
    re.compile(r"^libnss3\.so"): "NSS",
    re.compile(r"^libwolfssl\.so"): "wolfSSL",
    re.compile(r"^libmbedtls\.so"): "Mbed TLS",
}


# rustls's crate directory in the source paths Rust keeps for panic messages.
RUSTLS_SOURCE = re.compile(rb"/rustls-(\d+\.\d+\.\d+)/src/")
# Files larger than this are not searched for it: the largest files a process
# maps are ML libraries (libtorch_cpu ~0.5 GB), and a Rust program linking
# rustls is tens of MB (granian's extension 21 MB, uv 40 MB).
LINKED_TLS_SCAN_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class TlsLibrary:
    pid: int
    path: str  # as the process sees it (its mount namespace)
    kind: str  # "openssl" (libssl.so), "openssl-static" (in the executable), or an unhooked library's name
    file_key: tuple[int, int]  # (st_dev, st_ino): one file under many names
    functions: dict[str, int] = field(default_factory=dict, compare=False)  # hooked name -> address
    version: str | None = None  # where the file states it (rustls's crate version)
    abi: str | None = None  # rustls: how its functions return their Result (rustls_abi)

    @property
    def host_path(self) -> str:
        """A path to the same file from here, also for a process in a container."""
        return f"/proc/{self.pid}/root{self.path}"

    @property
    def hookable(self) -> bool:
        if self.kind == "rustls":
            return self.abi is not None and {RUSTLS_READ, RUSTLS_WRITE} <= self.functions.keys()
        return self.kind in ("openssl", "openssl-static") and all(
            name in self.functions for name in ("SSL_read", "SSL_write"))

    def probe_programs(self) -> list[tuple[str, int, str, str | None]]:
        """(function, address, entry program, return program or None) for each function to hook."""
        if self.kind == "rustls":
            return [(name, address, RUSTLS_ENTRY_PROGRAMS[(self.abi or "", name)], RUSTLS_RETURN_PROGRAM)
                    for name, address in sorted(self.functions.items())]
        return [(name, address, OPENSSL_ENTRY_PROGRAMS[name],
                 OPENSSL_RETURN_PROGRAM if name in OPENSSL_RETURN_FUNCTIONS else None)
                for name, address in sorted(self.functions.items())]


@lru_cache(maxsize=256)
def _openssl_functions(host_path: str, file_key: tuple[int, int]) -> dict[str, int]:
    """SSL_read, SSL_write, their _ex forms and SSL_free as the file exports them."""
    found: dict[str, int] = {}
    for name, address in functions_matching(host_path, _OPENSSL_PATTERN):
        if name in OPENSSL_ENTRY_PROGRAMS:
            found.setdefault(name, address)
    return found


def rustls_abi(read_code: bytes, write_code: bytes) -> str | None:
    """How a file's rustc passes the io::Result<usize> its Reader::read and Writer::write
    return, from where each first loads through its receiver (&mut self): from RDI, the
    first argument register, when the Result comes back in RAX:RDX ("registers", rustc
    1.7x and later); from RSI when a hidden first argument points to where the Result is
    to go ("hidden-pointer", older rustc). The first `mov r64, [rdi]` or `mov r64, [rsi]`
    of each function (REX.W 8B with ModRM mod 00, r/m 111 or 110) says; None where the
    two disagree or neither is found, and the file is then not hooked."""
    def receiver(code: bytes) -> str | None:
        for at in range(len(code) - 2):
            if code[at] in (0x48, 0x4C) and code[at + 1] == 0x8B and code[at + 2] & 0xC0 == 0:
                if code[at + 2] & 7 == 7:
                    return "registers"
                if code[at + 2] & 7 == 6:
                    return "hidden-pointer"
        return None
    read, write = receiver(read_code), receiver(write_code)
    return read if read == write else None


# The per-file answers kept: more than all the files a host's serving processes map. The
# TLS set asks again about every mapped file of every target each second (refresh), and a
# miss costs a symbol-table search. (The stream-shape tests' dozen servers map 110.)
FILES_LOOKED_AT = 8192


@lru_cache(maxsize=FILES_LOOKED_AT)
def _rustls_functions(host_path: str, file_key: tuple[int, int]) -> tuple[dict[str, int], str | None]:
    """rustls's Reader::read and Writer::write in a file that keeps its symbols, and how
    they return (rustls_abi); ({}, None) for a file without them (most: stripped, or no
    Rust). The section headers are read first, so a stripped file costs ~0.1 ms; an
    unstripped one costs a search of its symbol names (~1 ms per MB of file), so files
    past LINKED_TLS_SCAN_BYTES (ML libraries: libtorch_cpu's names alone are 76 MB, 70 ms)
    are not searched, as for the version."""
    try:
        if os.path.getsize(host_path) > LINKED_TLS_SCAN_BYTES or not has_symtab(host_path):
            return {}, None
    except OSError:
        return {}, None
    found: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for sym in symbols_matching(host_path, _RUSTLS_PATTERN, tables=(".symtab",), needle=b"$LT$rustls.."):
        name = RUSTLS_READ if "Reader" in sym.name else RUSTLS_WRITE
        found.setdefault(name, sym.value)
        sizes.setdefault(name, sym.size)
    if {RUSTLS_READ, RUSTLS_WRITE} - found.keys():
        return {}, None
    code = {name: code_at(host_path, found[name], min(sizes[name] or 64, 64)) for name in found}
    return found, rustls_abi(code[RUSTLS_READ], code[RUSTLS_WRITE])


def tls_libraries(pid: int) -> list[TlsLibrary]:
    """The TLS libraries pid has mapped, hooked or not (the OpenSSL kinds first)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return []
    found: list[TlsLibrary] = []
    for mapped in executable_files(pid):
        name, key = os.path.basename(mapped.path), mapped.file_key
        if LIBSSL.match(name) or mapped.path == exe:
            functions = _openssl_functions(mapped.host_path, key)
            if LIBSSL.match(name) or {"SSL_read", "SSL_write"} <= functions.keys():
                kind = "openssl" if LIBSSL.match(name) else "openssl-static"
                found.append(TlsLibrary(pid=pid, path=mapped.path, kind=kind, file_key=key,
                                        functions=functions))
                continue
        rustls, abi = _rustls_functions(mapped.host_path, key)
        if rustls:
            found.append(TlsLibrary(pid=pid, path=mapped.path, kind="rustls", file_key=key, functions=rustls,
                                    version=_rustls_version(mapped.host_path, key), abi=abi))
            continue
        for pattern, library in UNHOOKED.items():
            if pattern.match(name):
                found.append(TlsLibrary(pid=pid, path=mapped.path, kind=library, file_key=key))
    return sorted(found, key=lambda lib: (not lib.hookable, lib.path))


@lru_cache(maxsize=256)
def _rustls_version(host_path: str, file_key: tuple[int, int]) -> str | None:
    """The rustls crate version a file was built with, None when it holds none."""
    try:
        with open(host_path, "rb") as f:
            if os.fstat(f.fileno()).st_size > LINKED_TLS_SCAN_BYTES:
                return None
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                found = RUSTLS_SOURCE.search(data)
                return found.group(1).decode() if found else None
    except (OSError, ValueError):   # unreadable, or empty (mmap refuses a 0-byte file)
        return None


def linked_tls(pid: int) -> list[TlsLibrary]:
    """TLS stacks compiled into the files pid maps without the symbols that would let
    inferprobe hook them, which no library name gives away (a stripped rustls): for
    doctor to name, since inferprobe does not read them."""
    found = []
    for mapped in executable_files(pid):
        if (LIBSSL.match(os.path.basename(mapped.path))
                or _rustls_functions(mapped.host_path, mapped.file_key)[0]):
            continue
        version = _rustls_version(mapped.host_path, mapped.file_key)
        if version is not None:
            found.append(TlsLibrary(pid=pid, path=mapped.path, kind="rustls", file_key=mapped.file_key,
                                    version=version))
    return found
