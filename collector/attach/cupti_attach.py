"""Loading the CUPTI shim into a running process, and stopping it, through gdb.

The way memray's `attach` loads its tracker: a debugger stops the process,
calls dlopen() on the library inside it, then calls the library's entry
point and reads back what it said. Here the calls are
inferprobe_cupti_start() / inferprobe_cupti_stop() and
inferprobe_cupti_status(), the shim's one-sentence status, so the user sees
CUPTI's own verdict (collecting, or why not).

Before touching the process every refusal that can be known from outside
is checked, each one sentence (TargetProblem / EnvironmentProblem):
the process is gone; the shim is not built; ptrace is not allowed
(kernel.yama.ptrace_scope, CAP_SYS_PTRACE); the process maps no CUDA
library; it has a CUDA driver on the host but no CUDA context yet (calling
into CUDA from a debugger there would initialise it at an arbitrary point).

The calls run on the thread gdb stopped first (the main thread), wherever
it was: usually blocked in a system call, holding no user-space lock. gdb's
`unwindonsignal` unwinds a call that faults instead of leaving the process
stopped in it. What remains unsafe: if another thread holds the dynamic
loader's lock at that instant, dlopen() waits for it while every thread is
stopped; the timeout below ends gdb (the process resumes) and says so.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from inferprobe.collector.attach.probe_sets.gpu import cuda_libraries
from inferprobe.collector.binaries import cupti_shim
from inferprobe.collector.errors import EnvironmentProblem, TargetProblem
from inferprobe.collector.model.gpu_catalog import Library
from inferprobe.collector.processes import targets as target_procs

GDB = os.environ.get("INFERPROBE_GDB", "/usr/bin/gdb")
PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
CAP_SYS_PTRACE = 19
RTLD_NOW, RTLD_NOLOAD = 2, 4
DEFAULT_TIMEOUT_S = 60.0
# Device nodes a process holds once it has a CUDA context: /dev/nvidia0, /dev/nvidia1, ...
DEVICE_NODE = re.compile(r"^/dev/nvidia\d+$")
DRIVER_NAMES = ("libcuda.so.1", "libcuda.so")
DRIVER_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
               "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib")


@dataclass(frozen=True)
class ShimReply:
    """What the shim said inside the process."""

    status: cupti_shim.ShimStatus
    sentence: str
    shim: str


# ------------------------------------------------------------------ checks from outside


def _effective_caps(status_text: str) -> int:
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_ptrace(pid: int, scope_file: Path = PTRACE_SCOPE, self_status: str | None = None) -> None:
    """Refuses when Yama will not let this process ptrace pid."""
    try:
        scope = int(scope_file.read_text().strip())
    except (OSError, ValueError):
        return  # no Yama: plain Unix rules (same uid, or root), which gdb reports itself
    if scope == 0:
        return
    if scope >= 3:
        raise EnvironmentProblem(
            f"ptrace is disabled on this host (kernel.yama.ptrace_scope={scope}), so no debugger can "
            f"load the CUPTI shim into pid {pid}: start the server with CUDA_INJECTION64_PATH instead "
            "(docs/gpu.md)")
    if self_status is None:
        self_status = Path("/proc/self/status").read_text()
    if not _effective_caps(self_status) >> CAP_SYS_PTRACE & 1:
        raise EnvironmentProblem(
            f"ptrace of pid {pid} is not allowed (kernel.yama.ptrace_scope={scope} needs CAP_SYS_PTRACE): "
            "run gpu-attach as root")


def _host_has_driver() -> bool:
    """A CUDA driver is installed here (its library or its control device exists)."""
    if os.path.exists("/dev/nvidiactl"):
        return True
    return any(os.path.exists(os.path.join(d, n)) for d in DRIVER_DIRS for n in DRIVER_NAMES)


def _has_device_open(pid: int) -> bool:
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = list(fd_dir.iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if DEVICE_NODE.match(os.readlink(fd)):
                return True
        except OSError:
            continue
    return False


def check_cuda(pid: int) -> None:
    """Refuses a process with no CUDA library mapped, or no CUDA context yet."""
    libs = {m.library for m in cuda_libraries(pid)}
    if not libs:
        raise TargetProblem(
            f"pid {pid} has no CUDA library mapped (libcudart, libcuda): it has not used CUDA, so there "
            "is nothing for CUPTI to trace")
    if Library.DRIVER not in libs:
        if _host_has_driver():
            raise TargetProblem(
                f"pid {pid} has no CUDA context yet (libcudart is mapped but the driver, libcuda, is not): "
                "attach after its first CUDA call")
        return  # no driver on this host at all: the shim loads and CUPTI says there is no device
    if not _has_device_open(pid):
        raise TargetProblem(
            f"pid {pid} has no CUDA context yet (libcuda is mapped but no /dev/nvidiaN is open): attach "
            "after its first CUDA call")


def _checked_shim() -> Path:
    shim = cupti_shim.built_shim()
    if shim is None:
        raise EnvironmentProblem(f"the CUPTI shim is not built: {cupti_shim.BUILD_HINT}")
    return shim


def _checked_gdb() -> str:
    gdb = shutil.which(GDB) or shutil.which("gdb")
    if gdb is None:
        raise EnvironmentProblem(f"gpu-attach needs gdb, and {GDB} is not there: apt-get install gdb")
    return gdb


# ------------------------------------------------------------------ the debugger call

# What gdb 13 prints when it cannot set up a call in the inferior: on CPUs with
# AMX (Sapphire Rapids and later) it fails to write back the XSAVE state, and
# every `call` fails. Seen on the test VM (gdb 13.1, Linux 6.18).
GDB_CANNOT_CALL = "Couldn't write extended state status"

_REPLY = re.compile(r"^inferprobe-(handle|status|dlerror) (.*)$", re.M)


def _gdb_script(path: str, open_flags: int, entry: str) -> list[str]:
    """gdb commands: dlopen, then entry() and the status sentence through dlsym (the shim has
    no debug symbols gdb would need to call it by name)."""
    return [
        "set confirm off",
        "set unwindonsignal on",
        f'set $h = ((void*(*)(char*, int))dlopen)("{path}", {open_flags})',
        'printf "inferprobe-handle %p\\n", $h',
        'if $h == 0\n printf "inferprobe-dlerror %s\\n", ((char*(*)(void))dlerror)()\nend',
        f'if $h != 0\n set $rc = ((int(*)(void))dlsym($h, "{entry}"))()\n'
        ' printf "inferprobe-status %d %s\\n", $rc, ((char*(*)(void))dlsym($h, "inferprobe_cupti_status"))()'
        "\nend",
    ]


def _run_gdb(pid: int, commands: list[str], timeout_s: float) -> str:
    with tempfile.NamedTemporaryFile("w", prefix="inferprobe-gdb-", suffix=".gdb") as script:
        script.write("\n".join(commands) + "\n")
        script.flush()
        argv = [_checked_gdb(), "-p", str(pid), "-batch", "-nx", "-x", script.name]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            done = None
    if done is None:
        raise TargetProblem(
            f"gdb did not finish within {timeout_s:.0f} s in pid {pid} (a thread may hold the dynamic "
            "loader's lock); gdb was stopped and the process resumed") from None
    out = done.stdout + done.stderr
    if "ptrace: Operation not permitted" in out:
        raise EnvironmentProblem(f"the kernel refused to let gdb ptrace pid {pid} (Operation not permitted): "
                                 "run gpu-attach as root, or as the process's user with ptrace allowed")
    if "No such process" in out:
        raise TargetProblem(f"no process with pid {pid} (has it exited?)")
    if GDB_CANNOT_CALL in out:
        raise EnvironmentProblem(_cannot_call_sentence(f"pid {pid}"))
    return out


def _cannot_call_sentence(where: str) -> str:
    return (f"gdb cannot call a function in {where} on this host: it could not write back the stopped "
            f"thread's extended register state (\"{GDB_CANNOT_CALL}\"), a limitation of gdb 13 on CPUs "
            f"with AMX; point INFERPROBE_GDB at a gdb that can (now {GDB})")


@functools.cache
def check_gdb_can_call() -> None:
    """Tries gdb's call on a throwaway child first: where gdb cannot set up a call,
    its failed attempt leaves the target's blocked system call returning an
    internal errno (ERESTARTSYS, 512) to the program, so a real process is
    never the first one tried. Once per run."""
    child = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        done = subprocess.run([_checked_gdb(), "-p", str(child.pid), "-batch", "-nx",
                               "-ex", "call (int)getpid()"],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return   # slow, not refused: the real call has its own timeout
    finally:
        child.kill()
        child.wait()
    if GDB_CANNOT_CALL in done.stdout + done.stderr:
        raise EnvironmentProblem(_cannot_call_sentence("a process"))


def _parse_reply(pid: int, out: str, shim: str) -> ShimReply:
    found = {kind: value for kind, value in _REPLY.findall(out)}
    if "dlerror" in found:
        raise TargetProblem(f"pid {pid} could not load the CUPTI shim: {found['dlerror'].strip()}")
    status = found.get("status")
    if status is None:
        last = [line for line in out.splitlines() if line.strip()][-1:] or ["no output"]
        raise TargetProblem(f"gdb could not call into pid {pid} ({last[0].strip()})")
    code, _, sentence = status.partition(" ")
    return ShimReply(cupti_shim.ShimStatus(int(code)), sentence.strip(), shim)


def attach(pid: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> ShimReply:
    """Loads the shim into pid (once) and starts CUPTI collection there."""
    target_procs.check_alive(pid)
    loaded = cupti_shim.mapped_shim(pid)
    shim = loaded or str(_checked_shim())
    check_ptrace(pid)
    check_cuda(pid)
    check_gdb_can_call()
    out = _run_gdb(pid, _gdb_script(shim, RTLD_NOW, "inferprobe_cupti_start"), timeout_s)
    return _parse_reply(pid, out, shim)


def detach(pid: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> ShimReply:
    """Stops the shim's collection in pid. The library stays mapped: CUPTI cannot be unloaded."""
    target_procs.check_alive(pid)
    shim = cupti_shim.mapped_shim(pid)
    if shim is None:
        raise TargetProblem(f"pid {pid} does not have the CUPTI shim loaded: nothing to detach")
    check_ptrace(pid)
    check_gdb_can_call()
    out = _run_gdb(pid, _gdb_script(shim, RTLD_NOW | RTLD_NOLOAD, "inferprobe_cupti_stop"), timeout_s)
    return _parse_reply(pid, out, shim)
