"""The locks probe set (bpf/locks.bpf.c): futex waits and off-CPU time.

Kernel side: every futex wait of a target thread is summed per address in
kernel maps; waits of at least the floor become FUTEX_WAIT events with the
waiting code's instruction pointer, a frame-pointer stack, candidate return
addresses from a stack scan, and the thread (and code) whose FUTEX_WAKE
released it. Its off-CPU periods by reason and runqueue delay come from the
off-CPU tracker (bpf/offcpu.bpf.c, sched_switch / sched_waking), which this set
uses with its events part on, whether or not the off-CPU profile is on too.
Uprobes on each target's libc semaphore functions
(collector/attach/probe_sets/semaphores.py) tell a wait on a semaphore the
waiter took itself (a signal) from one on a semaphore another thread holds.

User side, at record time: every code address the events mention is named
(collector/binaries/symbolizer.py) while the process still exists, and stored in the
recording's snapshot, so `report` can classify waits anywhere.
"""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

from inferprobe.collector.attach.libbpf import BpfObject
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.attach.probe_sets.semaphores import SemaphoreProbes
from inferprobe.collector.binaries import cpython_runtime
from inferprobe.collector.binaries.python_stacks import PythonTargets, read_stacks
from inferprobe.collector.binaries.symbolizer import Symbolizer
from inferprobe.collector.model.events import (
    LOCK_EXEC_GRANULE_SHIFT,
    LOCK_EXEC_GRANULES,
    LOCK_SCAN_HITS,
    EventType,
    FutexWaitEvent,
    LockCounter,
    OffcpuEvent,
)
from inferprobe.collector.processes import targets as target_procs
from inferprobe.collector.processes.proc_maps import executable_ranges

TRACEFS_EVENTS = Path("/sys/kernel/tracing/events")
DEFAULT_FLOOR_US = 10
DEFAULT_SCAN_FLOOR_US = 50
DEFAULT_OFFCPU_FLOOR_US = 50
MAX_STACK_DEPTH = 127  # a stack map's depth (PERF_MAX_STACK_DEPTH)

# bpf/locks.bpf.c's tracepoint programs, attached where their sections say; and those
# on tracepoints a kernel may lack, by the feature prepare() looks for (the rest stay unloaded).
TRACEPOINT_PROGRAMS = ["lock_enter_futex", "lock_exit_futex"]
# The off-CPU tracker and the programs of it this set uses.
OFFCPU_TRACKER = "offcpu.bpf.o"
TRACKER_PROGRAMS = ["offcpu_on_switch", "offcpu_on_waking"]
# The sizes of bpf/lock_state.bpf.h's maps, in both objects that define them.
LOCK_STATE_SIZES = {"lock_pending": 65536, "lock_stacks": 16384}
OPTIONAL_PROGRAMS = {
    "futex_waitv": ["lock_enter_futex_waitv", "lock_exit_futex_waitv"],
    "futex2": ["lock_enter_futex_wait", "lock_exit_futex_wait", "lock_enter_futex_wake"],
    "lock_contention": ["lock_contention_begin", "lock_contention_end"],
}

_F = FutexWaitEvent
_WAIT_FIELDS = struct.Struct(
    "<4xI"  # type, pid
    f"{_F.ip.offset - 8}x"
    "QQii"  # ip, waker_ip, stack_id, waker_stack_id
    f"{_F.nscan.offset - _F.waker_tid.offset}x"
    "HH4x"  # nscan, waker_nscan
    f"{2 * LOCK_SCAN_HITS}Q"
    "ii"  # python_stack_id, waker_python_stack_id
)
_OFF_STACK = struct.Struct(f"<{OffcpuEvent.waker_stack_id.offset}xiI")  # waker stack id, waker pid
assert _WAIT_FIELDS.size == ctypes.sizeof(FutexWaitEvent)


def read_stack(stack_table, stack_id: int) -> list[int] | None:
    """A frame-pointer stack from the kernel's stack map, innermost first;
    None when the id is no longer there."""
    try:
        return [a for a in stack_table.walk(stack_id) if a][:MAX_STACK_DEPTH]
    except KeyError:
        return None


def _tracepoint(name: str) -> bool:
    return (TRACEFS_EVENTS / name).is_dir()


def _size_lock_state(core: BpfObject) -> None:
    for name, entries in LOCK_STATE_SIZES.items():
        core.set_max_entries(name, entries)


