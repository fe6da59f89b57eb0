"""Stack probe sets: on-CPU sampling (bpf/profile.bpf.c) and off-CPU waits
(the profile part of the off-CPU tracker, bpf/offcpu.bpf.c).

Both count samples per stack in the kernel, in objects built ahead of time
(CO-RE, loaded with libbpf: core_object); the Python stack maps of
bpf/python_stacks.bpf.h are one instance for both and for the locks set. At stop, snapshot() reads the
counts and stack maps and symbolises every stack right away, while the
targets still run (a process that exited earlier is resolved from the maps
remembered while it lived: tick() refreshes them once a second). The
recording stores the folded frames, so `flamegraph` and `report` never need
the traced host's files.

Snapshot layout (one per set, under its name in Recording.snapshots):
    kind            "cpu" or "offcpu"
    unit            "samples" or "us" (off-CPU weights are blocked microseconds)
    hz / min_us     sampling rate / shortest off-CPU period recorded
    counters        samples, collisions, lost, keys_full, short, unmatched,
                    python_stacks (samples with Python frames), python_lost
    stacks          [{pid, tid, thread, user_stack_id, kernel_stack_id, flags, python_stack_id,
                      frames (root first), weight, periods}]
    processes       {pid: {comm, exe, python, python_version[, python_unsupported]
                           [, python_walked_from_s, python_unwalked_before]}}
                    python: frames (walked from the thread states: collector/binaries/python_stacks.py)
                    | perf-map | unresolved | null
                    python_unsupported: why its frames were not walked (one sentence)
                    python_walked_from_s / python_unwalked_before: walked only from this many
                    seconds after the set started, and why not before
    notes           sentences the report shows (unresolved Python frames, lost stacks)
"""

from __future__ import annotations

import ctypes
import errno
import time
from pathlib import Path

from inferprobe.collector.attach.libbpf import BpfObject
from inferprobe.collector.attach.perf_events import online_cpus, open_cpu_clock
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.binaries.python_stacks import PythonTargets, read_stacks, splice
from inferprobe.collector.binaries.symbolizer import PYTHON_HOWTO, Symbolizer
from inferprobe.collector.model.events import STACK_FLAG_PREEMPTED, StackCounter
from inferprobe.collector.model.stack_markers import PYTHON_LOST

SWITCH_FORMAT = Path("/sys/kernel/tracing/events/sched/sched_switch/format")
DEFAULT_HZ = 49
DEFAULT_OFFCPU_MIN_US = 1000
# The sizes of the profile's maps in the off-CPU tracker (bpf/offcpu.bpf.c), which
# leaves them at one entry for a recording that uses only the lock set's part.
OFFCPU_PROFILE_SIZES = {"offcpu_stacks": 16384, "offcpu_counts": 65536}
LOST_COLLISION = "[lost: stack map collision]"
LOST_STACK = "[lost: no user stack]"
PREEMPTED = "[preempted: runnable, waiting for a CPU]"


