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


@dataclass(frozen=True, slots=True)
class Probe:
    address: int  # ELF virtual address in the file (bcc's attach_uprobe addr=)
    program: str  # the BPF function it runs
    on_return: bool = False  # a uretprobe on the function at address


def attach_functions(bpf, path: str, pid: int,
                     functions: Iterable[tuple[str, Iterable[Probe]]]) -> tuple[list[str], dict[str, str]]:
    """(function name, its probes) for each function: (hooked names, name -> why not)."""
    hooked: list[str] = []
    failed: dict[str, str] = {}
    for name, probes in functions:
        try:
            for probe in probes:
                attach = bpf.attach_uretprobe if probe.on_return else bpf.attach_uprobe
                attach(name=path.encode(), addr=probe.address, fn_name=probe.program.encode(), pid=pid)
        except Exception as err:  # bcc: bare Exception, e.g. a dead pid or the probe limit
            failed[name] = str(err)
            continue
        hooked.append(name)
    return hooked, failed
