"""Python stacks for the stack sets: the BPF maps fed, the kernel's stacks named and merged.

PythonTargets keeps, per traced CPython process, its checked layout
(collector/binaries/python_threads.py) and a code-object cache (collector/
python_code.py). It fills python_layouts and python_threads
(bpf/python_stacks.bpf.h) at attach and on each refresh, names every
process it could not walk (unsupported()), and turns a python_stacks entry
into frames.

splice() merges those frames into the native stack, root first. In 3.11+
one C call of _PyEval_EvalFrameDefault runs several Python frames (calls
between Python functions do not recurse in C); the walk marks where each C
call's frames begin (3.11 is_entry, 3.12+ the owner-CSTACK shim; in 3.10
every frame is its own call), so the k-th eval-loop frame from the leaf is
replaced by the k-th group of Python frames from the leaf and the flame
graph reads handler -> engine.step -> torch... When the native walk did not
reach that far (libpython without frame pointers: the usual case for
distribution and pyenv builds), the Python frames that have no eval-loop
frame to stand in for are put first, then NATIVE_GAP, then what the native
walk found: the Python part is whole, the native part between is unknown.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from inferprobe.collector.binaries import cpython_runtime, python_threads
from inferprobe.collector.binaries.cpython_runtime import Interpreter
from inferprobe.collector.binaries.python_code import CodeResolver
from inferprobe.collector.binaries.python_layouts import LayoutProblem, PythonLayout
from inferprobe.collector.binaries.python_threads import PythonProcess
from inferprobe.collector.model.stack_markers import NATIVE_GAP, TRUNCATED, UNREADABLE

EVAL_FRAMES = frozenset({"_PyEval_EvalFrameDefault"})
LAYOUT_CFRAME = 0x1  # PYTHON_LAYOUT_CFRAME, bpf/python_frames.bpf.h
LAYOUT_PTHREAD_TID = 0x2  # PYTHON_LAYOUT_PTHREAD_TID
OWNED_BY_CSTACK = 3
# The kernel ids of the python_threads maps whose python_thread_exit is attached
# (an id is not reused while its map lives, and there is one map per recording).
_EXIT_HOOKED: set[int] = set()
CODE_MASK = (1 << 56) - 1  # the frame's code field carries the entry/owner byte in bits 56-63


def bpf_layout_fields(proc: PythonProcess) -> dict[str, int]:
    """struct python_layout's values for one checked CPython process."""
    layout = proc.layout
    pthread = layout.tstate_native_thread_id is None
    return {
        "flags": (LAYOUT_CFRAME if layout.cframe_frame is not None else 0)
        | (LAYOUT_PTHREAD_TID if pthread else 0),
        "tstate_frame": layout.tstate_frame,
        "cframe_frame": layout.cframe_frame or 0,
        "frame_previous": layout.frame_previous,
        "frame_code": layout.frame_code,
        "frame_instr": layout.frame_instr,
        "frame_entry": layout.frame_entry if layout.frame_entry is not None else 0,
        "frame_read": layout.frame_read,
        "interp_threads_head": layout.interp_threads_head,
        "tstate_next": layout.tstate_next,
        "tstate_tid": layout.tstate_thread_id if pthread else (layout.tstate_native_thread_id or 0),
        "pthread_tid": proc.pthread_tid_offset or 0,
        "interp": proc.main_interpreter or 0,
        **_pid_namespace(proc.pid),
    }


def _pid_namespace(pid: int) -> dict[str, int]:
    """The process's pid namespace for BPF, where it is not this one's (0s: the same)."""
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/pid"), os.stat("/proc/self/ns/pid")
    except OSError:
        return {"pidns_dev": 0, "pidns_ino": 0}
    if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
        return {"pidns_dev": 0, "pidns_ino": 0}
    return {"pidns_dev": theirs.st_dev, "pidns_ino": theirs.st_ino}


