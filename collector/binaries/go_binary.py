"""Where to probe Go's crypto/tls in a Go binary (amd64), found from the file alone.

What is hooked: crypto/tls.(*Conn).Read and crypto/tls.(*Conn).Write, the
two methods every Go TLS peer (net/http's server and client, gRPC, Ollama)
moves plaintext through. Their entries and every return instruction.

Go's register ABI (ABIInternal, amd64, Go 1.17 and later), what the kernel
side reads:

- at the entry: the receiver (*tls.Conn) in RAX, the []byte's pointer in
  RBX, its length in RCX (its capacity in RDI);
- at each RET: the first result, n, in RAX (the error interface in RBX:RCX);
- throughout: the current goroutine (*runtime.g) in R14.

Why return instructions and no uretprobe: a uretprobe replaces the return
address on the stack with a trampoline's. Go moves and copies goroutine
stacks when they grow, and its unwinder (the GC's stack scan, tracebacks,
panics) reads return addresses to find frames; a foreign one crashes the
process ("unexpected return pc"). A uprobe on each RET instruction of the
function sees the results without touching the stack.

Why calls are keyed by goroutine (R14), not by thread: a Read that blocks
parks its goroutine, which later resumes on whatever thread the scheduler
picks. The entry and its RET run on the same goroutine, not always the same
thread.

Two things the kernel side must allow for: the entry probe fires twice
when the function's prologue finds the stack too small (it calls
runtime.morestack and jumps back to the entry, same arguments, same
goroutine); and the stack may have moved between entry and RET, so nothing
keyed by a stack address survives.

Addresses here are ELF virtual addresses (collector/attach/uprobe_attach.py turns
them into the file offsets libbpf takes, as for the symbol values
collector/attach/probe_sets/semaphores.py passes); the file offsets, what the
kernel's uprobe_events lists, are kept beside them. Return instructions are
found by disassembling the function with capstone: a byte scan for 0xC3
would find that byte inside other instructions, and a probe there corrupts
the target.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from functools import lru_cache

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from inferprobe.collector.binaries.elf_symbols import ElfFile, read_elf, symbols_matching
from inferprobe.collector.binaries.go_buildinfo import (
    BuildInfoError,
    find_header,
    parse_version,
    version_from_header,
)
from inferprobe.collector.binaries.go_pclntab import PclntabError, function_entries
from inferprobe.collector.binaries.go_struct_offsets import ConnFdOffsets, dwarf_offsets, table_offsets
from inferprobe.collector.processes.proc_maps import read_maps

READ_SYMBOL = "crypto/tls.(*Conn).Read"
WRITE_SYMBOL = "crypto/tls.(*Conn).Write"
MIN_RELEASE = (1, 17)  # the first with the register ABI on amd64
HOOKED = frozenset({READ_SYMBOL, WRITE_SYMBOL})
PADDING = b"\xcc"  # int3: what the Go linker fills the gap to the next function with


class NotHookable(Exception):
    """A Go binary with crypto/tls that cannot be probed; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class GoFunction:
    name: str
    address: int  # ELF virtual address of the entry (uprobe_attach makes it a file offset)
    file_offset: int  # the entry's offset in the file
    returns: tuple[int, ...]  # virtual address of every return instruction in the function

    @property
    def return_file_offsets(self) -> tuple[int, ...]:
        return tuple(self.file_offset + (r - self.address) for r in self.returns)


@dataclass(frozen=True, slots=True)
class GoTlsProbes:
    """Everything the Go TLS uprobes need from one binary."""

    path: str  # the file analysed
    go_version: str  # from its build info, e.g. "go1.19.8"
    read: GoFunction  # crypto/tls.(*Conn).Read
    write: GoFunction  # crypto/tls.(*Conn).Write
    offsets: ConnFdOffsets  # *tls.Conn -> socket fd; .source says "dwarf" or "table"
    symbols_from: str  # where the functions were found: "symtab" (ELF), "pclntab" (Go's own, when stripped)


