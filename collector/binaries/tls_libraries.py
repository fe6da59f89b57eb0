"""The TLS libraries a process uses, and which of them inferprobe can read.

A process's plaintext is read where it enters and leaves its TLS library
(bpf/sock.bpf.c, "TLS"), so the first question about an encrypted
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
  gateways), usually stripped. `linked_tls` finds it by the source paths
  its panic messages leave in the file ("rustls-0.23.46/src/conn.rs"), for
  doctor to name; never hooked.

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

from inferprobe.collector.binaries.elf_symbols import functions_matching
from inferprobe.collector.processes.proc_maps import executable_files

# What each hooked OpenSSL function is, for the programs in sock.bpf.c.
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

    @property
    def host_path(self) -> str:
        """A path to the same file from here, also for a process in a container."""
        return f"/proc/{self.pid}/root{self.path}"

    @property
    def hookable(self) -> bool:
        return self.kind in ("openssl", "openssl-static") and all(
            name in self.functions for name in ("SSL_read", "SSL_write"))


@lru_cache(maxsize=256)
def _openssl_functions(host_path: str, file_key: tuple[int, int]) -> dict[str, int]:
    """SSL_read, SSL_write, their _ex forms and SSL_free as the file exports them."""
    found: dict[str, int] = {}
    for name, address in functions_matching(host_path, _OPENSSL_PATTERN):
        if name in OPENSSL_ENTRY_PROGRAMS:
            found.setdefault(name, address)
    return found


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
    """TLS stacks compiled into the files pid maps, which no library name gives
    away (rustls): for doctor to name, since inferprobe does not read them."""
    found = []
    for mapped in executable_files(pid):
        if LIBSSL.match(os.path.basename(mapped.path)):
            continue
        version = _rustls_version(mapped.host_path, mapped.file_key)
        if version is not None:
            found.append(TlsLibrary(pid=pid, path=mapped.path, kind="rustls", file_key=mapped.file_key,
                                    version=version))
    return found
