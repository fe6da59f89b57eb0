"""The USDT probe set (bpf/usdt.bpf.c): the server's own view of each request.

Servers that import inferprobe.probes (or include probes/include/inferprobe/
usdt.h) carry ELF notes for provider "inferprobe". This set finds them in
every target process, attaches the one handler to each probe present, with
the probe's number as the cookie, and so turns their semaphores on: the
probes cost nothing until this happens.

The handler is built ahead of time and loaded with libbpf (core_object), so a
process that appears while recording (a new worker, an adopted server) gets
its probes attached by refresh(): libbpf reads each probe's arguments from
its note at attach time.
"""

from __future__ import annotations

import os

from inferprobe.collector.attach.libbpf import LibbpfError, Link, destroy_all
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.binaries.elf_symbols import usdt_probes
from inferprobe.collector.model.events import UsdtProbe
from inferprobe.collector.processes import proc_maps

PROVIDER = "inferprobe"
PROBE_NUMBERS = {p.name.lower(): int(p) for p in UsdtProbe}
HANDLER = "usdt_probe"


def probe_files(pid: int,
                looked_at: set[tuple[int, int]] | None = None) -> dict[proc_maps.MappedFile, set[str]]:
    """The files pid maps that hold inferprobe probes, with the probes' names. A file
    whose key is in looked_at is skipped; each one read is added to it."""
    found = {}
    for mapped in proc_maps.executable_files(pid):
        if looked_at is not None:
            if mapped.file_key in looked_at:
                continue
            looked_at.add(mapped.file_key)
        names = {name for provider, name in usdt_probes(mapped.host_path, mapped.file_key)
                 if provider == PROVIDER and name in PROBE_NUMBERS}
        if names:
            found[mapped] = names
    return found


class UsdtProbes(ProbeSet):
    name = "usdt"
    core_object = "usdt.bpf.o"
    description = "the server's inferprobe USDT probes: queueing, prefill, decode steps, tokens"

    def __init__(self) -> None:
        self.by_pid: dict[int, dict[proc_maps.MappedFile, set[str]]] = {}
        self.attached: dict[int, list[str]] = {}   # pid -> the probes attached in it
        self.links: dict[int, list[Link]] = {}   # pid -> its attachments
        self.looked_at: dict[int, set[tuple[int, int]]] = {}   # pid -> the files read for probes

    def prepare(self, ctx: TargetContext) -> str | None:
        for pid in ctx.pids:
            files = probe_files(pid, self.looked_at.setdefault(pid, set()))
            if files:
                self.by_pid[pid] = files
        # Host-wide (record --all, agent: filters given), the servers to come are adopted while
        # recording: the set stays on to find their probes (refresh). With fixed targets it is
        # on where they have some.
        host_wide = (ctx.options.get("host_wide") or {}).get("filters") is not None
        if not self.by_pid and not host_wide:
            return "no target maps a file with inferprobe USDT probes"
        return None

    def probe_names(self) -> set[str]:
        return {name for files in self.by_pid.values() for names in files.values() for name in names}

    def after_load(self, bpf, ctx: TargetContext) -> None:
        for pid, files in sorted(self.by_pid.items()):
            self._attach(pid, files, ctx)

    def _attach(self, pid: int, files: dict[proc_maps.MappedFile, set[str]], ctx: TargetContext) -> int:
        """Each process's probes on their own: one that cannot be attached (it exited, its file
        changed, the kernel refused) loses its USDT view, and the others and the load go on.
        Returns how many probes were attached."""
        assert self.core is not None, "the loader loads core_object before after_load"
        hooked = self.attached.setdefault(pid, [])
        before = len(hooked)
        for mapped, names in sorted(files.items(), key=lambda item: item[0].path):
            failed: dict[str, str] = {}
            for name in sorted(names):
                try:
                    self.links.setdefault(pid, []).append(self.core.attach_usdt(
                        HANDLER, pid, mapped.host_path, PROVIDER, name, PROBE_NUMBERS[name]))
                except LibbpfError as err:
                    failed[name] = str(err)
                    continue
                hooked.append(name)
            ctx.attach_failures.add_functions(pid, self.name, f"the USDT probes of {mapped.path}", failed)
        return len(hooked) - before

    def refresh(self, bpf, ctx: TargetContext) -> list[str] | None:
        """Attaches the probes of what appeared since the last call: a target process that
        is new (a worker, an adopted server) or mapped a file with probes since (an import)."""
        if self.core is None:
            return None
        from inferprobe.collector.attach.target_bitmap import target_pids

        # The kernel's bitmap holds threads' tids too; /proc lists processes only.
        current = set(target_pids(bpf)) & {int(entry) for entry in os.listdir("/proc") if entry.isdigit()}
        # What is kept per process is bounded by the live targets, not by every pid ever seen.
        for gone in set(self.looked_at) - current:
            destroy_all(self.links.pop(gone, []))
            self.looked_at.pop(gone)
            self.by_pid.pop(gone, None)
            self.attached.pop(gone, None)
        notes = []
        for pid in sorted(current):
            new = probe_files(pid, self.looked_at.setdefault(pid, set()))
            if not new:
                continue
            self.by_pid.setdefault(pid, {}).update(new)
            if attached := self._attach(pid, new, ctx):
                notes.append(f"usdt: attached {attached} probe(s) in pid {pid}")
        return notes

    def release(self) -> None:
        # Detaching lowers the probes' semaphores in the targets again.
        destroy_all([link for links in self.links.values() for link in links])
        self.links.clear()
