"""Shared by the probe tests (tests/unit/probes, tests/integration/probes,
tests/integration/collector/attach/test_usdt_set.py): known probe values, child
processes that fire every probe, a bcc tracer that reads every argument, and
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


def bpf_text(probes=PROBES) -> bytes:
    """One BPF function per probe that copies every argument into the ring buffer.

    Generated from the table, not written per probe, so a new probe is traced
    here the moment it is added there.
    """
    parts = [
        "#include <uapi/linux/ptrace.h>",
        f"struct probe_event {{ u32 probe; u32 nargs; s64 args[{MAX_ARGS}]; }};",
        "BPF_RINGBUF_OUTPUT(events, 16);",
    ]
    for index, p in enumerate(probes):
        reads = "\n".join(f"    bpf_usdt_readarg({j + 1}, ctx, &e.args[{j}]);" for j in range(len(p.args)))
        parts.append(
            f"int on_{p.name}(struct pt_regs *ctx) {{\n"
            f"    struct probe_event e = {{}};\n"
            f"    e.probe = {index};\n"
            f"    e.nargs = {len(p.args)};\n"
            f"{reads}\n"
            f"    events.ringbuf_output(&e, sizeof(e), 0);\n"
            f"    return 0;\n"
            f"}}"
        )
    return "\n".join(parts).encode()


EVENT = struct.Struct(f"<II{MAX_ARGS}q")


class Tracer:
    """Attaches to every probe of one pid with bcc and collects (name, args) in order."""

    def __init__(self, pid: int, probes=PROBES):
        from bcc import BPF, USDT

        from tests.support import bcc_uprobes

        # The uprobe binding inferprobe uses: with bcc's own, this tracer and a recorder probing
        # the same _usdt.so at once would disagree on the semaphore offset (tests/support/bcc_uprobes.py).
        bcc_uprobes.install()
        self.probes = tuple(probes)
        self.usdt = USDT(pid=pid)
        for p in self.probes:
            # Enabling is what increments the probe's semaphore.
            self.usdt.enable_probe(probe=f"{PROVIDER}:{p.name}", fn_name=f"on_{p.name}")
        self.bpf = BPF(text=bpf_text(self.probes), usdt_contexts=[self.usdt])
        self.events: list[tuple[str, tuple[int, ...]]] = []
        self.bpf[b"events"].open_ring_buffer(self._on_event)

    def _on_event(self, _ctx, data, size) -> None:
        import ctypes

        raw = ctypes.string_at(data, size)
        probe, nargs, *args = EVENT.unpack_from(raw)
        self.events.append((self.probes[probe].name, tuple(args[:nargs])))

    def wait_for(self, count: int, timeout: float = 10.0) -> list[tuple[str, tuple[int, ...]]]:
        deadline = time.monotonic() + timeout
        while len(self.events) < count and time.monotonic() < deadline:
            self.bpf.ring_buffer_poll(100)
        self.bpf.ring_buffer_consume()
        return self.events

    def detach(self) -> None:
        """Detach every uprobe, then drop the USDT context (which decrements the semaphores)."""
        import gc

        self.bpf.cleanup()
        del self.bpf
        del self.usdt
        gc.collect()


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
