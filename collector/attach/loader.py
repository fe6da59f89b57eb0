"""Compiles the active probe sets with bcc in one go, attaches and seeds them.

bcc is imported here, in collector/attach/ringbuf.py and in collector/attach/probe_sets/
only; everything above the collector works on decoded events and never
needs it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferprobe.collector.attach import bcc_uprobes, preflight
from inferprobe.collector.attach.libbpf import BpfObject
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext, available_sets
from inferprobe.collector.errors import EnvironmentProblem, TargetProblem
from inferprobe.collector.model.events import COUNTER_MAX, Counter
from inferprobe.collector.model.ringbuf_format import iter_ring_records
from inferprobe.collector.processes import targets as target_procs

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
TRACEFS = Path("/sys/kernel/tracing")
DEFAULT_SETS = ("sockets", "usdt")


def bpf_source_dir() -> Path:
    # Installed: inferprobe/bpf next to inferprobe/collector. Source tree: ../bpf.
    if (BPF_DIR / "sock.bpf.c").exists():
        return BPF_DIR
    raise EnvironmentProblem(f"the BPF sources are missing from {BPF_DIR}: reinstall inferprobe")


def built_object(name: str) -> Path:
    """A BPF object built ahead of time (scripts/build_bpf.sh), by file name."""
    path = bpf_source_dir() / "build" / name
    if not path.is_file():
        raise EnvironmentProblem(f"the built BPF object {path} is missing: run 'make setup' "
                                 "(scripts/build_bpf.sh builds it with clang and libbpf's headers)")
    return path


# The maps of common.bpf.h that the built objects use too (bpf/common_core.bpf.h).
SHARED_MAPS = ("targets", "counters", "unwoken_bytes", "events")


def load_core_object(probe_set: ProbeSet, shared: dict[str, int], ringbuf_pages: int) -> BpfObject:
    """Opens a set's built object, gives it the maps loaded before it, lets the set
    configure it, and loads it.

    A map is one map across objects by its name: the event ring, the target
    filter and the counters (made by the bcc program while one exists), and
    what several sets share, such as the Python stack maps of
    bpf/python_stacks.bpf.h. shared (name -> fd) grows with each object loaded."""
    core = BpfObject(built_object(probe_set.core_object))
    try:
        names = core.shareable_maps()
        for map_name in names:
            if map_name in shared:
                core.reuse_map(map_name, shared[map_name])
        core.set_constant("ringbuf_wakeup_bytes", wakeup_bytes(ringbuf_pages))
        probe_set.configure(core)
        core.load()
    except Exception:
        core.close()
        raise
    for map_name in names:
        shared.setdefault(map_name, core.map_fd(map_name))
    return core


def _import_bcc():
    try:
        import bcc  # noqa: F401
    except ImportError:
        raise EnvironmentProblem(
            "the bcc Python module is not importable: install python3-bpfcc (apt) and run "
            "inferprobe from a venv made with --system-site-packages (sudo make setup does both)"
        ) from None
    bcc_uprobes.install()   # its uprobe binding and tracefs event names (bcc_uprobes.py says why)
    return bcc


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


def _cflags(ringbuf_pages: int) -> list[str]:
    flags = [
        f"-I{bpf_source_dir()}",
        f"-DRINGBUF_PAGES={ringbuf_pages}",
        f"-DRINGBUF_WAKEUP_BYTES={wakeup_bytes(ringbuf_pages)}",
        "-Wno-macro-redefined",
        "-Wno-visibility",
    ]
    exit_format = TRACEFS / "events/sched/sched_process_exit/format"
    try:
        if "group_dead" in exit_format.read_text():
            flags.append("-DHAVE_EXIT_GROUP_DEAD")
    except OSError:
        pass
    return flags


def add_targets(bpf, pids: list[int]) -> None:
    """Sets the pids' bits in the kernel's target bitmap (common.bpf.h), which
    covers every pid a 64-bit kernel can hand out (PID_MAX_LIMIT, 1 << 22)."""
    _set_target_bits(bpf, pids, True)


def remove_targets(bpf, pids: list[int]) -> None:
    """Clears the pids' bits: the programs then treat them as any other process."""
    _set_target_bits(bpf, pids, False)


