"""Each CPython thread's PyThreadState, found from user space, for the BPF frame walk.

Why user space: the walk (bpf/python_frames.bpf.h) needs the sampled
thread's thread state. CPython keeps the current one in a thread-local
(3.12+) or in a runtime field that only names the GIL holder (3.10, 3.11);
reading a thread-local from BPF needs the task's fs base, a kernel struct
field this project does not read. The interpreter's own thread list, in
its memory, names every thread: _PyRuntime.interpreters.head ->
PyInterpreterState.threads.head -> PyThreadState.next ..., each with the
kernel thread id (native_thread_id, 3.11+) or the pthread_t (3.10: the
kernel tid is read from glibc's struct pthread, at the offset found by
matching the main thread's id, which is the pid). Those are the tids of the
process's own pid namespace: a process in a container is mapped to the
host's tids through each task's NSpid.

attach() reads the version and layout, then checks them on the live
process: the list must be walkable and every thread state's thread id must
be one of the process's threads in /proc/PID/task. Only then is the layout
handed to BPF; otherwise the process is unsupported, with the reason.

threads() is called again about once a second (the stack sets' refresh), so
a thread started after attach has Python frames from the next refresh on:
at most about a second without them.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from inferprobe.collector.binaries import cpython_runtime
from inferprobe.collector.binaries.python_layouts import (
    DEBUG_COOKIE,
    DEBUG_OFFSETS_BYTES,
    LayoutProblem,
    PythonLayout,
    from_debug_offsets,
    table_layout,
    version_of_hex,
)
from inferprobe.collector.processes.proc_maps import maps_file_named

MAX_THREADS = 4096  # a thread list longer than this is taken as a bad read
MAX_INTERPRETERS = 64
PTHREAD_SCAN_BYTES = 0x800  # glibc's struct pthread keeps tid well inside this (0x2d0 on x86-64)


class ProcessMemory:
    """Reads of another process's memory through /proc/PID/mem."""

    def __init__(self, pid: int):
        self.pid = pid
        self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)

    def read(self, addr: int, size: int) -> bytes:
        try:
            data = os.pread(self._fd, size, addr)
        except (OSError, OverflowError):
            return b""
        return data

    def u64(self, addr: int) -> int | None:
        data = self.read(addr, 8)
        return struct.unpack("<Q", data)[0] if len(data) == 8 else None

    def close(self) -> None:
        os.close(self._fd)


def task_ids(pid: int) -> set[int]:
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return set()


