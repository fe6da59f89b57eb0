"""Shared by the probe tests (tests/unit/probes, tests/integration/probes,
tests/integration/collector/attach/test_usdt_set.py): known probe values, child
processes that fire every probe, a tracer of the tests' own that reads every argument, and
a reader for .note.stapsdt. The children are beside this file.

The children (probe_child.py for Python, fire_probes.c for the C/C++ header)
speak one line protocol on stdin/stdout, so one test drives both:

    -> (start)          <- "ready <available> <reason>"
    "enabled\\n"      <- "enabled <0|1>"
    "fire\\n"         <- "fired <skipped calls>"   after firing every probe
    EOF                 the child exits
"""

from __future__ import annotations

import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from inferprobe.probes import PROBES, PROVIDER

HERE = Path(__file__).resolve().parent
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def value(probe_index: int, arg_index: int) -> int:
    """Argument arg_index of probe probe_index in a "fire" round.

    Distinct for every (probe, argument), wider than 32 bits (truncation
    shows) and of alternating sign (a lost sign extension shows). The same
    formula is in fire_probes.c.
    """
    magnitude = ((probe_index + 1) << 40) | ((arg_index + 1) << 20) | 0x5A5
    return -magnitude if (probe_index + arg_index) % 2 else magnitude


def expected_events() -> list[tuple[str, tuple[int, ...]]]:
    """What one "fire" round emits, in order: every probe, then request_start at the int64 edges."""
    events = [(p.name, tuple(value(i, j) for j in range(len(p.args)))) for i, p in enumerate(PROBES)]
    events.append(("request_start", (INT64_MAX, INT64_MIN, -1)))
    return events


# -- child processes -------------------------------------------------------------