class _StackSet(ProbeSet):
    """What the two stack sets share: counters, symbolisation, the snapshot."""

    prefix = ""  # map names: <prefix>_stacks, _counts, _counters
    kind = ""
    unit = "samples"

    def __init__(self) -> None:
        self.symbolizer = Symbolizer()
        self.python = PythonTargets()
        self.python_frames = True
        self._python_stacks: dict[int, object] = {}
        self.stream = False
        self.started_ns = 0

    def prepare(self, ctx: TargetContext) -> str | None:
        self.stream = bool(ctx.options.get("phases"))
        self.python_frames = bool(ctx.options.get("python_frames", True))
        return None

    def configure(self, core: BpfObject) -> None:
        # one flag for all sets (they share the walk's maps): --no-python-frames turns it off for all
        core.set_constant("python_stacks_off", not self.python_frames)
        core.set_constant(f"{self.prefix}_stream", self.stream)

    def _remember_targets(self, bpf) -> None:
        from inferprobe.collector.attach.target_bitmap import target_pids

        # the targets map also holds thread ids: only thread group leaders have maps of their own
        leaders = [pid for pid in target_pids(bpf) if Path(f"/proc/{pid}/task/{pid}").exists()]
        for pid in leaders:
            self.symbolizer.remember_process(pid)
        if self.python_frames:
            self.python.refresh(self.core, leaders)

    def after_load(self, bpf, ctx: TargetContext) -> None:
        for pid in ctx.pids:
            self.symbolizer.remember_process(pid)
        if self.python_frames:
            leaders = [pid for pid in ctx.pids if Path(f"/proc/{pid}/task/{pid}").exists()]
            self.python.refresh(self.core, leaders)
        self.started_ns = time.monotonic_ns()

    def release(self) -> None:
        self.python.close()

    def refresh(self, bpf, ctx: TargetContext) -> None:
        self._remember_targets(bpf)

    def counters(self, bpf) -> dict[str, int]:
        assert self.core is not None, "the loader loads core_object before the set is read"
        table = self.core[f"{self.prefix}_counters"]
        return {c.name.lower(): int(sum(table[ctypes.c_int(c.value)])) for c in StackCounter}

    def _walk(self, bpf, stack_id: int) -> list[int]:
        assert self.core is not None, "the loader loads core_object before the set is read"
        try:
            return list(self.core[f"{self.prefix}_stacks"].walk(stack_id))
        except KeyError:
            return []

    def _user_frames(self, bpf, pid: int, user_id: int, python_id: int) -> list[str]:
        if user_id >= 0:
            native = self.symbolizer.user_stack(pid, self._walk(bpf, user_id))
        else:
            native = [LOST_COLLISION if user_id == -errno.EEXIST else LOST_STACK]
        if python_id < 0:
            return [PYTHON_LOST, *native]
        entry = self._python_stacks.get(python_id) if python_id else None
        groups = self.python.frames(pid, entry) if entry is not None else []
        return splice(native, groups)

    def _frames(self, bpf, pid: int, user_id: int, kernel_id: int, flags: int, python_id: int,
                cache: dict) -> list[str]:
        key = (pid, user_id, kernel_id, flags, python_id)
        if key in cache:
            return cache[key]
        frames = self._user_frames(bpf, pid, user_id, python_id)
        if kernel_id >= 0:
            frames += [self.symbolizer.kernel_frame(a) for a in reversed(self._walk(bpf, kernel_id))]
        elif kernel_id == -errno.EEXIST:
            frames.append(LOST_COLLISION)
        if flags & STACK_FLAG_PREEMPTED:
            frames.append(PREEMPTED)
        cache[key] = frames
        return frames

    def _weights(self, value) -> tuple[int, int]:
        """(weight, periods) of one counts-map value."""
        raise NotImplementedError

    def snapshot(self, bpf) -> dict | None:
        began = time.monotonic()
        self._remember_targets(bpf)
        cache: dict = {}
        stacks: list[dict] = []
        assert self.core is not None, "the loader loads core_object before the set is read"
        self._python_stacks = read_stacks(self.core)
        for key, value in self.core[f"{self.prefix}_counts"].items():
            weight, periods = self._weights(value)
            pid, tid = int(key.pid), int(key.tid)
            stacks.append({
                "pid": pid,
                "tid": tid,
                "thread": self.symbolizer.thread_name(pid, tid),
                "user_stack_id": int(key.user_stack_id),
                "kernel_stack_id": int(key.kernel_stack_id),
                "flags": int(key.flags),
                "python_stack_id": int(key.python_stack_id),
                "frames": self._frames(bpf, pid, int(key.user_stack_id), int(key.kernel_stack_id),
                                       int(key.flags), int(key.python_stack_id), cache),
                "weight": weight,
                "periods": periods,
            })
        stacks.sort(key=lambda s: -s["weight"])
        # a stack's id is only meaningful together with its pid: keep the
        # resolved frames per (pid, user id, kernel id, flags) for streamed samples
        processes = {}
        notes = []
        seen = {s["pid"] for s in stacks}
        for pid in sorted(seen):
            info = self.symbolizer.processes.get(pid)
            status = info.python_status() if info else None
            version = self.python.version_of(pid)
            # why not walked, or walked only from some time on (collector/binaries/python_stacks.py)
            if self.python_frames:
                naming, naming_note = self.python.naming(pid, self.started_ns)
            elif status == "unresolved":
                off = "the frame walk was off for this recording (python_frames=False)"
                naming, naming_note = {"python_unsupported": off}, f"Python frames are not shown: {off}"
            else:
                naming, naming_note = {}, None
            if version is not None:
                status = "frames"
            processes[str(pid)] = {
                "comm": info.comm if info else "?",
                "exe": info.exe if info else "",
                "python": status,
                "python_version": version,
                **naming,
            }
            if naming_note is not None:
                notes.append(f"pid {pid} ({info.comm if info else '?'}): {naming_note}")
            elif info is not None and status == "unresolved":
                notes.append(f"pid {pid} ({info.comm}): {PYTHON_HOWTO}")
        counters = self.counters(bpf)
        lost = counters["collisions"] + counters["lost"] + counters["keys_full"]
        if lost:
            notes.append(
                f"{lost} stack(s) incomplete or dropped in the kernel ({counters['collisions']} stack map "
                f"collisions, {counters['lost']} user stacks not readable, {counters['keys_full']} "
                "samples over the counts table): they are shown as [lost: ...] frames or missing"
            )
        return {
            "kind": self.kind,
            "unit": self.unit,
            **self.settings(),
            "streamed": self.stream,
            "started_monotonic_ns": self.started_ns,
            "stopped_monotonic_ns": time.monotonic_ns(),
            "counters": counters,
            "stacks": stacks,
            "processes": processes,
            "notes": notes,
            "symbolize_s": round(time.monotonic() - began, 3),
        }

    def settings(self) -> dict:
        return {}


