"""What the benchmarks share: the repository's paths, the test SSE server and a
recorder as subprocesses, /proc and BPF run-time readers.

Imported by every benchmark beside it (they add this folder to sys.path, as
a script's own folder already is); no benchmark imports another's main.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "tests" / "servers" / "sse_server.py"
CLIENT = REPO / "tests" / "servers" / "sse_client.py"
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
ATTACH_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


# -- /proc helpers -------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        data = f.read()
    # comm (field 2) may contain spaces/parens: split after the last ')'.
    fields = data[data.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime/stime are fields 14/15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kb(pid: int, key: str) -> int | None:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def box_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already counted in user/nice
    return total - idle, total


def _program_fdinfo(fdinfo: Path) -> dict[str, str] | None:
    """The fields of one fd's fdinfo, None unless it is a BPF program."""
    try:
        text = fdinfo.read_text()
    except OSError:  # closed meanwhile
        return None
    if "prog_type:" not in text:
        return None
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def _times(fields: dict[str, str]) -> tuple[int, int]:
    return int(fields.get("run_time_ns", "0")), int(fields.get("run_cnt", "0"))


def _run_time(fdinfo: Path) -> tuple[int, int] | None:
    """(run time ns, runs) from one fd's fdinfo, None unless it is a BPF program."""
    fields = _program_fdinfo(fdinfo)
    return None if fields is None else _times(fields)


def program_times_by_id(pid: int) -> dict[int, tuple[int, int]]:
    """prog_id -> (run time ns, runs) of every BPF program the process holds."""
    out = {}
    for fdinfo in Path(f"/proc/{pid}/fdinfo").iterdir():
        fields = _program_fdinfo(fdinfo)
        if fields is not None and "prog_id" in fields:
            out[int(fields["prog_id"])] = _times(fields)
    return out


def program_names() -> dict[int, str]:
    """prog_id -> name, from bpftool (empty without it: totals are still right)."""
    if shutil.which("bpftool") is None:
        return {}
    res = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True)
    if res.returncode != 0:
        return {}
    return {p["id"]: p.get("name", str(p["id"])) for p in json.loads(res.stdout)}


def traced_run(pid: int, output: Path, stderr_path: Path, load, per: str, stats: bool) -> dict:
    """`inferprobe record -p pid` around load() (start-up not measured): load's result, the
    recorder's CPU per unit of load["<per>"] (requests, calls), and with `stats` the kernel's
    own BPF time (kernel.bpf_stats_enabled), in all and per program (named by bpftool)."""
    rec = Recorder(pid, output, stderr_path)
    try:
        with bpf_stats_enabled() if stats else contextlib.nullcontext():
            before = program_times_by_id(rec.proc.pid)
            recorder_cpu0 = proc_cpu_s(rec.proc.pid)
            result = load()
            recorder_cpu = proc_cpu_s(rec.proc.pid) - recorder_cpu0
            after = program_times_by_id(rec.proc.pid)
            names = program_names() if stats else {}
    finally:
        rec.stop()
    units = max(result[per], 1)
    result[f"recorder_cpu_us_per_{per.rstrip('s')}"] = round(recorder_cpu * 1e6 / units, 1)
    if stats:
        total_ns = bpf_ns_between(before, after)
        result["bpf_ns_total"] = total_ns
        result["programs"] = {names.get(prog_id, str(prog_id)).removeprefix("tracepoint__syscalls__"): cost
                              for prog_id, cost in per_program(before, after, units).items()}
    return result


def bpf_ns_between(before: dict, after: dict) -> int:
    """The kernel's time in all the programs between two readings keyed alike
    (program_times_by_id), programs loaded since included."""
    return sum(ns - before.get(key, (0, 0))[0] for key, (ns, _) in after.items())