class Child:
    """A process that fires the probes on command (see the module docstring)."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.ready_line = self._read()
        if not self.ready_line.startswith("ready"):
            self.close()
            raise RuntimeError(f"probe child {argv} did not start: {self.ready_line!r}")

    def _read(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"probe child {self.pid} exited (rc={self.proc.poll()})")
        return line.strip()

    def ask(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def enabled(self) -> bool:
        reply = self.ask("enabled")
        assert reply in ("enabled 0", "enabled 1"), reply
        return reply == "enabled 1"

    def fire(self) -> int:
        reply = self.ask("fire")
        assert reply.startswith("fired "), reply
        return int(reply.split()[1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- the tracer -----------------------------------------------------------------

MAX_ARGS = max(len(p.args) for p in PROBES)


def bpf_source(probes=PROBES) -> str:
    """One BPF program per probe that copies every argument into a record
    (tests/support/clang_bpf.py), argument by argument as libbpf's USDT support
    reads it from the probe's note.

    Generated from the table, not written per probe, so a new probe is traced
    here the moment it is added there.
    """
    parts = [
        f"struct record {{ u32 probe; u32 nargs; s64 args[{MAX_ARGS}]; }};",
        "%RECORDS%",
        "#include <bpf/usdt.bpf.h>",
    ]
    for index, p in enumerate(probes):
        reads = "\n".join(f"    bpf_usdt_arg(ctx, {j}, &arg);\n    e->args[{j}] = arg;"
                          for j in range(len(p.args)))
        parts.append(
            f'SEC("usdt") int on_{p.name}(struct pt_regs *ctx)\n{{\n'
            f"    struct record *e = next_record();\n"
            f"    long arg = 0;\n"
            f"    if (!e)\n        return 0;\n"
            f"    e->probe = {index};\n"
            f"    e->nargs = {len(p.args)};\n"
            f"{reads}\n"
            f"    return 0;\n"
            f"}}"
        )
    return "\n".join(parts)


def probe_binary(pid: int) -> str:
    """The file mapped by pid whose notes hold our provider's probes (the C
    extension for Python, the executable for the C children)."""
    paths = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/") and fields[5] not in paths:
            paths.append(fields[5])
    for path in paths:
        try:
            notes, _ = stapsdt_notes(Path(path))
        except (OSError, ValueError):
            continue
        if any(n.provider == PROVIDER for n in notes):
            return path
    raise RuntimeError(f"pid {pid} maps no file with {PROVIDER} USDT probes")


class Tracer:
    """Attaches to every probe of one pid and collects (name, args) in order.

    A tracer of the tests' own (built by clang, loaded with libbpf:
    tests/support/clang_bpf.py), not inferprobe's USDT set: what the probes
    library writes is read here as any USDT consumer reads it."""

    def __init__(self, pid: int, probes=PROBES):
        import tempfile

        from tests.support import clang_bpf

        self.probes = tuple(probes)
        self._dir = tempfile.TemporaryDirectory()
        self.bpf = clang_bpf.build(bpf_source(self.probes), Path(self._dir.name), "usdt_trace")
        self._read = clang_bpf.read_records
        try:
            self.bpf.load()
            binary = probe_binary(pid)
            for index, p in enumerate(self.probes):
                # Attaching is what increments the probe's semaphore (libbpf sets it).
                self.bpf.attach_usdt(f"on_{p.name}", pid, binary, PROVIDER, p.name, index)
        except Exception:
            self.detach()
            raise
        self.events: list[tuple[str, tuple[int, ...]]] = []

    def wait_for(self, count: int, timeout: float = 10.0) -> list[tuple[str, tuple[int, ...]]]:
        deadline = time.monotonic() + timeout
        while True:
            self.events = [(self.probes[r.probe].name, tuple(r.args[: r.nargs]))
                           for r in self._read(self.bpf)]
            if len(self.events) >= count or time.monotonic() >= deadline:
                return self.events
            time.sleep(0.02)

    def detach(self) -> None:
        """Detach every probe (which decrements the semaphores) and free the programs."""
        self.bpf.close()
        self._dir.cleanup()


# -- .note.stapsdt ---------------------------------------------------------------


@dataclass(frozen=True)
class Note:
    provider: str
    name: str
    pc: int
    semaphore: int
    args: tuple[str, ...]  # e.g. ("-8@%rbx", "-8@8(%rsp)")


def stapsdt_notes(path: Path) -> tuple[list[Note], tuple[int, int] | None]:
    """The SystemTap SDT notes of an ELF file, and the address range of its .probes section.

    pyelftools walks the notes (alignment, headers); their descriptor is read
    here: pc, base, semaphore addresses, then NUL-terminated provider, name
    and argument string (see the SystemTap wiki, UserSpaceProbeImplementation).
    """
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        elf = ELFFile(f)
        addr = "<QQQ" if elf.elfclass == 64 else "<III"
        size = struct.calcsize(addr)
        notes = []
        section = elf.get_section_by_name(".note.stapsdt")
        for n in section.iter_notes() if section is not None else ():
            if n["n_name"] != "stapsdt":
                continue
            desc: bytes = n["n_descdata"]
            pc, _base, semaphore = struct.unpack_from(addr, desc)
            provider, name, args = desc[size:].split(b"\0")[:3]
            notes.append(Note(provider.decode(), name.decode(), pc, semaphore,
                              tuple(args.decode().split())))
        probes = elf.get_section_by_name(".probes")
        span = (probes["sh_addr"], probes["sh_addr"] + probes["sh_size"]) if probes is not None else None
    return notes, span


# -- the C/C++ child -------------------------------------------------------------

C_SOURCES = (HERE / "fire_probes.c", HERE / "fire_probes_tu2.c")
COMPILERS = {"c": ("cc", "c"), "c++": ("c++", "c++")}


def build_c_child(out_dir: Path, language: str) -> Path:
    """Compiles fire_probes.c + fire_probes_tu2.c as C or C++ against the shipped header."""
    import shutil

    from inferprobe.probes import include_dir

    compiler, lang = COMPILERS[language]
    if shutil.which(compiler) is None:
        import pytest

        pytest.skip(f"no {compiler} compiler on PATH to build the {language} probe program")
    exe = out_dir / f"fire_probes_{language.replace('+', 'x')}"
    cmd = [compiler, "-x", lang, "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(include_dir()),
           *map(str, C_SOURCES), "-o", str(exe)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stderr}"
    return exe