@dataclass(frozen=True, slots=True)
class GoBinaryVerdict:
    """What go_binary_verdict found: probes, or the reason a Go TLS binary gets none."""

    path: str
    go_version: str | None
    probes: GoTlsProbes | None
    reason: str | None  # one sentence for doctor; None when probes were found
    seconds: float  # the time the analysis took (it runs at attach)


def _go_version(elf: ELFFile, image: ElfFile) -> str | None:
    """The toolchain version from the build info; None for a file that is no Go binary."""
    section = elf.get_section_by_name(".go.buildinfo")
    header = find_header(image.data, section["sh_offset"] if section is not None else None)
    if header is None:
        return None

    def read_at(vaddr: int, size: int) -> bytes:
        offset = image.offset_of_vaddr(vaddr)
        return b"" if offset is None else image.data[offset : offset + size]

    # The inline layout: header, then two varint-prefixed strings, well under 64 KiB together.
    return version_from_header(image.data[header : header + 65536], read_at)


@lru_cache(maxsize=1)
def _disassembler():
    # capstone is imported only when a Go binary is disassembled: its ~10 MB
    # would otherwise sit in every recorder (tests/integration/e2e/test_soak.py).
    import capstone  # type: ignore[import-untyped]  # no stubs nor py.typed

    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = False  # the instruction id is all that is read
    return md


@lru_cache(maxsize=1)
def _return_instructions() -> frozenset[int]:
    from capstone import x86_const

    return frozenset({x86_const.X86_INS_RET})


def _entries(elf: ELFFile, image: ElfFile) -> tuple[dict[str, tuple[int, int]], str]:
    """(name -> (entry, size)) of Read and Write, and where they were found: the ELF symbol table,
    else (a binary stripped with -s) Go's own function table."""
    if isinstance(elf.get_section_by_name(".symtab"), SymbolTableSection):
        pattern = "^(" + "|".join(re.escape(name) for name in sorted(HOOKED)) + ")$"
        return {s.name: (s.value, s.size) for s in symbols_matching(image.path, pattern)}, "symtab"
    section, text = elf.get_section_by_name(".gopclntab"), elf.get_section_by_name(".text")
    if section is None or text is None:
        raise NotHookable("it is stripped and has no .gopclntab section: its crypto/tls functions cannot "
                          "be found")
    try:
        found = function_entries(section.data(), text["sh_addr"], HOOKED)
    except PclntabError as err:
        raise NotHookable(f"it is stripped (linked with -s) and its function table was not read: {err}") \
            from err
    return {name: (e.entry, e.size) for name, e in found.items()}, "pclntab"


def _function(image: ElfFile, name: str, entry: int, size: int) -> GoFunction:
    """The function's entry and return instructions, by disassembling its code."""
    offset = image.offset_of_vaddr(entry)
    if offset is None or size == 0:
        raise NotHookable(f"{name} has no code in the file (size {size})")
    try:
        returns = return_instructions(image.data[offset : offset + size], entry)
    except NotHookable as err:
        raise NotHookable(f"{name} {err}") from None
    return GoFunction(name, entry, offset, returns)


def return_instructions(code: bytes, address: int) -> tuple[int, ...]:
    """Addresses of the return instructions in a function's code (loaded at address), found by
    decoding it instruction by instruction from its entry; NotHookable when the code cannot be
    decoded to its end (trailing int3 padding aside) or holds no return."""
    returns = []
    end = address
    for insn in _disassembler().disasm(code, address):
        if insn.id in _return_instructions():
            returns.append(insn.address)
        end = insn.address + insn.size
    if code[end - address :].strip(PADDING):
        raise NotHookable(f"could not be disassembled past {end:#x}: its return instructions are unknown, "
                          "so it is not probed")
    if not returns:
        raise NotHookable("has no return instruction")
    return tuple(returns)


