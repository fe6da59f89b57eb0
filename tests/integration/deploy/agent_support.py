"""The agent as a subprocess, and an OTLP/HTTP backend that can be stopped and started again."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from tests.support.otlp_sink import OtlpTraceSink
from tests.support.processes import inferprobe_cmd


class Agent:
    """`inferprobe agent ARGS` writing its ring to ring_dir; returns once attached."""

    def __init__(self, ring_dir: Path, *args: str, prefix: list[str] | None = None):
        self.ring_dir = ring_dir
        self._prefixed = bool(prefix)
        argv = [*(prefix or []), *inferprobe_cmd("agent", "--ring", str(ring_dir), *args)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if line.startswith("inferprobe: attached"):
                self._drainer = threading.Thread(target=self._drain, daemon=True)
                self._drainer.start()
                return
        raise RuntimeError(f"agent did not attach: {''.join(self.lines)} {self.proc.stderr.read()}")

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def pid(self) -> int:
        """The agent's own pid: under a prefix that forks (unshare --fork), the prefix's child;
        one that execs (setpriv) is the agent itself."""
        if self._prefixed:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            if children and Path(f"/proc/{self.proc.pid}/comm").read_text().strip() == "unshare":
                return int(children[0])
        return self.proc.pid

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self, timeout: float = 90) -> tuple[int, str, str]:
        """SIGTERM to the agent itself (unshare --fork does not pass signals on), its exit status.

        The timeout is long: detaching takes the kernel ~0.25 s per uprobe here, and the
        TLS set puts 8 on each adopted process that maps libssl (the ring is closed first)."""
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drainer.join(timeout=10)   # the last lines, written just before the exit
        err = self.proc.stderr.read()
        return self.proc.returncode, "".join(self.lines), err


def metric(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


class OtlpSink(OtlpTraceSink):
    """An OTLP/HTTP traces endpoint on a fixed port that keeps the trace ids it received."""

    def __init__(self, port: int):
        self.trace_ids: set[bytes] = set()
        self.spans_by_kind: dict[int, int] = {}   # SpanKind number (2 server, 3 client) -> spans
        self.started = time.monotonic_ns()
        super().__init__(port)

    def receive(self, span) -> None:
        self.trace_ids.add(span.trace_id)
        self.spans_by_kind[span.kind] = self.spans_by_kind.get(span.kind, 0) + 1


def hold_uprobe(path: str, offset: int, ref_ctr_offset: int) -> int:
    """A uprobe perf event on path:offset, system-wide, with a USDT semaphore offset: the fd to close.

    The kernel keeps one ref_ctr_offset per probed instruction and refuses (EINVAL,
    'ref_ctr_offset mismatch' in its log) every other probe there with another one, as
    long as this fd is open: a real refusal, the one a second tracer of the same file
    gets, without touching the tracer under test."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pmu = int(Path("/sys/bus/event_source/devices/uprobe/type").read_text())

    class Attr(ctypes.Structure):   # struct perf_event_attr, up to config2 (PERF_ATTR_SIZE_VER1)
        _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                    ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                    ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
                    ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
                    ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64)]

    name = ctypes.create_string_buffer(path.encode())
    attr = Attr(type=pmu, size=ctypes.sizeof(Attr), config=ref_ctr_offset << 32, sample_period=1,
                config1=ctypes.addressof(name), config2=offset, wakeup_events=1)
    nr_perf_event_open = 298   # x86_64
    fd = libc.syscall(nr_perf_event_open, ctypes.byref(attr), -1, 0, -1, 8)   # pid -1, cpu 0, CLOEXEC
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"perf_event_open of a uprobe on {path}:{offset:#x}")
    return fd