def _set_target_bits(bpf, pids: list[int], on: bool) -> None:
    bitmap = bpf[b"targets"]
    for pid in pids:
        word = ctypes.c_int(pid // 64)
        value, bit = bitmap[word].value, 1 << (pid % 64)
        bitmap[word] = ctypes.c_uint64(value | bit if on else value & ~bit)


def target_pids(bpf) -> list[int]:
    """Every pid set in the kernel's target bitmap: the targets, and the
    processes and threads the kernel saw them fork since."""
    from bcc import libbcc

    bitmap = bpf[b"targets"]
    words = bitmap.max_entries
    keys = (ctypes.c_uint32 * words)()
    values = (ctypes.c_uint64 * words)()
    count = ctypes.c_uint32(words)
    batch = ctypes.c_uint32(0)
    # One BPF_MAP_LOOKUP_BATCH for the whole 512 KiB, not 65536 lookups: this
    # runs about once a second while recording.
    if libbcc.lib.bpf_lookup_batch(bitmap.map_fd, None, ctypes.byref(batch), keys, values,
                                   ctypes.byref(count)) != 0 and ctypes.get_errno() != errno.ENOENT:
        raise OSError(ctypes.get_errno(), "reading the target bitmap failed")
    return [index * 64 + bit
            for index, word in enumerate(memoryview(values).cast("B").cast("Q")[:count.value]) if word
            for bit in range(64) if word >> bit & 1]


@dataclass
class LoadedTracer:
    """The compiled, attached probe sets of one recording session."""

    bpf: Any  # bcc.BPF, which has no type hints
    pids: list[int]
    active: dict[str, ProbeSet]
    ringbuf_pages: int
    ctx: TargetContext
    inactive: dict[str, str] = field(default_factory=dict)  # set name -> why not
    refresh_errors: int = 0
    # Seconds each start-up stage took: "prepare" (each set reads its targets'
    # binaries), "compile_and_verify" (bcc compiles with LLVM; the kernel verifies, and
    # bcc attaches, the tracepoint programs), "load_and_attach" (the kernel verifies the
    # programs bcc does not load itself, the classifier chain's tail calls among them;
    # uprobes, USDT, map seeding). What a user waits for, and which stage to blame.
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
        """A map by name, in the bcc program or in a set's built object (core_tables.CoreTable)."""
        for probe_set in self.active.values():
            if probe_set.core is not None and name in probe_set.core.shareable_maps():
                return probe_set.core[name]
        return self.bpf.get_table(name.encode())

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

    def close(self) -> None:
        for probe_set in self.active.values():
            probe_set.release()
        for probe_set in self.active.values():
            if probe_set.core is not None:
                probe_set.core.close()
                probe_set.core = None
        _detach_at_once(self.bpf)
        self.bpf.cleanup()


def _detach_at_once(bpf) -> None:
    """Closes the tracepoints' and uprobes' perf events from threads at once.

    bcc's cleanup() closes them one after another, and each close waits for
    the kernel to retire the program from the event (an RCU grace period,
    ~60 ms on this VM): 1.4 s for the sockets set's 22 tracepoints, ~0.25 s
    per uprobe, time a stopping agent or recorder spends detached from
    nothing. ctypes releases the GIL around the calls, so the waits overlap.
    What bcc does after the close (its tracefs entry for a uprobe made
    there; nothing for a tracepoint) it still does, in cleanup()."""
    from concurrent.futures import ThreadPoolExecutor

    from bcc import lib

    events = [(bpf.tracepoint_fds, key, fd) for key, fd in bpf.tracepoint_fds.items()]
    events += [(bpf.uprobe_fds, key, fd) for key, fd in bpf.uprobe_fds.items()]
    if not events:
        return
    with ThreadPoolExecutor(max_workers=min(32, len(events))) as pool:
        results = list(pool.map(lambda event: lib.bpf_close_perf_event_fd(event[2]), events))
    for (table, key, _), result in zip(events, results, strict=True):
        if result < 0:
            continue   # left to cleanup(), which raises as bcc does
        if table is bpf.uprobe_fds:
            lib.bpf_detach_uprobe(key)
            bpf._del_uprobe_fd(key)
        else:
            del table[key]


def _translation_unit(sets: list[ProbeSet]) -> str:
    """The text of common.bpf.h and every set's source, as one program.

    One clang run for every set. The files are pasted rather than #included
    because bcc rewrites tracepoint and map code only in its main file;
    #line keeps compiler messages pointing at the real file and line. Each
    source's own #include "common.bpf.h" is then a no-op (include guard).
    """
    parts = []
    # A set without a source of its own adds -D flags to another set's (the TLS set to sock.bpf.c).
    names = ["common.bpf.h", *(s.source for s in sets if s.source)]
    for path in [bpf_source_dir() / name for name in names]:
        parts.append(f'#line 1 "{path}"\n{path.read_text()}\n')
    return "".join(parts)


def load_tracer(
    pids: list[int],
    sets: tuple[str, ...] = DEFAULT_SETS,
    ringbuf_pages: int = 2048,
    require_listener: bool = False,
    options: dict | None = None,
) -> LoadedTracer:
    """Compiles and attaches the named probe sets to pids and their descendants.

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
    headers = preflight.check_kernel_headers()
    if not headers.ok:
        fix = f"; fix: {headers.fix}" if headers.fix else ""
        raise EnvironmentProblem(f"kernel headers are not usable by bcc: {headers.detail}{fix}")
    bcc = _import_bcc()
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

    cflags = _cflags(ringbuf_pages) + [f for s in active.values() for f in s.cflags()]
    prepared = time.monotonic()
    compiled = prepared
    failure: Exception | None
    with preflight.captured_native_output() as compiler_output:
        try:
            bpf = bcc.BPF(text=_translation_unit(list(active.values())).encode(), cflags=cflags)
            compiled = time.monotonic()
            shared = {name: bpf[name.encode()].map_fd for name in SHARED_MAPS}
            for probe_set in active.values():
                if probe_set.core_object:
                    probe_set.core = load_core_object(probe_set, shared, ringbuf_pages)
            for probe_set in active.values():
                probe_set.after_load(bpf, ctx)
        except EnvironmentProblem:
            raise   # already one sentence with its fix (a built object missing)
        except Exception as err:  # bcc raises bare Exception for compile/load/attach errors
            failure = err
        else:
            failure = None
    if failure is not None:
        detail = preflight.first_error_line(compiler_output[0] if compiler_output else "") or str(
            failure
        )
        raise EnvironmentProblem(
            f"the BPF programs did not compile, load or attach ({detail}); "
            "run 'inferprobe doctor' to see what is missing"
        )

    # Only now, after every set seeded its maps: until a pid is a target the
    # programs ignore it, so none of its threads can have cached a socket
    # as untracked before the sockets set seeded it (bpf/sock.bpf.c).
    add_targets(bpf, all_pids)
    # A child forked while the first pass rewrote its word may have lost the
    # bit the kernel set for it: a second pass over the live tree restores it.
    add_targets(bpf, target_procs.with_descendants(pids))
    release_compiler_memory()
    attached = time.monotonic()
    startup_s = {"prepare": prepared - started, "compile_and_verify": compiled - prepared,
                 "load_and_attach": attached - compiled}
    return LoadedTracer(bpf=bpf, pids=all_pids, active=active, ringbuf_pages=ringbuf_pages,
                        inactive=inactive, ctx=ctx, startup_s={k: round(v, 3) for k, v in startup_s.items()})


def release_compiler_memory() -> None:
    """Hands back to the system the heap that compiling the programs used.

    bcc compiles with LLVM in this process; once the programs are loaded that
    memory is free but stays in the allocator's arenas, tens of MB of a
    recorder's resident size for the whole recording. glibc's malloc_trim
    returns it. Elsewhere (another libc) there is nothing to call."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


assert COUNTER_MAX >= len(Counter)