def _analyse(path: str) -> tuple[str | None, GoTlsProbes | None, str | None]:
    """(go version, probes, reason); (None, None, None) for a file that is no Go binary."""
    image = read_elf(path)
    if image is None:
        return None, None, None
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            try:
                version = _go_version(elf, image)
            except BuildInfoError as err:
                return None, None, f"{path}: a Go build info that cannot be read ({err})"
            if version is None:
                return None, None, None
            machine = elf["e_machine"]
            if machine != "EM_X86_64":
                return version, None, (f"{path} is a {machine} Go binary: Go TLS probes are for amd64 "
                                       "(x86-64) only")
            release = parse_version(version)
            if release is None:
                return version, None, f"{path}: Go version {version!r} names no release"
            entries, symbols_from = _entries(elf, image)
            if READ_SYMBOL not in entries or WRITE_SYMBOL not in entries:
                return version, None, None  # no crypto/tls linked: nothing to hook, nothing to say
            read = _function(image, READ_SYMBOL, *entries[READ_SYMBOL])
            write = _function(image, WRITE_SYMBOL, *entries[WRITE_SYMBOL])
            if release.release < MIN_RELEASE:
                return version, None, (f"{path} was built with {version}: Go TLS probes need Go 1.17 or "
                                       "later (the register ABI)")
            offsets = dwarf_offsets(elf)
            if isinstance(offsets, str):
                fallback = table_offsets(release.release)
                if fallback is None:
                    return version, None, (f"{path} has {offsets} and was built with {version}, a release "
                                           "whose struct offsets inferprobe does not know: rebuild it "
                                           "without -ldflags=-w")
                offsets = fallback
    except NotHookable as err:
        return version, None, f"{path}: {err}"
    except (OSError, ELFError, ValueError) as err:
        return None, None, f"{path} could not be read as a Go binary ({err})"
    finally:
        image.data.close()
    return version, GoTlsProbes(path, version, read, write, offsets, symbols_from), None


def go_binary_verdict(path: str) -> GoBinaryVerdict | None:
    """The Go TLS probes of the binary at path, or why it gets none; None when it is
    no Go binary, or one that does not link crypto/tls."""
    start = time.monotonic()
    version, probes, reason = _analyse(path)
    if probes is None and reason is None:
        return None
    return GoBinaryVerdict(path, version, probes, reason, time.monotonic() - start)


def go_tls_probes(path: str) -> GoTlsProbes | None:
    """Just the probes: None for no Go, no crypto/tls, or a binary refused (go_binary_verdict says why)."""
    verdict = go_binary_verdict(path)
    return verdict.probes if verdict is not None else None


_verdicts: dict[tuple[int, int, int, int], GoBinaryVerdict | None] = {}


def _verdict_of_file(path: str, file_key: tuple[int, int, int, int]) -> GoBinaryVerdict | None:
    """go_binary_verdict, once per file version (dev, inode, size, mtime), whatever the path it
    is reached by: many processes of one binary, or a restart, cost one analysis."""
    if file_key not in _verdicts:
        _verdicts[file_key] = go_binary_verdict(path)
    return _verdicts[file_key]


@dataclass(frozen=True, slots=True)
class GoTlsTarget:
    pid: int
    path: str  # the executable as the process names it
    host_path: str  # the same file from here (through the process's root): what attach_uprobe opens
    # (verdict.path is where the file was first analysed, maybe through another, gone, process)
    verdict: GoBinaryVerdict

    @property
    def probes(self) -> GoTlsProbes | None:
        return self.verdict.probes


def go_tls_targets(pid: int) -> list[GoTlsTarget]:
    """pid's executable when it is a Go binary linking crypto/tls: its probes, or why none.

    Empty for a process that is gone, is not Go, or does not link crypto/tls.
    Only the executable: Go code in a shared library (-buildmode=c-shared)
    is not looked for.
    """
    try:
        path = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return []
    mapped = any(m.executable and m.path == path for m in read_maps(pid))
    if not mapped:
        return []  # a kernel thread, or an exe replaced on disk ("... (deleted)"): its maps say which
    host_path = f"/proc/{pid}/root{path}"
    try:
        st = os.stat(host_path)
    except OSError:
        return []
    verdict = _verdict_of_file(host_path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return [GoTlsTarget(pid, path, host_path, verdict)] if verdict is not None else []