def namespace_tids(pid: int) -> dict[int, int]:
    """The process's threads: tid as the process itself sees it -> tid here.

    Thread states hold the tid the thread got from gettid() in its own pid
    namespace (a container's); BPF and /proc here see the host's. The last
    NSpid field of a task's status is the innermost namespace's id."""
    out = {}
    for tid in task_ids(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                line = next((row for row in f if row.startswith("NSpid:")), "")
        except OSError:
            continue
        fields = line.split()[1:]
        out[int(fields[-1]) if fields else tid] = tid
    return out


@dataclass
class PythonProcess:
    pid: int
    interpreter: cpython_runtime.Interpreter
    layout: PythonLayout
    memory: ProcessMemory
    layout_source: str  # where the offsets came from, for doctor: its _Py_DebugOffsets or the table
    pthread_tid_offset: int | None = None  # 3.10: where struct pthread keeps the kernel tid
    main_interpreter: int | None = None  # PyInterpreterState of the main interpreter (head of the list)
    tstates: dict[int, int] = field(default_factory=dict)  # tid -> PyThreadState, last refresh

    @property
    def version(self) -> tuple[int, int]:
        return self.layout.version

    def _thread_states(self) -> list[int]:
        layout, mem = self.layout, self.memory
        out: list[int] = []
        interp = mem.u64(self.interpreter.runtime + layout.runtime_interpreters_head)
        for _ in range(MAX_INTERPRETERS):
            if not interp:
                break
            tstate = mem.u64(interp + layout.interp_threads_head)
            for _ in range(MAX_THREADS):
                if not tstate:
                    break
                out.append(tstate)
                tstate = mem.u64(tstate + layout.tstate_next)
            interp = mem.u64(interp + layout.interp_next)
        return out

    def _tid_of(self, tstate: int) -> int | None:
        layout, mem = self.layout, self.memory
        if layout.tstate_native_thread_id is not None:
            return mem.u64(tstate + layout.tstate_native_thread_id)
        pthread = mem.u64(tstate + layout.tstate_thread_id)
        if not pthread or self.pthread_tid_offset is None:
            return None
        data = mem.read(pthread + self.pthread_tid_offset, 4)
        return struct.unpack("<i", data)[0] if len(data) == 4 else None

    def _find_pthread_tid_offset(self, tstates: list[int]) -> int | None:
        """The offset of the kernel tid in glibc's struct pthread: the first one where every
        thread's value is one of the process's tids and the main thread's is the pid."""
        ns_tids = namespace_tids(self.pid)
        tasks, main = set(ns_tids), next((ns for ns, host in ns_tids.items() if host == self.pid), self.pid)
        blocks = []
        for tstate in tstates:
            pthread = self.memory.u64(tstate + self.layout.tstate_thread_id)
            block = self.memory.read(pthread, PTHREAD_SCAN_BYTES) if pthread else b""
            if len(block) == PTHREAD_SCAN_BYTES:
                blocks.append(block)
        for off in range(0, PTHREAD_SCAN_BYTES, 4):
            values = [struct.unpack_from("<i", b, off)[0] for b in blocks]
            if values and main in values and all(v in tasks for v in values) \
                    and len(set(values)) == len(values):
                return off
        return None

    def threads(self) -> dict[int, int]:
        """tid (as BPF sees it) -> PyThreadState address of every thread the interpreter knows, now."""
        found: dict[int, int] = {}
        to_host = namespace_tids(self.pid)
        for tstate in self._thread_states():
            tid = self._tid_of(tstate)
            if tid and tid in to_host:
                found[to_host[tid]] = tstate
        self.tstates = found
        return found

    def check(self) -> None:
        """Raises LayoutProblem unless the layout walks this process's thread list to real threads."""
        tstates = self._thread_states()
        if not tstates:
            raise LayoutProblem("its interpreter list holds no thread state at the expected offsets "
                                "(an interpreter not yet initialised, or offsets that do not fit)")
        self.main_interpreter = self.memory.u64(self.interpreter.runtime
                                                + self.layout.runtime_interpreters_head)
        if self.layout.tstate_native_thread_id is None:
            self.pthread_tid_offset = self._find_pthread_tid_offset(tstates)
            if self.pthread_tid_offset is None:
                raise LayoutProblem("no thread id of its thread states matches a thread of the process")
        tasks = set(namespace_tids(self.pid))
        tids = [self._tid_of(t) for t in tstates]
        if not all(tid in tasks for tid in tids):
            raise LayoutProblem(f"thread ids read with the offsets ({self.layout_source}: {tids[:4]}) "
                                "are not the process's threads: the offsets do not fit this build")


def _version(mem: ProcessMemory, interp: cpython_runtime.Interpreter) -> tuple[int, int]:
    if interp.version_addr is not None:
        hexversion = mem.u64(interp.version_addr)
        if hexversion:
            return version_of_hex(hexversion & 0xFFFFFFFF)
    if interp.name_version is not None:
        return interp.name_version
    raise LayoutProblem(f"the CPython version of {interp.path} cannot be told (no Py_Version, no version "
                        "in its name)")


def attach(pid: int, interp: cpython_runtime.Interpreter | None = None) -> PythonProcess | None:
    """The CPython process pid, checked and ready to walk; None when it is no CPython.
    Raises LayoutProblem (one sentence) for a CPython that cannot be walked. interp: pid's
    interpreter as cpython_runtime.find_interpreter found it (looked up here when not given)."""
    if interp is None:
        interp = cpython_runtime.find_interpreter(pid)
    if interp is None:
        return None
    try:
        mem = ProcessMemory(pid)
    except OSError as e:
        raise LayoutProblem(f"its memory cannot be read ({e.strerror})") from None
    try:
        version = _version(mem, interp)
        block = mem.read(interp.runtime, DEBUG_OFFSETS_BYTES)
        if version >= (3, 13) or block[:8] == DEBUG_COOKIE:
            layout, source = from_debug_offsets(block), "own _Py_DebugOffsets"
        else:
            layout, source = table_layout(version), f"{version[0]}.{version[1]} table, checked on the process"
        proc = PythonProcess(pid, interp, layout, mem, source)
        proc.check()
    except LayoutProblem:
        mem.close()
        raise
    return proc


def describe(pid: int) -> tuple[bool, str] | None:
    """(walked, one sentence) on pid's Python interpreter, for `doctor -p`; None when it runs none."""
    try:
        proc = attach(pid)
    except LayoutProblem as e:
        interp = cpython_runtime.find_interpreter(pid)
        where = f" in {interp.path}" if interp else ""
        return False, f"CPython{where}: {e}; its stacks show native frames only"
    if proc is not None:
        try:
            threads = len(proc.threads())
        finally:
            proc.memory.close()
        major, minor = proc.version
        return True, (f"CPython {major}.{minor} ({proc.interpreter.path}): Python frames in every stack "
                      f"(offsets: {proc.layout_source}; {threads} thread(s) now)")
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None
    if exe.startswith("pypy") or maps_file_named(pid, "libpypy"):
        return False, f"PyPy ({exe}): its frames are not walked; stacks show native frames only"
    if exe.startswith("python") or maps_file_named(pid, "libpython"):
        return False, (f"a Python ({exe}) whose _PyRuntime symbol cannot be found (a stripped build?): "
                       "its frames are not walked")
    return None
