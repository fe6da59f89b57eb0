"""Loads the active probe sets' objects, built ahead of time, attaches and seeds them.

Every set's programs were compiled once, at build time (scripts/build_bpf.sh:
clang against vmlinux.h, CO-RE); here libbpf opens each object, relocates
its kernel-type accesses for this kernel, writes its read-only settings, and
the kernel verifies it. No compiler and no kernel headers run at start-up.
libbpf is reached here and in collector/attach/ only; everything above the
collector works on decoded events and never needs it.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferprobe.collector.attach import preflight
from inferprobe.collector.attach.built_objects import built_object
from inferprobe.collector.attach.kernel_version import ensure_kernel_version
from inferprobe.collector.attach.libbpf import BpfObject, LibbpfError
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.attach.probe_sets.registry import available_sets
from inferprobe.collector.attach.target_bitmap import add_targets
from inferprobe.collector.errors import EnvironmentProblem, TargetProblem
from inferprobe.collector.model.events import COUNTER_MAX, Counter
from inferprobe.collector.model.ringbuf_format import iter_ring_records
from inferprobe.collector.processes import targets as target_procs

TRACEFS = Path("/sys/kernel/tracing")
DEFAULT_SETS = ("sockets", "usdt")


def load_core_object(object_name: str, users: list[tuple[ProbeSet, bool]], shared: dict[str, int],
                     ringbuf_pages: int) -> BpfObject:
    """Opens a built object, gives it the maps loaded before it, lets each set
    that uses it configure it, and loads it. users: (set, whether it is the
    object's owner or part of it) in load order; the others only use some of its
    programs (ProbeSet.uses_objects) and turn on their part (configure_use).

    A map is one map across objects by its name: the event ring, the target
    filter and the counters (made by the first object, the sockets set's),
    and what several sets share, such as the Python stack maps of
    bpf/python_stacks.bpf.h. shared (name -> fd) grows with each object loaded."""
    core = BpfObject(built_object(object_name))
    try:
        names = core.shareable_maps()
        for map_name in names:
            if map_name in shared:
                core.reuse_map(map_name, shared[map_name])
        if "events" in names and "events" not in shared:
            core.set_max_entries("events", ringbuf_pages * PAGE_SIZE)   # the ring's bytes
        core.set_constant("ringbuf_wakeup_bytes", wakeup_bytes(ringbuf_pages))
        for probe_set, owns in users:
            if owns:
                probe_set.configure(core)
            else:
                probe_set.configure_use(core)
        core.load()
        for probe_set, owns in users:
            if owns and probe_set.core_object == object_name:
                probe_set.finish_load(core)
    except Exception:
        core.close()
        raise
    for map_name in names:
        shared.setdefault(map_name, core.map_fd(map_name))
    return core


def load_objects(active: dict[str, ProbeSet], ringbuf_pages: int) -> list[BpfObject]:
    """Every built object the active sets need, each loaded once, in the sets'
    order (the sockets set's first: it makes the shared maps). An object one set
    owns (core_object) may hold the programs of sets that are part of it
    (part_of) and serve sets that use some of its programs (uses_objects): the
    off-CPU tracker serves the off-CPU profile and the lock set. Each set's
    `core` and `used` are set; on a failure what was loaded is closed."""
    shared: dict[str, int] = {}
    loaded: dict[str, BpfObject] = {}
    try:
        for probe_set in active.values():
            for object_name in (*probe_set.uses_objects, probe_set.core_object):
                if not object_name or object_name in loaded:
                    continue
                loaded[object_name] = load_core_object(object_name, _users(active, object_name), shared,
                                                       ringbuf_pages)
    except Exception:
        close_objects(list(loaded.values()))
        raise
    for probe_set in active.values():
        if probe_set.core_object:
            probe_set.core = loaded[probe_set.core_object]
        probe_set.used = {name: loaded[name] for name in probe_set.uses_objects}
    for probe_set in active.values():
        if probe_set.part_of:
            probe_set.core = active[probe_set.part_of].core
    return list(loaded.values())


def _users(active: dict[str, ProbeSet], object_name: str) -> list[tuple[ProbeSet, bool]]:
    """The sets an object serves, each with whether it owns the object (its
    core_object, or part_of the set whose it is): the owners first, in load
    order (the owner, then its parts), then the sets that use some of it."""
    owner = next((s.name for s in active.values() if s.core_object == object_name), None)
    users = []
    for probe_set in active.values():
        owns = probe_set.core_object == object_name or (owner is not None and probe_set.part_of == owner)
        if owns or object_name in probe_set.uses_objects:
            users.append((probe_set, owns))
    return sorted(users, key=lambda user: not user[1])


def close_objects(objects: list[BpfObject]) -> None:
    """Detaches and frees objects: the last loaded first, the sockets set's
    (whose maps the others share) last."""
    for core in reversed(objects):
        core.close()


def ensure_tracefs() -> None:
    if (TRACEFS / "events").is_dir():
        return
    rc = os.system(f"mount -t tracefs tracefs {TRACEFS} 2>/dev/null")
    if rc != 0 or not (TRACEFS / "events").is_dir():
        raise EnvironmentProblem(
            f"tracefs is not mounted at {TRACEFS} and mounting it failed: "
            f"run 'mount -t tracefs tracefs {TRACEFS}' as root"
        )


def ensure_privileges() -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "tracing needs root (or CAP_BPF and CAP_PERFMON): run it with sudo"
        )


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# Each CPU wakes the reader after writing this share of the ring (at most
# 256 KiB): all CPUs together fill at most half of it between two wake-ups.
WAKEUP_SHARE_PER_CPU = 2


def wakeup_bytes(ringbuf_pages: int, cpus: int | None = None) -> int:
    cpus = cpus or os.cpu_count() or 1
    ring = ringbuf_pages * PAGE_SIZE
    return max(4096, min(256 * 1024, ring // (WAKEUP_SHARE_PER_CPU * cpus)))


@dataclass
class LoadedTracer:
    """The loaded, attached probe sets of one recording session."""

    bpf: BpfObject  # the sockets set's object, which holds the shared maps
    objects: list[BpfObject]  # every object loaded, in load order (bpf first)
    pids: list[int]
    active: dict[str, ProbeSet]
    ringbuf_pages: int
    ctx: TargetContext
    inactive: dict[str, str] = field(default_factory=dict)  # set name -> why not
    refresh_errors: int = 0
    # Seconds each start-up stage took: "prepare" (each set reads its targets'
    # binaries), "verify" (libbpf relocates each object for this kernel and the
    # kernel verifies its programs, the classifier chain on every core at once),
    # "attach" (tracepoints, uprobes, USDT, map seeding). What a user waits
    # for, and which stage to blame.
    startup_s: dict[str, float] = field(default_factory=dict)

    def refresh(self) -> list[str]:
        """Lets every active set attach to what appeared since the last call
        and sample what it samples while recording (ProbeSet.refresh).

        A failure here must not end a recording that is otherwise fine: it is
        counted and said once.
        """
        notes: list[str] = []
        for name, probe_set in self.active.items():
            try:
                notes.extend(probe_set.refresh(self.bpf, self.ctx) or ())
            except Exception as err:  # a set's rescan failing leaves what is attached working
                self.refresh_errors += 1
                if self.refresh_errors == 1:
                    notes.append(f"probe set {name}: re-scan failed ({err}); recording goes on")
        return notes

    def counters(self) -> dict[str, int]:
        table = self.bpf[b"counters"]
        totals = {}
        for counter in Counter:
            per_cpu = table[ctypes.c_int(counter.value)]
            totals[counter.name.lower()] = int(sum(per_cpu))
        return totals

    def table(self, name: str):
        """A map by name, in whichever object has it (core_tables.CoreTable)."""
        for core in self.objects:
            if core.ptr is not None and name in core.shareable_maps():
                return core[name]
        raise KeyError(name)

    def has_map(self, name: bytes) -> bool:
        """Whether the loaded programs define this map (a probe set's own ring, say)."""
        try:
            self.table(name.decode())
        except KeyError:
            return False
        return True

    def map_entries(self) -> dict[str, int]:
        """Entries in every active set's in-flight state maps (a walk of the
        keys: call it every few seconds, not per poll)."""
        return {name: sum(1 for _ in self.table(name).keys())
                for s in self.active.values() for name in s.state_maps}

    def tap(self, sink):
        """sink for ring buffer chunks, plus each active set's observe() for
        the event types it asked for (only those sets pay a per-event walk)."""
        observers = {int(t): s.observe for s in self.active.values() for t in s.observed_types}
        if not observers:
            return sink

        def tee(chunk: bytes) -> None:
            sink(chunk)
            for raw in iter_ring_records(chunk):
                observe = observers.get(raw[0])
                if observe is not None:
                    observe(raw)

        return tee

    def snapshots(self) -> dict[str, dict]:
        """Each active set's kernel-side aggregates, for the recording."""
        out = {}
        for name, probe_set in self.active.items():
            snap = probe_set.snapshot(self.bpf)
            if snap is not None:
                out[name] = snap
        return out

    def hand_over_on_exit(self) -> int | None:
        """Leaves the kernel's detach to a child that outlives this process
        (collector/attach/detach_on_exit.py), so that close() and exit are
        quick. Not where a uprobe went through tracefs: removing its event
        after close() needs the detach done. Returns the child's pid, or None."""
        from inferprobe.collector.attach.detach_on_exit import hand_over_probes

        if any(link.after_destroy is not None for core in self.objects for link in core.links):
            return None
        return hand_over_probes()

    def close(self) -> None:
        """Detaches and frees every object: the others first, the sockets set's
        (whose maps they share) last."""
        for probe_set in self.active.values():
            probe_set.release()
        close_objects(self.objects)
        for probe_set in self.active.values():
            probe_set.core, probe_set.used = None, {}


def load_tracer(
    pids: list[int],
    sets: tuple[str, ...] = DEFAULT_SETS,
    ringbuf_pages: int = 2048,
    require_listener: bool = False,
    options: dict | None = None,
) -> LoadedTracer:
    """Loads and attaches the named probe sets to pids and their descendants.

    "sockets" is required; any other set that does not apply to the targets
    (e.g. no USDT probes in them) is left out and the reason kept in
    LoadedTracer.inactive, for the report to say.
    """
    ensure_privileges()
    for pid in pids:
        target_procs.check_alive(pid)
    all_pids = target_procs.with_descendants(pids)
    if require_listener and not target_procs.listening_sockets(all_pids):
        raise TargetProblem(
            f"pid {', '.join(map(str, pids))} has no listening TCP or Unix socket, so it is not "
            "serving HTTP (pass the server process, or --no-listen-check if it is still starting)"
        )
    ensure_tracefs()
    ensure_kernel_version()
    btf = preflight.check_btf()
    if not btf.ok:
        fix = f"; fix: {btf.fix}" if btf.fix else ""
        raise EnvironmentProblem(f"{btf.detail}{fix}")
    if ringbuf_pages & (ringbuf_pages - 1):
        raise EnvironmentProblem(f"ring buffer pages must be a power of two, got {ringbuf_pages}")

    known = available_sets()
    unknown = [name for name in sets if name not in known]
    if unknown:
        raise EnvironmentProblem(
            f"unknown probe set {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    started = time.monotonic()
    ctx = TargetContext(pids=all_pids, options=options or {})
    active: dict[str, ProbeSet] = {}
    inactive: dict[str, str] = {}
    for name in dict.fromkeys(("sockets", *sets)):
        probe_set = known[name]()
        reason = probe_set.prepare(ctx)
        if reason is None:
            active[name] = probe_set
        else:
            inactive[name] = reason

    prepared = time.monotonic()
    verified = prepared
    objects: list[BpfObject] = []
    try:
        objects = load_objects(active, ringbuf_pages)
        bpf = active["sockets"].core
        assert bpf is not None, "the sockets set always has its object"
        verified = time.monotonic()
        for probe_set in active.values():
            probe_set.after_load(bpf, ctx)
    except EnvironmentProblem:
        close_objects(objects)
        raise   # already one sentence with its fix (a built object missing)
    except (LibbpfError, OSError) as err:   # what libbpf or the kernel refused, in its words
        close_objects(objects)
        raise EnvironmentProblem(f"the BPF programs did not load or attach ({err}); "
                                 "run 'inferprobe doctor' to see what is missing") from None

    # Only now, after every set seeded its maps: until a pid is a target the
    # programs ignore it, so none of its threads can have cached a socket
    # as untracked before the sockets set seeded it (bpf/sock.bpf.c).
    add_targets(bpf, all_pids)
    # A child forked while the first pass rewrote its word may have lost the
    # bit the kernel set for it: a second pass over the live tree restores it.
    add_targets(bpf, target_procs.with_descendants(pids))
    attached = time.monotonic()
    startup_s = {"prepare": prepared - started, "verify": verified - prepared, "attach": attached - verified}
    return LoadedTracer(bpf=bpf, objects=objects, pids=all_pids, active=active, ringbuf_pages=ringbuf_pages,
                        inactive=inactive, ctx=ctx, startup_s={k: round(v, 3) for k, v in startup_s.items()})


assert COUNTER_MAX >= len(Counter)