class LockProbes(ProbeSet):
    name = "locks"
    state_maps = ("lock_pending", "offcpu_start", "lock_klock_start", "lock_sem_trying")
    core_object = "locks.bpf.o"
    uses_objects = (OFFCPU_TRACKER,)
    description = ("futex waits (lock vs handoff; libc semaphore uprobes), off-CPU time by reason, "
                   "runqueue delay")
    observed_types = (EventType.FUTEX_WAIT, EventType.OFFCPU)

    def __init__(self) -> None:
        self.floor_ns = DEFAULT_FLOOR_US * 1000
        self.scan_floor_ns = DEFAULT_SCAN_FLOOR_US * 1000
        self.offcpu_floor_ns = DEFAULT_OFFCPU_FLOOR_US * 1000
        self.exec_ranges: list[tuple[int, int]] = []
        self.pids: list[int] = []
        self._addrs: dict[int, set[int]] = {}  # pid -> code addresses seen in events
        self._stack_pids: dict[int, int] = {}  # stack id -> pid it belongs to
        self.have: dict[str, bool] = {}
        self._target_pids: set[int] = set()
        self.semaphores = SemaphoreProbes()
        self.python = PythonTargets()  # thread states for the Python stacks of waiters and wakers
        self._python_ids: dict[int, set[int]] = {}  # pid -> Python stack ids seen in its waits

    def prepare(self, ctx: TargetContext) -> str | None:
        if not _tracepoint("syscalls/sys_enter_futex") or not _tracepoint("sched/sched_switch"):
            return "the kernel has no syscalls:sys_enter_futex or sched:sched_switch tracepoint"
        opts = ctx.options.get("locks", {})
        self.floor_ns = int(opts.get("floor_us", DEFAULT_FLOOR_US) * 1000)
        self.scan_floor_ns = max(self.floor_ns, int(opts.get("scan_floor_us", DEFAULT_SCAN_FLOOR_US) * 1000))
        self.offcpu_floor_ns = int(opts.get("offcpu_floor_us", DEFAULT_OFFCPU_FLOOR_US) * 1000)
        self.pids = list(ctx.pids)
        self._target_pids = set(self.pids)
        self.exec_ranges = executable_ranges(self.pids)
        self.have = {
            "futex_waitv": _tracepoint("syscalls/sys_enter_futex_waitv"),
            "futex2": _tracepoint("syscalls/sys_enter_futex_wait")
            and _tracepoint("syscalls/sys_enter_futex_wake"),
            "lock_contention": _tracepoint("lock/contention_begin"),
        }
        return None

    def configure(self, core: BpfObject) -> None:
        core.set_constant("lock_floor_ns", self.floor_ns)
        core.set_constant("lock_scan_floor_ns", self.scan_floor_ns)
        _size_lock_state(core)
        for feature, programs in OPTIONAL_PROGRAMS.items():
            for program in programs:
                core.set_autoload(program, self.have.get(feature, False))

    def configure_use(self, core: BpfObject) -> None:
        """The off-CPU tracker: its events part, with this set's floor."""
        core.set_constant("offcpu_events", True)
        core.set_constant("offcpu_floor_ns", self.offcpu_floor_ns)
        _size_lock_state(core)

    def after_load(self, bpf, ctx: TargetContext) -> None:
        assert self.core is not None, "the loader loads core_object before after_load"
        bpf = self.core
        for program in TRACEPOINT_PROGRAMS + [p for feature, programs in OPTIONAL_PROGRAMS.items()
                                              if self.have.get(feature) for p in programs]:
            bpf.attach(program)
        for program in TRACKER_PROGRAMS:
            self.used[OFFCPU_TRACKER].attach(program)
        granules = sorted({g for lo, hi in self.exec_ranges
                           for g in range(lo >> LOCK_EXEC_GRANULE_SHIFT,
                                          ((hi - 1) >> LOCK_EXEC_GRANULE_SHIFT) + 1)})
        self.exec_granules = len(granules)
        table = bpf["lock_exec"]
        keys = (table.Key * len(granules[:LOCK_EXEC_GRANULES]))(*granules[:LOCK_EXEC_GRANULES])
        values = (table.Leaf * len(keys))(*([1] * len(keys)))
        table.items_update_batch(keys, values)
        self.semaphores.attach(bpf, self.pids)
        self.python.refresh(bpf, target_procs.with_descendants(self.pids))

    def refresh(self, bpf, ctx: TargetContext) -> list[str]:
        """Attaches the semaphore uprobes to target processes that started since,
        and lists the threads of the CPython targets for their Python stacks."""
        assert self.core is not None, "the loader loads core_object before refresh"
        bpf = self.core
        self.python.refresh(bpf, target_procs.with_descendants(ctx.pids))
        return [f"locks: semaphore probes on {att.path} in pid {att.pid}"
                + ("" if att.complete else f" failed ({', '.join(att.failed)})")
                for att in self.semaphores.attach(bpf, target_procs.with_descendants(ctx.pids))]

    # -- while recording: remember which addresses need names ------------------
    def observe(self, raw: bytes) -> None:
        if raw[0] == EventType.FUTEX_WAIT:
            if len(raw) < _WAIT_FIELDS.size:
                return
            pid, ip, waker_ip, stack_id, waker_stack_id, nscan, waker_nscan, *scans, py_id, waker_py_id = (
                _WAIT_FIELDS.unpack_from(raw)
            )
            for py in (py_id, waker_py_id):
                if py > 0:
                    self._python_ids.setdefault(pid, set()).add(py)
            self._target_pids.add(pid)
            addrs = self._addrs.setdefault(pid, set())
            addrs.add(ip)
            if waker_ip:
                addrs.add(waker_ip)
            addrs.update(scans[: min(nscan, LOCK_SCAN_HITS)])
            addrs.update(scans[LOCK_SCAN_HITS : LOCK_SCAN_HITS + min(waker_nscan, LOCK_SCAN_HITS)])
            for sid in (stack_id, waker_stack_id):
                if sid >= 0:
                    self._stack_pids.setdefault(sid, pid)
        elif raw[0] == EventType.OFFCPU and len(raw) >= _OFF_STACK.size:
            sid, waker_pid = _OFF_STACK.unpack_from(raw)
            # Wakers outside the targets (a client, a kernel thread) are named by
            # tid only: symbolising arbitrary processes would parse their libraries.
            if sid >= 0 and waker_pid in self._target_pids:
                self._stack_pids.setdefault(sid, waker_pid)

    # -- at stop: totals from the maps, names for every address ----------------
    def snapshot(self, bpf) -> dict | None:
        assert self.core is not None, "the loader loads core_object before snapshot"
        bpf = self.core
        counters = bpf["lock_counters"]
        totals = {c.name.lower(): int(sum(counters[ctypes.c_int(c.value)])) for c in LockCounter}
        by_addr = [
            {"pid": k.tgid, "uaddr": k.uaddr, "waits": v.waits, "wait_ns": v.wait_ns, "max_ns": v.max_ns}
            for k, v in bpf["lock_addr_totals"].items()
        ]
        stacks: dict[str, list[int]] = {}
        stack_table = bpf["lock_stacks"]
        for sid, pid in self._stack_pids.items():
            stack = read_stack(stack_table, sid)
            if stack is None:
                continue
            stacks[str(sid)] = stack
            self._addrs.setdefault(pid, set()).update(stack)
        python_entries = read_stacks(bpf) if self._python_ids else {}
        python_stacks: dict[str, dict[str, list[str]]] = {}
        for pid, ids in self._python_ids.items():
            named = {str(i): [f for group in self.python.frames(pid, python_entries[i]) for f in group]
                     for i in sorted(ids) if i in python_entries}
            if named:
                python_stacks[str(pid)] = named
        symbols: dict[str, dict[str, dict]] = {}
        runtimes: dict[str, list[int]] = {}
        symbolizer = Symbolizer()
        for pid, addrs in self._addrs.items():
            symbolizer.remember_process(pid, read_files=False)  # only the files the addresses are in
            symbols[str(pid)] = {str(a): symbolizer.code_frame(pid, a).as_dict() for a in sorted(addrs)}
            if (runtime := cpython_runtime.runtime_range(pid)) is not None:
                runtimes[str(pid)] = list(runtime)
        return {
            "settings": {
                "floor_ns": self.floor_ns,
                "scan_floor_ns": self.scan_floor_ns,
                "offcpu_floor_ns": self.offcpu_floor_ns,
                "scan_words": 64,
                "exec_ranges": len(self.exec_ranges),
                "exec_granules": getattr(self, "exec_granules", 0),
                "sem_probed_processes": sum(a.complete for a in self.semaphores.attachments),
                **{f"have_{k}": v for k, v in self.have.items()},
            },
            "counters": totals,
            "addresses": sorted(by_addr, key=lambda r: -r["wait_ns"])[:500],
            "stacks": stacks,
            "python_stacks": python_stacks,  # pid -> Python stack id -> frames, innermost first
            "symbols": symbols,
            "semaphore_probes": self.semaphores.snapshot(),
            "cpython_runtime": runtimes,  # pid -> [start, end) of _PyRuntime: the GIL's futex words
        }

    def release(self) -> None:
        self.python.close()