def per_program(before: dict, after: dict, n: int) -> dict:
    """ns per run and runs per request (or per syscall, n of them), of every
    program that ran between two readings keyed alike; the costliest first."""
    out = {}
    for name, (ns, runs) in after.items():
        ns0, runs0 = before.get(name, (0, 0))
        if runs > runs0:
            out[name] = {"ns_per_run": round((ns - ns0) / (runs - runs0)),
                         "runs_per_request": round((runs - runs0) / n, 2)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ns_per_run"] * kv[1]["runs_per_request"]))


def _sum_run_times(fdinfos) -> tuple[int, int]:
    times = [t for t in map(_run_time, fdinfos) if t is not None]
    return sum(ns for ns, _ in times), sum(runs for _, runs in times)


def bpf_program_time(pid: int) -> tuple[int, int]:
    """(run time ns, runs) of every BPF program the process holds, from fdinfo.

    The kernel keeps these only while kernel.bpf_stats_enabled is 1; a tail
    call's time counts in the program that made it."""
    return _sum_run_times(Path(f"/proc/{pid}/fdinfo").iterdir())


SOCKET_SYSCALLS = ("read", "readv", "recvfrom", "recvmsg", "write", "writev", "sendto", "sendmsg")


class EmptyPrograms:
    """Do-nothing BPF programs on the syscall tracepoints sock.bpf.c uses.

    Attached beside the tracer they show what the tracepoints cost whatever
    a tracer does (bench_syscalls.py); with kernel.bpf_stats_enabled, the
    time the kernel books for them per run is its own timing overhead,
    which it books for every run of the tracer's programs too."""

    def __init__(self) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository: tests.support
        from tests.support import clang_bpf

        source = "\n".join(f'SEC("tracepoint/syscalls/sys_{edge}_{name}") int {edge}_{name}(void *ctx) '
                            "{ return 0; }"
                            for name in SOCKET_SYSCALLS for edge in ("enter", "exit"))
        self._dir = tempfile.TemporaryDirectory()
        self.bpf = clang_bpf.build(source, Path(self._dir.name), "empty")
        self.bpf.load()
        self.bpf.attach_tracepoints()

    def run_time(self) -> tuple[int, int]:
        """(run time ns, runs) of these programs, as bpf_program_time() counts them."""
        return _sum_run_times(Path(f"/proc/self/fdinfo/{self.bpf.program_fd(name)}")
                              for name in self.bpf.programs())

    def stop(self) -> None:
        self.bpf.close()
        self._dir.cleanup()


class DrainedTracer:
    """inferprobe's default probe sets loaded in this process, their events
    drained (not kept) by a thread, so that a full ring cannot skew what the
    programs cost. The thread's CPU is this process's, not the server's."""

    def __init__(self, pid: int, ringbuf_pages: int = 2048, sets: tuple[str, ...] | None = None,
                 options: dict | None = None) -> None:
        from inferprobe.collector.attach.loader import DEFAULT_SETS, load_tracer
        from inferprobe.collector.attach.ringbuf import RingBufferReader

        self.tracer = load_tracer([pid], sets=sets or DEFAULT_SETS, ringbuf_pages=ringbuf_pages,
                                  options=options)
        self.reader = RingBufferReader(self.tracer, lambda chunk: None)
        self._stop = threading.Event()
        self._pump = threading.Thread(target=self._drain, daemon=True)
        self._pump.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            self.reader.poll(50)

    def close(self) -> dict:
        """Stops draining and unloads; returns the kernel side's counters."""
        self._stop.set()
        self._pump.join()
        self.reader.drain()
        counters = self.tracer.counters()
        self.reader.close()
        self.tracer.close()
        return counters


@contextlib.contextmanager
def bpf_stats_enabled():
    """kernel.bpf_stats_enabled on for the duration, restored as found."""
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    before = knob.read_text().strip()
    knob.write_text("1")
    try:
        yield
    finally:
        knob.write_text(before)


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# -- processes -----------------------------------------------------------------



def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within timeout seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Server:
    def __init__(self, log: Path | None) -> None:
        cmd = [PY, str(SERVER), "--host", "127.0.0.1", "--port", "0"]
        if log is not None:
            cmd += ["--log", str(log)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING"):
            self.stop()
            raise RuntimeError(f"test server did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        self.pid = self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)


def loaded_program_ids() -> set[int]:
    """The ids of every BPF program loaded now (bpftool)."""
    shown = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True)
    return {program["id"] for program in json.loads(shown.stdout)}


class Recorder:
    """`inferprobe record -p PID` as a subprocess; returns from __init__ once attached."""

    def __init__(self, pid: int, output: Path, stderr_path: Path, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.output = output
        self._stderr_f = open(stderr_path, "w", encoding="utf-8")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [PY, "-m", "inferprobe.cli.main", "record", "-p", str(pid), "-o", str(output), *extra],
            stdout=subprocess.PIPE,
            stderr=self._stderr_f,
            text=True,
            env=env,
        )
        self.stderr_path = stderr_path
        self.lines: list[str] = []
        self.detached_s: float | None = None   # stop() to our last program unloaded
        before = loaded_program_ids()
        t0 = time.monotonic()
        while True:
            line = self.proc.stdout.readline()
            if line.startswith("inferprobe: attached"):
                # CPU spent so far is start-up + BPF compile: excluded.
                self.cpu_at_attach_s = proc_cpu_s(self.proc.pid)
                self.attach_s = time.monotonic() - t0
                self.lines.append(line)
                self.programs = loaded_program_ids() - before
                return
            if not line or time.monotonic() - t0 > ATTACH_TIMEOUT_S:
                self.kill()
                err = stderr_path.read_text(encoding="utf-8", errors="replace")
                raise RuntimeError(f"recorder did not attach: {''.join(self.lines)}{err}")
            self.lines.append(line)

    def sample_before_stop(self) -> tuple[float, int | None]:
        """(CPU seconds since attach, VmHWM in kB), read just before stopping."""
        cpu = proc_cpu_s(self.proc.pid) - self.cpu_at_attach_s
        return cpu, proc_status_kb(self.proc.pid, "VmHWM")

    def stop(self) -> float:
        """SIGTERM, wait until the recording is written; returns stop time (s)."""
        t0 = time.monotonic()
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("recorder did not stop within the timeout") from None
        finally:
            self._stderr_f.close()
        self.lines.append(out or "")
        if self.proc.returncode != 0:
            err = self.stderr_path.read_text(encoding="utf-8", errors="replace")
            raise RuntimeError(f"recorder exited with {self.proc.returncode}: {err}")
        stopped = time.monotonic() - t0
        # The kernel's detach may go on after the recorder exited (a child holds
        # the probes: collector/attach/detach_on_exit.py). Wait for it: it is
        # part of what a stop costs the host, and the next run must not meet it.
        while self.programs & loaded_program_ids() and time.monotonic() - t0 < STOP_TIMEOUT_S:
            time.sleep(0.02)
        self.detached_s = time.monotonic() - t0
        return stopped

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._stderr_f.closed:
            self._stderr_f.close()


def run_client(args: argparse.Namespace, port: int, duration: float) -> tuple[dict, float]:
    """One closed-loop load phase in a separate process; (summary, client CPU s)."""
    cmd = [
        PY, str(CLIENT), "--host", "127.0.0.1", "--port", str(port),
        "--connections", str(args.connections), "--duration", str(duration),
        "--max-tokens", str(args.max_tokens), "--interval-ms", str(args.interval_ms),
    ]  # fmt: skip
    if args.unary:
        cmd.append("--no-stream")
    c0 = children_cpu_s()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    c1 = children_cpu_s()
    if res.returncode != 0:
        raise RuntimeError(f"load client failed ({res.returncode}): {res.stderr}")
    return json.loads(res.stdout), c1 - c0


def read_report(path: Path) -> dict:
    res = subprocess.run(
        [PY, "-m", "inferprobe.cli.main", "report", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode != 0:
        raise RuntimeError(f"inferprobe report failed ({res.returncode}): {res.stderr}")
    return json.loads(res.stdout)


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def baseline_env(checkout: Path, tmp: Path) -> dict[str, str]:
    """An environment whose `python -m inferprobe...` imports checkout's code: its folders
    linked as inferprobe.<part> (its pyproject's package-dir) in a tree first on PYTHONPATH."""
    mapping = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    tree = tmp / "baseline-tree" / "inferprobe"
    tree.mkdir(parents=True)
    for package, folder in mapping.items():
        (tree / package.removeprefix("inferprobe.")).symlink_to(checkout / folder, target_is_directory=True)
    return {**os.environ, "PYTHONPATH": str(tree.parent)}