def segments(layout: PythonLayout, raw: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Raw (code field, instruction) frames, innermost first, grouped by C call of the
    eval loop (innermost group first); shim frames dropped."""
    groups: list[list[tuple[int, int]]] = [[]]
    kind = layout.entry_kind
    for code_field, instr in raw:
        marker = code_field >> 56
        frame = (code_field & CODE_MASK, instr)
        if kind == "owner-shim" and marker == OWNED_BY_CSTACK:
            groups.append([])
            continue
        groups[-1].append(frame)
        if kind == "every-frame" or (kind == "is-entry" and marker):
            groups.append([])
    return [g for g in groups if g]


def splice(native: list[str], python_groups: list[list[str]]) -> list[str]:
    """Native frames (root first) with the Python frame groups (innermost group first, each
    group innermost first) in place of the eval-loop frames."""
    if not python_groups:
        return native
    # A CPython run with -X perf also names its trampolines from the perf map
    # (py::function:file): the walked frames say the same, with lines.
    native = [name for name in native if not name.startswith("py::")]
    evals = [i for i, name in enumerate(native) if name in EVAL_FRAMES]
    matched = min(len(evals), len(python_groups))
    # innermost eval frame <-> innermost group
    replace = {evals[len(evals) - 1 - k]: python_groups[k] for k in range(matched)}
    out: list[str] = []
    unmatched = python_groups[matched:]
    if unmatched:
        for group in reversed(unmatched):
            out.extend(reversed(group))
        out.append(NATIVE_GAP)
    for i, name in enumerate(native):
        if name == TRUNCATED and unmatched:
            continue  # the gap marker says it
        if i in replace:
            out.extend(reversed(replace[i]))
        else:
            out.append(name)
    return out


@dataclass
class PythonTargets:
    """The traced CPython processes, as the stack sets see them.

    No answer about a process is final until it is walked: one that is not (yet) a CPython,
    or whose interpreter does not check out, is asked again at each refresh. A process
    caught between fork and exec (a launcher, pyenv's shim), before the dynamic loader
    mapped libpython, or before Py_Initialize made its first thread state is not a walkable
    CPython for that moment only; on a loaded host the moment lasts seconds, and a negative
    answer kept for the whole recording left such a process with no Python frame at all.
    find_interpreter's symbol scan (tens of ms) is redone only when the process's image
    changed (cpython_runtime.image_of: an exec, a library mapped); the check on its memory
    is a few reads, redone each time."""

    processes: dict[int, PythonProcess] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)  # pid -> why its frames are not walked (now)
    resolvers: dict[int, CodeResolver] = field(default_factory=dict)
    # pid -> (its image, find_interpreter's answer for that image)
    looked_up: dict[int, tuple[tuple[str, str], Interpreter | None]] = field(default_factory=dict)
    pending: dict[int, str] = field(default_factory=dict)  # pid -> why not walked yet (not a CPython yet)
    walked_since_ns: dict[int, int] = field(default_factory=dict)  # pid -> when its walk began (monotonic)
    unwalked_before: dict[int, str] = field(default_factory=dict)  # pid -> why not walked until then

    def _no_interpreter(self, pid: int, image: tuple[str, str]) -> None:
        """Notes why pid, with no _PyRuntime in its maps now, is not walked."""
        exe = image[0] or "?"
        files = cpython_runtime.candidate_files(pid)
        if files:
            names = ", ".join(os.path.basename(f) for f in files)
            self.pending.pop(pid, None)
            self.problems[pid] = (f"no _PyRuntime symbol in {names} (a stripped build, or libpython "
                                  "not loaded yet)")
        else:
            self.problems.pop(pid, None)
            self.pending[pid] = f"it ran no CPython yet (its executable was {exe})"

    def _attach(self, pid: int) -> PythonProcess | None:
        if pid in self.processes:
            return self.processes[pid]
        image = cpython_runtime.image_of(pid)
        if image is None:
            return None  # gone
        known = self.looked_up.get(pid)
        if known is not None and known[0] == image:
            interp = known[1]
            if interp is None:
                return None  # still no CPython: neither exec'd nor a library mapped since
        else:
            try:
                interp = cpython_runtime.find_interpreter(pid)
            except OSError:
                return None  # gone
            self.looked_up[pid] = (image, interp)
            if interp is None:
                self._no_interpreter(pid, image)
                return None
        try:
            proc = python_threads.attach(pid, interp)
        except LayoutProblem as e:
            self.problems[pid] = str(e)  # asked again at the next refresh: it may be starting up
            return None
        except OSError:
            return None  # gone
        if proc is None:
            return None
        before = self.problems.pop(pid, None) or self.pending.pop(pid, None)
        self.pending.pop(pid, None)
        if before is not None:
            self.unwalked_before[pid] = before
        self.walked_since_ns[pid] = time.monotonic_ns()
        self.processes[pid] = proc
        self.resolvers[pid] = CodeResolver(proc.memory, proc.layout)
        return proc

    def naming(self, pid: int, started_ns: int) -> tuple[dict, str | None]:
        """How pid's Python frames were named, for its entry in a stack snapshot: fields, and a
        note for the report where they were not walked from the start (started_ns: when the
        set began sampling), or not at all."""
        if pid in self.processes:
            since = self.walked_since_ns.get(pid, 0)
            if since <= started_ns or pid not in self.unwalked_before:
                return {}, None
            after_s = round((since - started_ns) / 1e9, 3)
            before = self.unwalked_before[pid]
            return ({"python_walked_from_s": after_s, "python_unwalked_before": before},
                    f"Python frames are named only from {after_s:.1f} s into the recording on; "
                    f"samples before then have none: {before}")
        problem = self.problems.get(pid)
        if problem is not None:
            return {"python_unsupported": problem}, f"Python frames are not shown: {problem}"
        return {}, None

    @staticmethod
    def _attach_exit_hook(core) -> None:
        # Every stack set's object has python_thread_exit, and all of them share one
        # python_threads map: the first PythonTargets to see that map attaches its own.
        threads_map = core.map_id("python_threads")
        if threads_map not in _EXIT_HOOKED:
            core.attach_tracepoint("python_thread_exit", "sched", "sched_process_exit")
            _EXIT_HOOKED.add(threads_map)

    def refresh(self, core, pids: list[int]) -> None:
        """Attaches to new CPython processes and writes every thread's state address to BPF
        (BPF looks up threads started since in the interpreter's list itself). core is the
        set's loaded object (collector/attach/libbpf.BpfObject)."""
        self._attach_exit_hook(core)
        layouts, threads = core["python_layouts"], core["python_threads"]
        for pid in pids:
            known = pid in self.processes
            proc = self._attach(pid)
            if proc is None:
                continue
            if not known:
                leaf = layouts.Leaf()
                for name, value in bpf_layout_fields(proc).items():
                    setattr(leaf, name, value)
                layouts[layouts.Key(pid)] = leaf
            before = set(proc.tstates)
            try:
                now = proc.threads()
            except OSError:
                continue
            for tid, tstate in now.items():
                threads[threads.Key(tid)] = threads.Leaf(tstate)
            for tid in before - set(now):
                try:
                    del threads[threads.Key(tid)]
                except KeyError:
                    pass

    def unsupported(self) -> dict[int, str]:
        return dict(self.problems)

    def version_of(self, pid: int) -> str | None:
        proc = self.processes.get(pid)
        return f"{proc.version[0]}.{proc.version[1]}" if proc else None

    def frames(self, pid: int, entry) -> list[list[str]]:
        """A python_stacks entry of pid as groups of frame labels (innermost group first)."""
        proc, resolver = self.processes.get(pid), self.resolvers.get(pid)
        if proc is None or resolver is None:
            return []
        depth = min(int(entry.depth), len(entry.frames))
        raw = [(int(entry.frames[i].code), int(entry.frames[i].instr)) for i in range(depth)]
        out = []
        for group in segments(proc.layout, raw):
            labels = []
            for code, instr in group:
                frame = resolver.frame(code, instr)
                labels.append(frame.label if frame else UNREADABLE)
            out.append(labels)
        return out

    def close(self) -> None:
        for proc in self.processes.values():
            proc.memory.close()
        self.processes.clear()


def read_stacks(core) -> dict[int, object]:
    """python_stacks: id -> entry (ctypes), read once."""
    return {int(k.value): v for k, v in core["python_stacks"].items()}

