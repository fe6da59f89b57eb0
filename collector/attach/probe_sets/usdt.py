"""The USDT probe set (bpf/usdt.bpf.c): the server's own view of each request.

Servers that import inferprobe.probes (or include probes/include/inferprobe/
usdt.h) carry ELF notes for provider "inferprobe". This set finds them in
every target process, attaches a handler to each probe present, and so turns
their semaphores on: the probes cost nothing until this happens.
"""

from __future__ import annotations

import gc

from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.model.events import UsdtProbe

PROVIDER = b"inferprobe"
PROBE_NAMES = [p.name.lower() for p in UsdtProbe]


def _probes_in(pid: int) -> set[str]:
    """Names of the inferprobe USDT probes in the files pid has mapped."""
    from bcc import USDT

    try:
        found = USDT(pid=pid).enumerate_probes()
    except Exception:  # bcc raises bare Exception for a process it cannot read
        return set()
    return {p.name.decode() for p in found if p.provider == PROVIDER} & set(PROBE_NAMES)


class UsdtProbes(ProbeSet):
    name = "usdt"
    source = "usdt.bpf.c"
    description = "the server's inferprobe USDT probes: queueing, prefill, decode steps, tokens"

    def __init__(self) -> None:
        self.by_pid: dict[int, set[str]] = {}
        self.attached: dict[int, list[str]] = {}   # pid -> the probes attached in it
        self._contexts: list = []
        self._context_pids: list[int] = []
        self._failed_early: dict[int, str] = {}   # pid -> why bcc could not read its probes

    def prepare(self, ctx: TargetContext) -> str | None:
        self.by_pid = {pid: names for pid in ctx.pids if (names := _probes_in(pid))}
        if not self.by_pid:
            return "no target maps a file with inferprobe USDT probes"
        return None

    def probe_names(self) -> set[str]:
        return set().union(*self.by_pid.values()) if self.by_pid else set()

    def cflags(self) -> list[str]:
        # Only handlers for probes some target has: bcc cannot compile a
        # bpf_usdt_readarg() in a function attached to no probe.
        return [f"-DUSDT_WANT_{name}" for name in sorted(self.probe_names())]

    def release(self) -> None:
        # bcc 0.26 closes one fd twice when a USDT context is freed: the BPF
        # module's BTF fd, whose number may by then belong to something else
        # (a recording file). Freeing the contexts while that fd is still the
        # module's, right before BPF.cleanup(), keeps the stray close harmless.
        # Freeing them also lowers the probes' semaphores in the target.
        self._contexts.clear()
        self._context_pids.clear()
        gc.collect()

    def usdt_contexts(self) -> list:
        from bcc import USDT

        if not self._contexts:
            for pid, names in sorted(self.by_pid.items()):
                try:
                    context = USDT(pid=pid)
                    for name in sorted(names):
                        context.enable_probe(probe=name, fn_name=f"usdt_{name}")
                except Exception as err:  # bcc: bare Exception, e.g. the process exited since prepare()
                    self._failed_early[pid] = str(err)
                    continue
                self._contexts.append(context)
                self._context_pids.append(pid)
        return self._contexts

    def attach_usdt(self, bpf, ctx: TargetContext) -> None:
        """Each process's probes on their own: one that cannot be attached (it exited, its file
        changed, the kernel refused) loses its USDT view, and the others and the load go on."""
        from inferprobe.collector.attach.bcc_uprobes import attach_usdt_probes

        for pid, error in self._failed_early.items():
            ctx.attach_failures.add(pid, self.name, f"USDT probes of pid {pid}", error)
        for pid, context in zip(self._context_pids, self._contexts, strict=True):
            hooked, failed = attach_usdt_probes(bpf, context)
            self.attached[pid] = [name.removeprefix("usdt_") for name in hooked]
            unhooked = {name.removeprefix("usdt_"): why for name, why in failed.items()}
            ctx.attach_failures.add_functions(pid, self.name, "its USDT probes", unhooked)
