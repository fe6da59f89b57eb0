"""Can this host trace? Environment checks for `inferprobe doctor` and `record`.

Each check returns one Check and never raises: a kernel too old, no BTF, a
refused syscall or a missing libbpf becomes ok=False with a one-line detail
and, where there is one, the exact command that fixes it. `record` runs the
BTF check before it loads BPF, so both commands tell the same story.

The BPF programs are built ahead of time (CO-RE): what a host needs at run
time is a 5.8+ kernel, its BTF (or a BTF file for it, --btf) and libbpf 1.x.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferprobe.collector.attach.kernel_version import OLDEST_KERNEL, ensure_kernel_version
from inferprobe.collector.attach.libbpf_library import BTF_VMLINUX
from inferprobe.collector.errors import EnvironmentProblem

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

TRACEFS_MOUNTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
UPROBE_TYPE = "/sys/bus/event_source/devices/uprobe/type"
SETUP_FIX = "sudo make setup"

# bpf(2) numbers per architecture; asm-generic ones share 280.
_BPF_SYSCALL_NR = {
    "x86_64": 321,
    "i386": 357,
    "i686": 357,
    "aarch64": 280,
    "riscv64": 280,
    "loongarch64": 280,
    "s390x": 351,
    "ppc64le": 361,
    "ppc64": 361,
}
_DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el", "s390x": "s390x"}


@dataclass(frozen=True)
class Check:
    """One environment check. `required` checks gate tracing; the others
    (BTF, uprobes, USDT) only switch optional features off."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    required: bool = True


# ---------------------------------------------------------------- helpers


def _one_line(exc: BaseException | str) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def parse_cap_eff(status_text: str) -> int | None:
    """The CapEff bit mask from the text of /proc/<pid>/status, or None."""
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", status_text, re.MULTILINE)
    return int(match.group(1), 16) if match else None


def has_cap(cap_eff: int, cap: int) -> bool:
    return bool((cap_eff >> cap) & 1)


def can_trace_with(cap_eff: int) -> bool:
    """CAP_SYS_ADMIN alone, or CAP_BPF with CAP_PERFMON (kernel >= 5.8)."""
    return has_cap(cap_eff, CAP_SYS_ADMIN) or (
        has_cap(cap_eff, CAP_BPF) and has_cap(cap_eff, CAP_PERFMON)
    )


def _tracefs_mountpoint() -> str | None:
    with contextlib.suppress(OSError):
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3 and fields[2] == "tracefs" and fields[1] in TRACEFS_MOUNTS:
                    return fields[1]
    return None


# ---------------------------------------------------------------- checks


