"""Compiles bpf/sock.bpf.c with bcc, attaches it and seeds its maps.

bcc is imported here and in collector/ringbuf.py only; everything above the
collector works on decoded events and never needs it.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from inferprobe.collector import preflight
from inferprobe.collector import targets as target_procs
from inferprobe.collector.errors import EnvironmentProblem, TargetProblem
from inferprobe.collector.events import COUNTER_MAX, Counter

BPF_DIR = Path(__file__).resolve().parent.parent / "bpf"
TRACEFS = Path("/sys/kernel/tracing")

# The tail-call chain of sock.bpf.c, in enum classify_prog order.
CLASSIFIER_PROGRAMS = [
    "classify_read",
    "classify_write",
    "scan_header_block",
    "finish_headers",
    "scan_body",
    "finish_body",
]


def bpf_source_dir() -> Path:
    # Installed: inferprobe/bpf next to inferprobe/collector. Source tree: ../bpf.
    if (BPF_DIR / "sock.bpf.c").exists():
        return BPF_DIR
    raise EnvironmentProblem(f"the BPF sources are missing from {BPF_DIR}: reinstall inferprobe")


def _import_bcc():
    try:
        import bcc  # noqa: F401
    except ImportError:
        raise EnvironmentProblem(
            "the bcc Python module is not importable: install python3-bpfcc (apt) and run "
            "inferprobe from a venv made with --system-site-packages (sudo make setup does both)"
        ) from None
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


def _cflags(ringbuf_pages: int) -> list[str]:
    flags = [
        f"-I{bpf_source_dir()}",
        f"-DRINGBUF_PAGES={ringbuf_pages}",
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


@dataclass
class LoadedTracer:
    """The compiled, attached socket tracer of one recording session."""

    bpf: object  # bcc.BPF
    pids: list[int]
    preexisting_sockets: int

    def counters(self) -> dict[str, int]:
        table = self.bpf["counters"]
        totals = {}
        for counter in Counter:
            per_cpu = table[ctypes.c_int(counter.value)]
            totals[counter.name.lower()] = int(sum(per_cpu))
        return totals

    def close(self) -> None:
        self.bpf.cleanup()


def load_socket_tracer(
    pids: list[int], ringbuf_pages: int = 2048, require_listener: bool = True
) -> LoadedTracer:
    """Compiles and attaches the socket tracer to pids and their descendants."""
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

    source = bpf_source_dir() / "sock.bpf.c"
    with preflight.captured_native_output() as compiler_output:
        try:
            bpf = bcc.BPF(src_file=str(source).encode(), cflags=_cflags(ringbuf_pages))
            prog_array = bpf["classifiers"]
            for index, name in enumerate(CLASSIFIER_PROGRAMS):
                fn = bpf.load_func(name.encode(), bcc.BPF.TRACEPOINT)
                prog_array[ctypes.c_int(index)] = ctypes.c_int(fn.fd)
        except Exception as err:  # bcc raises bare Exception for compile/load errors
            failure = err
        else:
            failure = None
    if failure is not None:
        detail = preflight.first_error_line(compiler_output[0] if compiler_output else "") or str(
            failure
        )
        raise EnvironmentProblem(
            f"the BPF program did not compile or load ({detail}); "
            "run 'inferprobe doctor' to see what is missing"
        )

    tgids = bpf["targets"]
    for pid in all_pids:
        tgids[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    # Sockets open before we started (keep-alive connections of a running
    # server): give them ids now; the kernel counts on from there.
    socks = bpf["socks"]
    next_id = 1
    for pid in all_pids:
        for fd in target_procs.socket_fds(pid):
            key = socks.Key(pid=pid, fd=fd)
            value = socks.Leaf(conn_id=next_id, http_seen=0)
            socks[key] = value
            next_id += 1
    bpf["next_conn_id"][ctypes.c_int(0)] = ctypes.c_uint64(next_id)
    return LoadedTracer(bpf=bpf, pids=all_pids, preexisting_sockets=next_id - 1)


assert COUNTER_MAX >= len(Counter)
