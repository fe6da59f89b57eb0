"""Can this host trace? Environment checks for `inferprobe doctor` and `record`.

Each check returns one Check and never raises: a missing header, a refused
syscall or a broken bcc install becomes ok=False with a one-line detail and,
where there is one, the exact command that fixes it. `record` runs the same
checks before it loads BPF so both commands tell the same story.

bcc is imported lazily: this module must import (and doctor must explain)
on a host where bcc is absent or broken.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

TRACEFS_MOUNTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
BTF_VMLINUX = "/sys/kernel/btf/vmlinux"
UPROBE_TYPE = "/sys/bus/event_source/devices/uprobe/type"
KHEADERS_TARBALL = "/sys/kernel/kheaders.tar.xz"
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


def headers_version(build_dir: str | os.PathLike[str]) -> str | None:
    """Kernel release a headers tree was built for: UTS_RELEASE from
    include/generated/utsrelease.h, else guessed from the directory name
    (Debian's linux-headers-<release>), else None."""
    path = Path(build_dir)
    with contextlib.suppress(OSError):
        path = path.resolve()
    utsrelease = path / "include" / "generated" / "utsrelease.h"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        match = re.search(r'#define\s+UTS_RELEASE\s+"([^"]+)"', utsrelease.read_text())
        if match:
            return match.group(1)
    name = path.name
    if name.startswith("linux-headers-"):
        return name[len("linux-headers-"):]
    if name in ("build", "source") and re.match(r"\d+\.\d+", path.parent.name):
        return path.parent.name
    if re.match(r"\d+\.\d+", name):
        return name
    return None


def first_error_line(text: str) -> str | None:
    """The line of bcc/clang stderr output that best says what went wrong.

    A compiler error first. Clang's warnings never are the reason (a "loop not
    unrolled: ... unable to ..." warning used to be shown for a verifier
    refusal). For a program the verifier refused, bcc's "Failed to load
    program" line, with the verifier's own reason: the line before its
    "processed N insns" summary."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not re.search(r"\bwarning:", line, re.IGNORECASE)]
    for line in lines:
        if re.search(r"\berror:", line, re.IGNORECASE):
            return line
    for line in lines:
        if re.search(r"\b(failed|unable|cannot|permission denied|too long)\b", line, re.IGNORECASE):
            summary = next((i for i, seen in enumerate(lines) if re.match(r"processed \d+ insns", seen)),
                           None)
            if summary:
                return f"{line} ({lines[summary - 1]})"
            return line
    return lines[0] if lines else None


def newest_installed_headers(src: str = "/usr/src") -> tuple[str, str] | None:
    """(arch dir, common dir) of the newest Debian kernel headers pair in src."""
    arch = _DEBIAN_ARCH.get(platform.machine(), "amd64")
    pattern = re.compile(rf"^linux-headers-(\d+\.\d+\.\d+-\d+)-{re.escape(arch)}$")
    found: list[tuple[tuple[int, ...], str, str]] = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(src):
            match = pattern.match(entry)
            if not match:
                continue
            common = os.path.join(src, f"linux-headers-{match.group(1)}-common")
            if os.path.isdir(common):
                key = tuple(int(n) for n in re.findall(r"\d+", match.group(1)))
                found.append((key, os.path.join(src, entry), common))
    if not found:
        return None
    _, build, common = max(found)
    return build, common


def headers_fix(release: str | None = None) -> str:
    """The exact commands that give bcc headers for this kernel."""
    release = release or platform.release()
    arch = _DEBIAN_ARCH.get(platform.machine(), "amd64")
    pair = newest_installed_headers()
    if pair:
        build, common = pair
    else:
        build = f"/usr/src/linux-headers-<ver>-{arch}"
        common = "/usr/src/linux-headers-<ver>-common"
    mods = f"/lib/modules/{release}"
    return (
        f"{SETUP_FIX} (or by hand: apt-get install linux-headers-{arch} and link it: "
        f"mkdir -p {mods} && ln -sfn {build} {mods}/build && ln -sfn {common} {mods}/source)"
    )


@contextlib.contextmanager
def captured_native_output() -> Iterator[list[str]]:
    """Send fds 1 and 2 to a temp file for the duration. clang writes its
    errors straight to fd 2 and libbcc prints some (the kheaders hint) with
    std::cout to fd 1, bypassing sys.stdout/sys.stderr. The C stdio buffers
    are flushed before the fds are restored, so nothing leaks out later. The
    captured text is appended to the yielded list on exit."""
    box: list[str] = []
    libc = ctypes.CDLL(None)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    libc.fflush(None)
    with tempfile.TemporaryFile() as tmp:
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        try:
            for fd in saved:
                os.dup2(tmp.fileno(), fd)
            yield box
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            libc.fflush(None)
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            tmp.seek(0)
            box.append(tmp.read().decode(errors="replace"))


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


def check_btf() -> Check:
    name = "btf"
    try:
        from inferprobe.collector.attach.probe_sets.sockets import task_pt_regs_usable, task_storage_usable

        if os.path.exists(BTF_VMLINUX):
            size = os.path.getsize(BTF_VMLINUX)
            where = ("task-local storage" if task_storage_usable()
                     else "a hash map (task-local storage needs Linux 5.13+)")
            in_flight = ("rebuilt" if task_pt_regs_usable()
                         else "not recorded (needs x86-64 and Linux 5.15+)")
            return Check(name, True, f"{BTF_VMLINUX} ({size // 1024} KiB); per-thread syscall state "
                         f"in {where}; a read already blocked at attach is {in_flight}",
                         required=False)
        return Check(
            name,
            False,
            f"{BTF_VMLINUX} missing; not required: per-thread syscall state then lives in a hash "
            "map, ~170 ns more per traced syscall than task-local storage, and a read already "
            "blocked at attach is not recorded",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y",
            required=False,
        )
    except Exception as exc:
        return Check(name, False, f"could not check BTF: {_one_line(exc)}", None, required=False)


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


def _same_kernel_note(version: str | None) -> str:
    running = platform.release()
    if version is None:
        return f"version unknown (running {running})"
    if version == running:
        return f"{version}, matches the running kernel"
    return (
        f"{version}, running kernel is {running}: a different version, which works "
        "for the tracepoint, uprobe and USDT programs inferprobe uses"
    )


def check_kernel_headers() -> Check:
    """Mirrors how bcc 0.26 finds headers: BCC_KERNEL_SOURCE as one merged
    tree, else /lib/modules/<release>/{build,source}, else the in-kernel
    /sys/kernel/kheaders.tar.xz (CONFIG_IKHEADERS)."""
    name = "kernel headers"
    try:
        override = os.environ.get("BCC_KERNEL_SOURCE")
        if override:
            return _check_override_headers(name, override)

        release = platform.release()
        mods = Path("/lib/modules") / release
        build, source = mods / "build", mods / "source"
        if build.is_dir() and source.is_dir():
            missing = [
                str(p)
                for p in (source / "include/linux/kconfig.h",
                          build / "include/generated/autoconf.h")
                if not p.is_file()
            ]
            where = f"{build.resolve()} + {source.resolve()}"
        elif build.is_dir():
            missing = [
                str(p)
                for p in (build / "include/linux/kconfig.h",
                          build / "include/generated/autoconf.h")
                if not p.is_file()
            ]
            where = str(build.resolve())
        elif os.path.exists(KHEADERS_TARBALL):
            return Check(name, True, f"in-kernel headers {KHEADERS_TARBALL} "
                         f"({release}, matches the running kernel)")
        else:
            dangling = " (dangling symlink)" if build.is_symlink() else ""
            return Check(
                name,
                False,
                f"no kernel headers for {release}: {build} missing{dangling} and "
                "no in-kernel headers (CONFIG_IKHEADERS)",
                headers_fix(release),
            )
        if missing:
            return Check(name, False, f"headers at {where} are incomplete: {missing[0]} missing",
                         headers_fix(release))
        return Check(name, True, f"{where}: {_same_kernel_note(headers_version(build))}")
    except Exception as exc:
        return Check(name, False, f"could not check kernel headers: {_one_line(exc)}",
                     headers_fix())


def _check_override_headers(name: str, override: str) -> Check:
    fix = (
        f"point --kernel-headers / BCC_KERNEL_SOURCE at one kernel headers tree that holds "
        f"both include/linux/kconfig.h and include/generated/autoconf.h, or unset it and run "
        f"{SETUP_FIX}"
    )
    root = Path(override)
    label = f"BCC_KERNEL_SOURCE={override}"
    if not root.is_dir():
        return Check(name, False, f"{label}: no such directory", fix)
    has_kconfig = (root / "include/linux/kconfig.h").is_file()
    has_autoconf = (root / "include/generated/autoconf.h").is_file()
    if has_kconfig and has_autoconf:
        return Check(name, True, f"{label}: {_same_kernel_note(headers_version(root))}")
    if (root / "build").is_dir() or (root / "source").is_dir():
        why = ("is a /lib/modules-style dir (build/ + source/); bcc takes that layout only "
               "from /lib/modules/<release>, not from BCC_KERNEL_SOURCE")
    elif has_kconfig:
        why = "holds only the arch-independent half (no include/generated/autoconf.h)"
    elif has_autoconf:
        why = "holds only the generated half (no include/linux/kconfig.h)"
    else:
        why = "holds no kernel headers (no include/linux/kconfig.h)"
    return Check(name, False, f"{label} {why}", fix)


def bcc_version() -> str | None:
    try:
        from bcc.version import __version__

        return str(__version__)
    except Exception:
        return None


def check_bcc() -> Check:
    name = "bcc"
    fix = (
        "apt-get install python3-bpfcc, and run inferprobe from a venv made with "
        "/usr/bin/python3 -m venv --system-site-packages .venv (sudo make setup does both)"
    )
    try:
        import bcc

        version = getattr(bcc, "__version__", None) or bcc_version() or "unknown version"
        return Check(name, True, f"bcc {version} from {os.path.dirname(bcc.__file__)}")
    except Exception as exc:  # a broken libbcc raises OSError
        return Check(
            name,
            False,
            f"import bcc failed in {sys.executable} ({platform.python_version()}): "
            f"{_one_line(exc)}",
            fix,
        )


_PROBE_PROGRAM = r"""
BPF_ARRAY(inferprobe_preflight, u64, 1);

TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    if ((bpf_get_current_pid_tgid() >> 32) != PREFLIGHT_TGID)
        return 0;
    int key = 0;
    u64 *count = inferprobe_preflight.lookup(&key);
    if (count)
        __sync_fetch_and_add(count, 1);
    return 0;
}
"""


def check_tracepoint_program() -> Check:
    """Compile, load and attach a tracepoint program, then make it fire."""
    name = "tracepoint program"
    try:
        try:
            from bcc import BPF
        except Exception as exc:
            return Check(name, False, f"skipped: bcc not importable ({_one_line(exc)})",
                         "fix the bcc check first")
        bpf = None
        with captured_native_output() as noise:
            try:
                bpf = BPF(text=_PROBE_PROGRAM, cflags=[f"-DPREFLIGHT_TGID={os.getpid()}"])
                error: Exception | None = None
            except Exception as exc:
                error = exc
        if error is not None or bpf is None:
            line = first_error_line(noise[0] if noise else "")
            denied = re.search(r"not permitted|permission denied", f"{line} {error}", re.I)
            # bcc says "Failed to compile" even when creating a map is refused.
            stage = "compile" if "compile" in str(error).lower() and not denied else "load/attach"
            detail = f"{stage} failed: {line or _one_line(error or 'no BPF object')}"
            if stage != "compile":
                fix = "run as root: sudo inferprobe ..."
            elif os.environ.get("BCC_KERNEL_SOURCE"):
                fix = "fix the kernel headers check (BCC_KERNEL_SOURCE) first"
            else:
                fix = headers_fix()
            return Check(name, False, detail, fix)
        try:
            for _ in range(3):
                os.getppid()
            count = bpf[b"inferprobe_preflight"][0].value
        finally:
            bpf.cleanup()
        if count >= 1:
            return Check(name, True, f"syscalls:sys_enter_getppid compiled, attached, fired "
                         f"{count}x")
        return Check(name, False, "program attached to syscalls:sys_enter_getppid but never "
                     "fired", "check that tracepoints are enabled (CONFIG_FTRACE_SYSCALLS)")
    except Exception as exc:
        return Check(name, False, f"tracepoint test failed: {_one_line(exc)}", None)


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
        from inferprobe.collector.attach.libbpf import LibbpfError, library
        from inferprobe.collector.attach.loader import bpf_source_dir

        try:
            lib = library()
        except LibbpfError as exc:
            return Check(name, False, str(exc), "apt-get install libbpf1")
        version = f"{lib.libbpf_major_version()}.{lib.libbpf_minor_version()}"
        built = sorted(p.name for p in (bpf_source_dir() / "build").glob("*.bpf.o"))
        if not built:
            return Check(name, False, f"libbpf {version}, but no built BPF objects in "
                         f"{bpf_source_dir() / 'build'}", SETUP_FIX)
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
    check_btf,
    check_tracefs,
    check_kernel_headers,
    check_bcc,
    check_libbpf,
    check_tracepoint_program,
    check_uprobes,
    check_usdt,
)


def run_all(kernel_headers: str | None = None) -> list[Check]:
    """Run every check in order. kernel_headers, when given, becomes
    BCC_KERNEL_SOURCE for this process (and so for every later bcc compile)."""
    if kernel_headers:
        os.environ["BCC_KERNEL_SOURCE"] = os.path.abspath(kernel_headers)
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
