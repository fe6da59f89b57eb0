"""Attaching a function's uprobes, per process, where a failure is a note and not the end.

Every set that hooks library functions (gpu, tls, llama) attaches a few
probes per function (an entry, a uretprobe or the return instructions) in
one process. One function that cannot be hooked (a dead pid, the kernel's
probe limit) must not keep the others from being hooked, and must be said:
attach_functions() attaches each function's probes and returns which
functions are hooked and why the others are not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inferprobe.collector.binaries.elf_symbols import elf_file


@dataclass(frozen=True, slots=True)
class Probe:
    address: int  # ELF virtual address in the file (made a file offset here)
    program: str  # the BPF function it runs
    on_return: bool = False  # a uretprobe on the function at address


def attach_functions(bpf, path: str, pid: int, functions: Iterable[tuple[str, Iterable[Probe]]],
                     links: list | None = None) -> tuple[list[str], dict[str, str]]:
    """(function name, its probes) for each function: (hooked names, name -> why not).

    bpf is the object holding the set's programs (BpfObject); links, where given, gets
    each attachment made (for a caller that detaches them when the process exits)."""
    hooked: list[str] = []
    failed: dict[str, str] = {}
    for name, probes in functions:
        try:
            for probe in probes:
                link = attach_probe(bpf, path, pid, probe)
                if links is not None and link is not None:
                    links.append(link)
        except Exception as err:  # LibbpfError, or an ELF reader's: a dead pid, the probe limit
            failed[name] = str(err)
            continue
        hooked.append(name)
    return hooked, failed


def attach_probe(bpf, path: str, pid: int, probe: Probe):
    """One probe in pid, its link; raises what the library raised when it cannot be attached."""
    return bpf.attach_uprobe(probe.program, pid, path, _file_offset(path, probe.address),
                             on_return=probe.on_return)


def _file_offset(path: str, vaddr: int) -> int:
    """Where the code at vaddr lies in the file: the kernel places uprobes by file offset
    (libbpf takes the offset)."""
    elf = elf_file(path)
    offset = elf.offset_of_vaddr(vaddr) if elf is not None else None
    if offset is None:
        raise ValueError(f"0x{vaddr:x} is in no loaded segment of {path}")
    return offset