class ProfileProbes(_StackSet):
    name = "profile"
    core_object = "profile.bpf.o"
    description = "on-CPU stacks of the target threads, sampled on the cpu-clock perf event"
    prefix = "profile"
    kind = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self.hz = DEFAULT_HZ

    def prepare(self, ctx: TargetContext) -> str | None:
        super().prepare(ctx)
        self.hz = int(ctx.options.get("profile_hz", DEFAULT_HZ))
        if not 1 <= self.hz <= 10000:
            return f"a sampling rate of {self.hz} Hz is outside 1-10000"
        return None

    def after_load(self, bpf, ctx: TargetContext) -> None:
        assert self.core is not None, "the loader loads core_object before after_load"
        # One software cpu-clock event per CPU (perf_events.open_cpu_clock says why that one).
        for cpu in online_cpus():
            self.core.attach_perf_event("profile_on_cpu", open_cpu_clock(cpu, 1_000_000_000 // self.hz))
        super().after_load(bpf, ctx)

    def _weights(self, value) -> tuple[int, int]:
        return int(value.value), int(value.value)

    def settings(self) -> dict:
        return {"hz": self.hz}


class OffcpuProbes(_StackSet):
    name = "offcpu"
    core_object = "offcpu.bpf.o"
    description = "off-CPU stacks of the target threads at sched_switch, weighted by time off the CPU"
    prefix = "offcpu"
    state_maps = ("offcpu_start",)
    kind = "offcpu"
    unit = "us"

    def __init__(self) -> None:
        super().__init__()
        self.min_us = DEFAULT_OFFCPU_MIN_US

    def prepare(self, ctx: TargetContext) -> str | None:
        super().prepare(ctx)
        self.min_us = int(ctx.options.get("offcpu_min_us", DEFAULT_OFFCPU_MIN_US))
        if not SWITCH_FORMAT.exists():
            return f"the kernel has no sched:sched_switch tracepoint ({SWITCH_FORMAT}): is tracefs mounted?"
        return None

    def configure(self, core: BpfObject) -> None:
        """The off-CPU tracker's profile part (the lock set may turn on its events part)."""
        super().configure(core)
        core.set_constant("offcpu_profile", True)
        core.set_constant("offcpu_min_ns", self.min_us * 1000)
        for name, entries in OFFCPU_PROFILE_SIZES.items():
            core.set_max_entries(name, entries)

    def after_load(self, bpf, ctx: TargetContext) -> None:
        assert self.core is not None, "the loader loads core_object before after_load"
        self.core.attach("offcpu_on_switch")
        super().after_load(bpf, ctx)

    def _weights(self, value) -> tuple[int, int]:
        return int(value.total_us), int(value.periods)

    def settings(self) -> dict:
        return {"min_us": self.min_us}
