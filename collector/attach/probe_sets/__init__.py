"""Probe sets: the groups of BPF programs `record` can turn on.

A probe set is one bpf/<name>.bpf.c plus the Python that decides whether it
applies to the targets, attaches what bcc does not attach by itself (USDT,
uprobes, perf events), seeds its maps, and at the end snapshots whatever it
aggregated in the kernel (stack maps, histograms) into the recording.

The sets still compiled by bcc are compiled as one translation unit by
collector/attach/loader.py: one clang run at start-up. The sets built ahead of
time (core_object; CO-RE, loaded with libbpf) share that unit's ring buffer,
target filter and counters. A new set is built ahead: write bpf/<name>.bpf.c
(include "common_core.bpf.h"), add it to scripts/build_bpf.sh, subclass
ProbeSet here with core_object, and list it in available_sets().
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    source: str = ""  # file name under bpf/, compiled by bcc at start-up
    # Or: the object built ahead of time from bpf/<name>.bpf.c (scripts/build_bpf.sh), which
    # the loader opens with libbpf, hands the shared maps, loads and keeps in `core`.
    core_object: str = ""
    core: BpfObject | None = None
    description: str = ""
    observed_types: tuple[int, ...] = ()  # event types passed to observe() while recording
    # Maps holding in-flight state (per connection, thread, pending call): the
    # recorder reports their sizes so a leak would show (and tests check it).
    state_maps: tuple[str, ...] = ()

    def prepare(self, ctx: TargetContext) -> str | None:
        """Looks at the targets; returns why the set cannot be used, or None."""
        return None

    def cflags(self) -> list[str]:
        return []

    def configure(self, core: BpfObject) -> None:
        """Between open and load of core_object: its read-only settings, and the
        programs this kernel cannot run left out (BpfObject.set_autoload)."""

    def after_load(self, bpf, ctx: TargetContext) -> None:
        """Attaches what bcc did not attach by itself and seeds maps."""

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


def available_sets() -> dict[str, type[ProbeSet]]:
    from inferprobe.collector.attach.probe_sets.gpu import GpuProbes
    from inferprobe.collector.attach.probe_sets.host_wide import HostWideProbes
    from inferprobe.collector.attach.probe_sets.llama import LlamaProbes
    from inferprobe.collector.attach.probe_sets.locks import LockProbes
    from inferprobe.collector.attach.probe_sets.network import NetworkProbes
    from inferprobe.collector.attach.probe_sets.sockets import SocketProbes
    from inferprobe.collector.attach.probe_sets.stacks import OffcpuProbes, ProfileProbes
    from inferprobe.collector.attach.probe_sets.tls import TlsProbes
    from inferprobe.collector.attach.probe_sets.usdt import UsdtProbes

    # sockets first: the TLS set loads into the chain the sockets set set up.
    return {cls.name: cls for cls in (SocketProbes, TlsProbes, UsdtProbes, NetworkProbes, ProfileProbes,
                                      OffcpuProbes, LockProbes, GpuProbes, LlamaProbes, HostWideProbes)}