def check_privileges() -> Check:
    name = "privileges"
    try:
        euid = os.geteuid()
        cap_eff = None
        with contextlib.suppress(OSError):
            cap_eff = parse_cap_eff(Path("/proc/self/status").read_text())
        fix = "run as root: sudo inferprobe ... (or grant CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN)"
        if cap_eff is None:
            if euid == 0:
                return Check(name, True, "root (euid 0); CapEff unreadable")
            return Check(name, False, f"euid {euid} and CapEff unreadable", fix)
        who = "root (euid 0)" if euid == 0 else f"euid {euid}"
        if can_trace_with(cap_eff):
            held = [
                label
                for cap, label in (
                    (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
                    (CAP_BPF, "CAP_BPF"),
                    (CAP_PERFMON, "CAP_PERFMON"),
                )
                if has_cap(cap_eff, cap)
            ]
            return Check(name, True, f"{who} with {', '.join(held)}")
        return Check(
            name,
            False,
            f"{who} lacks CAP_BPF+CAP_PERFMON and CAP_SYS_ADMIN (CapEff {cap_eff:016x})",
            fix,
        )
    except Exception as exc:  # doctor must never crash
        return Check(name, False, f"could not read privileges: {_one_line(exc)}", SETUP_FIX)


def check_bpf_syscall() -> Check:
    name = "bpf syscall"
    try:
        machine = platform.machine()
        nr = _BPF_SYSCALL_NR.get(machine)
        if nr is None:
            return Check(name, False, f"unknown bpf(2) number for {machine}", None)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        # union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size,
        # max_entries (u32 each); the rest stays zero.
        attr = (ctypes.c_uint32 * 18)(2, 4, 8, 1)  # BPF_MAP_TYPE_ARRAY, 1 x u64
        fd = libc.syscall(
            ctypes.c_long(nr),
            ctypes.c_int(0),  # BPF_MAP_CREATE
            ctypes.byref(attr),
            ctypes.c_uint(ctypes.sizeof(attr)),
        )
        if fd < 0:
            err = ctypes.get_errno()
            why = os.strerror(err)
            if err == errno.ENOSYS:
                return Check(name, False, "bpf() not implemented: kernel built without "
                             "CONFIG_BPF_SYSCALL", "use a kernel with CONFIG_BPF_SYSCALL=y")
            if err in (errno.EPERM, errno.EACCES):
                return Check(name, False, f"bpf(BPF_MAP_CREATE) refused: {why}",
                             "run as root: sudo inferprobe ...")
            return Check(name, False, f"bpf(BPF_MAP_CREATE) failed: {why}", None)
        os.close(fd)
        return Check(name, True, "created and freed a 1-entry BPF array map")
    except Exception as exc:
        return Check(name, False, f"bpf() probe failed: {_one_line(exc)}", None)


BTF_FIX = ("use a kernel built with CONFIG_DEBUG_INFO_BTF=y, or pass this kernel's BTF as a file: "
           "inferprobe record --btf FILE (BTFHub has them for distribution kernels)")


def check_btf() -> Check:
    """The kernel's types, which libbpf relocates the built programs against (CO-RE)."""
    name = "btf"
    try:
        from inferprobe.collector.attach.libbpf import BTF_ENV
        from inferprobe.collector.attach.probe_sets.sockets import sock_object_usable

        given = os.environ.get(BTF_ENV)
        if os.path.exists(BTF_VMLINUX):
            size = os.path.getsize(BTF_VMLINUX)
            in_flight = ("in task-local storage; a read already blocked at attach is rebuilt; "
                         "scans on bpf_loop" if sock_object_usable() else
                         "in a hash map (task-local storage with the saved registers, and bpf_loop, "
                         "need x86-64 and Linux 5.17+); a read already blocked at attach is not "
                         "recorded; scans in bounded loops, slower to verify")
            return Check(name, True,
                         f"{BTF_VMLINUX} ({size // 1024} KiB); per-thread syscall state {in_flight}")
        if given:
            if not os.path.isfile(given):
                return Check(name, False, f"the BTF file {given} (--btf, {BTF_ENV}) does not exist", BTF_FIX)
            return Check(name, True, f"{given} (--btf; the kernel has no {BTF_VMLINUX}); per-thread "
                         "syscall state in a hash map, and a read already blocked at attach is not recorded")
        return Check(name, False, f"this kernel exposes no BTF ({BTF_VMLINUX} is missing), which libbpf "
                     "needs to fit the built BPF programs to it", BTF_FIX)
    except Exception as exc:
        return Check(name, False, f"could not check BTF: {_one_line(exc)}", BTF_FIX)


def check_kernel() -> Check:
    """The BPF ring buffer every program writes to: Linux 5.8."""
    name = "kernel"
    try:
        ensure_kernel_version()
    except EnvironmentProblem as exc:
        return Check(name, False, str(exc), f"use Linux {OLDEST_KERNEL[0]}.{OLDEST_KERNEL[1]} or later")
    return Check(name, True,
                 f"Linux {platform.release()} (5.8+: the BPF ring buffer; 5.17+ for the llama.cpp set)")


def check_tracefs() -> Check:
    name = "tracefs"
    fix = "mount -t tracefs tracefs /sys/kernel/tracing"
    try:
        mounted = _tracefs_mountpoint()
        if mounted:
            return Check(name, True, f"mounted at {mounted}")
        target = TRACEFS_MOUNTS[0]
        if not os.path.isdir(target):
            return Check(name, False, f"{target} does not exist: kernel without CONFIG_TRACING?",
                         "use a kernel built with CONFIG_FTRACE and CONFIG_TRACING")
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.mount(b"tracefs", target.encode(), b"tracefs", ctypes.c_ulong(0), None)
        if rc == 0:
            return Check(name, True, f"was not mounted; mounted it at {target}")
        why = os.strerror(ctypes.get_errno())
        return Check(name, False, f"not mounted, and mounting it at {target} failed: {why}", fix)
    except Exception as exc:
        return Check(name, False, f"could not check tracefs: {_one_line(exc)}", fix)


def check_tracepoint_program() -> Check:
    """Load the sockets set's connect() programs, attach them, and see them fire:
    a connect() of this process to a closed port is one event in the ring."""
    name = "tracepoint program"
    try:
        from inferprobe.collector.attach.built_objects import built_object
        from inferprobe.collector.attach.libbpf import BpfObject, LibbpfError
        from inferprobe.collector.model.events import Counter

        core = BpfObject(built_object("sock_hash.bpf.o"))
        try:
            wanted = ("sys_enter_connect", "sys_exit_connect")
            for program in core.programs():
                core.set_autoload(program, program in wanted)
            core.set_max_entries("events", 64 * 1024)
            core.load()
            for program in wanted:
                core.attach(program)
            me = os.getpid()
            core["targets"][ctypes.c_uint32(me // 64)] = ctypes.c_uint64(1 << (me % 64))
            _connect_to_a_closed_port()
            sent = sum(core["counters"][ctypes.c_uint32(Counter.EVENTS_SENT.value)])
        except LibbpfError as exc:
            denied = re.search(r"not permitted|permission denied", str(exc), re.I)
            return Check(name, False, _one_line(exc), "run as root: sudo inferprobe ..." if denied else None)
        finally:
            core.close()
        if sent >= 1:
            return Check(name, True, f"syscalls:sys_enter_connect and sys_exit_connect loaded, attached, "
                         f"fired ({sent} event{'s' if sent != 1 else ''})")
        return Check(name, False, "programs attached to syscalls:sys_*_connect but never fired",
                     "check that syscall tracepoints are enabled (CONFIG_FTRACE_SYSCALLS)")
    except Exception as exc:
        return Check(name, False, f"tracepoint test failed: {_one_line(exc)}", None)


def _connect_to_a_closed_port() -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]   # bound, never listening: the connect is refused
        with socket.socket() as client, contextlib.suppress(OSError):
            client.connect(("127.0.0.1", port))


def check_uprobes() -> Check:
    name = "uprobes"
    try:
        if os.path.exists(UPROBE_TYPE):
            pmu = Path(UPROBE_TYPE).read_text().strip()
            return Check(name, True, f"uprobe PMU type {pmu}", required=False)
        return Check(name, False, f"{UPROBE_TYPE} missing: GPU (libcuda) probes are off",
                     "use a kernel built with CONFIG_UPROBE_EVENTS=y", required=False)
    except Exception as exc:
        return Check(name, False, f"could not check uprobes: {_one_line(exc)}", None,
                     required=False)


def check_libbpf() -> Check:
    """libbpf loads the programs built ahead of time (bpf/build, scripts/build_bpf.sh)."""
    name = "libbpf"
    try:
        from inferprobe.collector.attach.built_objects import BPF_DIR
        from inferprobe.collector.attach.libbpf import LibbpfError, library

        try:
            lib = library()
        except LibbpfError as exc:
            return Check(name, False, str(exc), "apt-get install libbpf1")
        version = f"{lib.libbpf_major_version()}.{lib.libbpf_minor_version()}"
        built = sorted(p.name for p in (BPF_DIR / "build").glob("*.bpf.o"))
        if "sock.bpf.o" not in built or "sock_hash.bpf.o" not in built:
            return Check(name, False, f"libbpf {version}, but the socket set's built objects are missing "
                         f"from {BPF_DIR / 'build'}", f"{SETUP_FIX} (scripts/build_bpf.sh builds them)")
        return Check(name, True, f"libbpf {version}; built ahead: {', '.join(built)}")
    except Exception as exc:
        return Check(name, False, f"could not check libbpf: {_one_line(exc)}", None)


def check_usdt() -> Check:
    name = "usdt"
    try:
        if not os.path.exists(UPROBE_TYPE):
            return Check(name, False, "the kernel has no uprobes: USDT probes are off",
                         "use a kernel built with CONFIG_UPROBE_EVENTS=y", required=False)
        return Check(name, True, "uprobes present; libbpf attaches the built handler to each probe",
                     required=False)
    except Exception as exc:
        return Check(name, False, f"could not check USDT: {_one_line(exc)}", None,
                     required=False)


ALL_CHECKS: tuple[Callable[[], Check], ...] = (
    check_privileges,
    check_bpf_syscall,
    check_kernel,
    check_btf,
    check_tracefs,
    check_libbpf,
    check_tracepoint_program,
    check_uprobes,
    check_usdt,
)


def run_all() -> list[Check]:
    """Run every check in order (a --btf file is in the environment, libbpf.BTF_ENV)."""
    results = []
    for check in ALL_CHECKS:
        try:
            results.append(check())
        except Exception as exc:  # one buggy check must not hide the rest
            name = check.__name__.removeprefix("check_").replace("_", " ")
            results.append(Check(name, False, f"check crashed: {_one_line(exc)}", None))
    return results


def tracing_ready(checks: list[Check]) -> bool:
    """True when every required check passed."""
    return all(c.ok for c in checks if c.required)
