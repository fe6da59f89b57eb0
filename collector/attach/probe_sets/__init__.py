"""Probe sets: the groups of BPF programs `record` can turn on.

A probe set is one bpf/<name>.bpf.c, built ahead of time into an object
(scripts/build_bpf.sh: clang against vmlinux.h, CO-RE), plus the Python that
decides whether it applies to the targets, writes the object's read-only
settings before the kernel verifies it, attaches it (tracepoints, USDT,
uprobes, perf events), seeds its maps, and at the end snapshots whatever it
aggregated in the kernel (stack maps, histograms) into the recording.

The sockets set's object is loaded first and makes the maps every set shares
(the event ring, the target filter, the counters: bpf/common.bpf.h);
each later object is handed them (collector/attach/loader.py). A set may
also be a part of another set's object (part_of): the TLS, network and
host-wide sets' programs live in sock.bpf.o, because they read and change
its per-connection state; such a set only configures and attaches them. And a
set may use some programs of an object that serves several sets
(uses_objects): the off-CPU tracker, bpf/offcpu.bpf.c, is the off-CPU
profile's object and also gives the lock set its off-CPU periods; it is loaded
once, with the parts of whichever sets are on (configure_use).

A new set: write bpf/<name>.bpf.c (include "common.bpf.h"), add it to
scripts/build_bpf.sh, subclass ProbeSet (here) with core_object in a module of
this folder, and list it in registry.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from inferprobe.collector.attach.attach_failures import AttachFailures
from inferprobe.collector.attach.libbpf import BpfObject


@dataclass
class TargetContext:
    """What every probe set may look at while preparing to attach."""

    pids: list[int]  # the targets and their descendants
    options: dict = field(default_factory=dict)  # per-set settings from the command line
    # Per-process attaches that failed: recorded by the sets, said and counted by the recorder.
    attach_failures: AttachFailures = field(default_factory=AttachFailures)


class ProbeSet:
    """Base class: a set that needs nothing beyond its tracepoints."""

    name: str = ""
    # The object built ahead of time from bpf/<name>.bpf.c (scripts/build_bpf.sh), which
    # the loader opens with libbpf, hands the shared maps, loads and keeps in `core`.
    core_object: str = ""
    # Or: the set whose object holds this set's programs; `core` is then that object,
    # which this set configures (before load) and attaches, but does not own.
    part_of: str = ""
    core: BpfObject | None = None
    # Built objects of which this set also uses some programs (attached once,
    # whichever sets ask: BpfObject.attach), loaded for it whether or not their
    # owner set is on; `used` holds them by name once loaded.
    uses_objects: tuple[str, ...] = ()
    used: Mapping[str, BpfObject] = MappingProxyType({})
    description: str = ""
    observed_types: tuple[int, ...] = ()  # event types passed to observe() while recording
    # Maps holding in-flight state (per connection, thread, pending call): the
    # recorder reports their sizes so a leak would show (and tests check it).
    state_maps: tuple[str, ...] = ()

    def prepare(self, ctx: TargetContext) -> str | None:
        """Looks at the targets; returns why the set cannot be used, or None."""
        return None

    def configure(self, core: BpfObject) -> None:
        """Between open and load of core_object (or of the object it is part_of,
        after that set's own configure): its read-only settings, and the
        programs it does not need or this kernel cannot run left out
        (BpfObject.set_autoload)."""

    def configure_use(self, core: BpfObject) -> None:
        """Between open and load of an object in uses_objects: turns on this
        set's part of it (its read-only settings, the sizes of its maps)."""

    def finish_load(self, core: BpfObject) -> None:
        """Right after core_object loaded: loads what it left out of its own load
        (the sockets set verifies its tail-call chain on every core at once)."""

    def after_load(self, bpf, ctx: TargetContext) -> None:
        """Attaches the set's programs and seeds its maps. bpf is the sockets
        set's object, where the shared maps are; the set's own is self.core."""

    def refresh(self, bpf, ctx: TargetContext) -> list[str] | None:
        """Called by `record` about once a second while recording: attach to
        what appeared since (a library loaded later, a new child process),
        sample user-space state (socket options, tcp_info), or keep the maps
        of processes that may exit before the end. Returns lines worth
        telling the user, if any."""
        return None

    def observe(self, raw: bytes) -> None:
        """Sees each raw event of observed_types as it arrives (keep it cheap)."""

    def snapshot(self, bpf) -> dict | None:
        """Kernel-side aggregates to store in the recording when it stops."""
        return None

    def release(self) -> None:
        """Drops native handles; called just before the BPF programs are detached."""
