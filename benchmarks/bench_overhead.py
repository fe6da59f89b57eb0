#!/usr/bin/env python3
"""Tracer overhead benchmark: the same server, untraced and traced, side by side.

One server process (tests/servers/sse_server.py) runs for the whole benchmark.
It is driven by closed-loop streaming load (tests/servers/sse_client.py, run
as its own process per phase so this driver never competes for the client's
GIL) in alternating phases::

    warm-up, then N rounds of: [untraced D s] [traced D s]

A traced phase attaches ``inferprobe record -p <server>`` first (compile and
attach time is not measured), runs the same load, then stops the recorder with
SIGTERM and reads its recording with ``inferprobe report --format json``.
Interleaving the phases cancels most of the drift of a small, noisy machine.

Measured per phase: client requests/s, tokens/s, p50 TTFT and p99 ITL; CPU
time of the server, of the load client and of the whole box (they all share
the same cores with the tracer).  Traced phases add the recorder's CPU time
from "attached" to just before SIGTERM, its peak RSS (VmHWM), lost events and
the number of requests it recorded (which should match the client's count).

Note that the BPF programs run in the server's own syscalls: their cost shows
up as extra *server* CPU time, not in the recorder's.

With --floor, each round has a third phase with do-nothing programs on the
same socket syscall tracepoints and no recorder: what the attach points cost
by themselves, which no change to the programs can take back.

Usage (needs root for the BPF part)::

    sudo .venv/bin/python benchmarks/bench_overhead.py [--duration 10] [--rounds 3]
        [--connections 32] [--max-tokens 16] [--interval-ms 2] [--unary] [--floor] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
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
        total_ns = sum(ns - before.get(i, (0, 0))[0] for i, (ns, _) in after.items())
        result["bpf_ns_total"] = total_ns
        result["programs"] = {names.get(prog_id, str(prog_id)).removeprefix("tracepoint__syscalls__"): cost
                              for prog_id, cost in per_program(before, after, units).items()}
    return result


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
        from bcc import BPF

        text = "\n".join(f"TRACEPOINT_PROBE(syscalls, sys_{edge}_{name}) {{ return 0; }}"
                         for name in SOCKET_SYSCALLS for edge in ("enter", "exit"))
        self.bpf = BPF(text=text)

    def run_time(self) -> tuple[int, int]:
        """(run time ns, runs) of these programs, as bpf_program_time() counts them."""
        return _sum_run_times(Path(f"/proc/self/fdinfo/{fn.fd}") for fn in self.bpf.funcs.values())

    def stop(self) -> None:
        self.bpf.cleanup()


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
        t0 = time.monotonic()
        while True:
            line = self.proc.stdout.readline()
            if line.startswith("inferprobe: attached"):
                # CPU spent so far is start-up + BPF compile: excluded.
                self.cpu_at_attach_s = proc_cpu_s(self.proc.pid)
                self.attach_s = time.monotonic() - t0
                self.lines.append(line)
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
        return time.monotonic() - t0

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


# -- phases --------------------------------------------------------------------


def run_phase(
    args: argparse.Namespace, server: Server, workdir: Path, rnd: int, mode: str
) -> dict:
    """One load phase; mode is "untraced", "traced" (inferprobe record) or
    "empty" (only EmptyPrograms: what the attach points cost by themselves)."""
    rec = empty = None
    if mode == "traced":
        rec = Recorder(server.pid, workdir / f"round{rnd}.ipr", workdir / f"round{rnd}.err",
                       tuple(args.record_arg))
        if args.bpf_stats:
            empty = EmptyPrograms()  # what the kernel's timing itself books per run
    elif mode == "empty":
        empty = EmptyPrograms()
    try:
        s0 = proc_cpu_s(server.pid)
        b0 = box_cpu()
        bpf0 = bpf_program_time(rec.proc.pid) if rec is not None and empty is not None else None
        empty0 = empty.run_time() if empty is not None else None
        summary, client_cpu = run_client(args, server.port, args.duration)
        bpf1 = bpf_program_time(rec.proc.pid) if rec is not None and empty is not None else None
        empty1 = empty.run_time() if empty is not None else None
        b1 = box_cpu()
        s1 = proc_cpu_s(server.pid)
        phase: dict = {
            "round": rnd,
            "mode": mode,
            "client": summary,
            "client_cpu_s": round(client_cpu, 3),
            "server_cpu_s": round(s1 - s0, 3),
            "box_busy_pct": round(100.0 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1]), 1),
        }
        if rec is not None:
            cpu, hwm_kb = rec.sample_before_stop()
            stop_s = rec.stop()
            report = read_report(rec.output)
            recd = report.get("recording") or {}
            phase["tracer"] = {
                "attach_s": round(rec.attach_s, 2),
                "cpu_s": round(cpu, 3),
                "peak_rss_kb": hwm_kb,
                "stop_s": round(stop_s, 2),
                "lost_events": report.get("lost_events"),
                "requests": (report.get("summary") or {}).get("requests"),
                "events": recd.get("events"),
                "complete": recd.get("complete"),
                "bpf_ns": None if bpf1 is None else bpf1[0] - bpf0[0],
                "bpf_runs": None if bpf1 is None else bpf1[1] - bpf0[1],
                "empty_program_ns": None if empty1 is None else empty1[0] - empty0[0],
                "empty_program_runs": None if empty1 is None else empty1[1] - empty0[1],
            }
            rec = None
        return phase
    finally:
        if empty is not None:
            empty.stop()
        if rec is not None:
            rec.kill()


# -- output --------------------------------------------------------------------


def per_1k(ms_total: float, requests: int) -> float | None:
    return 1000.0 * ms_total / requests if requests else None


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(phases: list[dict], duration: float) -> None:
    hdr = (
        f"{'rnd':>3} {'mode':<8} {'req/s':>8} {'tok/s':>9} {'TTFTp50':>8} {'ITLp99':>7} "
        f"{'srvCPU':>7} {'srv/1k':>7} {'cliCPU':>7} {'box':>5} "
        f"{'trcCPU':>7} {'trc/1k':>7} {'RSS':>6} {'req cli/trc':>13} {'lost':>5}"
    )
    units = (
        f"{'':>3} {'':<8} {'':>8} {'':>9} {'ms':>8} {'ms':>7} "
        f"{'%core':>7} {'ms':>7} {'%core':>7} {'%':>5} "
        f"{'ms':>7} {'ms':>7} {'MB':>6} {'':>13} {'':>5}"
    )
    print(hdr)
    print(units)
    print("-" * len(hdr))
    for p in phases:
        c = p["client"]
        wall = c["wall_s"] or duration
        t = p.get("tracer")
        trc_ms = t["cpu_s"] * 1000 if t else None
        reqs = f"{c['completed']}/{t['requests']}" if t else f"{c['completed']}/-"
        print(
            f"{p['round']:>3} {p['mode']:<8} {c['requests_per_s']:>8.1f} "
            f"{c['tokens_per_s']:>9.0f} {fmt(c['ttft_ms_p50'], '.2f'):>8} "
            f"{fmt(c['itl_ms_p99'], '.2f'):>7} "
            f"{100 * p['server_cpu_s'] / wall:>7.1f} "
            f"{fmt(per_1k(p['server_cpu_s'] * 1000, c['completed']), '.1f'):>7} "
            f"{100 * p['client_cpu_s'] / wall:>7.1f} {p['box_busy_pct']:>5.1f} "
            f"{fmt(trc_ms, '.0f'):>7} "
            f"{fmt(per_1k(trc_ms, c['completed']) if t else None, '.1f'):>7} "
            f"{fmt(t['peak_rss_kb'] / 1024 if t and t['peak_rss_kb'] else None, '.1f'):>6} "
            f"{reqs:>13} {fmt(t['lost_events'] if t else None, 'd'):>5}"
        )


def aggregate(phases: list[dict]) -> dict:
    def mode(m: str) -> list[dict]:
        return [p for p in phases if p["mode"] == m]

    def agg(ps: list[dict]) -> dict:
        wall = sum(p["client"]["wall_s"] for p in ps)
        done = sum(p["client"]["completed"] for p in ps)
        toks = sum(p["client"]["tokens"] for p in ps)

        def mean(key: str) -> float | None:
            vals = [p["client"][key] for p in ps if p["client"][key] is not None]
            return statistics.fmean(vals) if vals else None

        return {
            "phases": len(ps),
            "wall_s": wall,
            "completed": done,
            "requests_per_s": done / wall if wall else None,
            "tokens_per_s": toks / wall if wall else None,
            "itl_ms_p99_mean": mean("itl_ms_p99"),
            "ttft_ms_p50_mean": mean("ttft_ms_p50"),
            "server_cpu_ms_per_1k": per_1k(sum(p["server_cpu_s"] for p in ps) * 1000, done),
        }

    u, t = agg(mode("untraced")), agg(mode("traced"))
    traced = mode("traced")
    trc_cpu_ms = sum(p["tracer"]["cpu_s"] for p in traced) * 1000
    rss = [p["tracer"]["peak_rss_kb"] for p in traced if p["tracer"]["peak_rss_kb"]]

    paired = paired_ratios(mode("untraced"), traced)
    floor = paired_ratios(mode("untraced"), mode("empty"))
    return {
        "untraced": u,
        "traced": t,
        "throughput_ratio": ratio(t["requests_per_s"], u["requests_per_s"]),
        "tokens_per_s_ratio": ratio(t["tokens_per_s"], u["tokens_per_s"]),
        "itl_p99_ratio": ratio(t["itl_ms_p99_mean"], u["itl_ms_p99_mean"]),
        "ttft_p50_ratio": ratio(t["ttft_ms_p50_mean"], u["ttft_ms_p50_mean"]),
        "server_cpu_per_1k_ratio": ratio(t["server_cpu_ms_per_1k"], u["server_cpu_ms_per_1k"]),
        "tracer_cpu_ms": trc_cpu_ms,
        "tracer_cpu_ms_per_1k_requests": per_1k(trc_cpu_ms, t["completed"]),
        "tracer_peak_rss_mb": max(rss) / 1024 if rss else None,
        "lost_events": sum(p["tracer"]["lost_events"] or 0 for p in traced),
        "traced_requests_recorded": sum(p["tracer"]["requests"] or 0 for p in traced),
        "traced_requests_client": t["completed"],
        "per_round": paired,
        # How far the rounds scatter: on a small shared VM a round can be
        # 10 % off, so a ratio means little without it.
        "throughput_ratio_stderr": standard_error([r["throughput_ratio"] for r in paired]),
        "server_cpu_per_1k_ratio_stderr": standard_error([r["server_cpu_per_1k_ratio"] for r in paired]),
        **bpf_time_per_request(traced, t, u),
        **({"attach_point_floor": mean_ratios(floor)} if floor else {}),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def paired_ratios(base: list[dict], other: list[dict]) -> list[dict]:
    """Per round, the other phase against the untraced one next to it."""
    return [
        {
            "round": pu["round"],
            "throughput_ratio": ratio(px["client"]["requests_per_s"], pu["client"]["requests_per_s"]),
            "itl_p99_ratio": ratio(px["client"]["itl_ms_p99"], pu["client"]["itl_ms_p99"]),
            "server_cpu_per_1k_ratio": ratio(
                per_1k(px["server_cpu_s"] * 1000, px["client"]["completed"]),
                per_1k(pu["server_cpu_s"] * 1000, pu["client"]["completed"]),
            ),
        }
        for pu, px in zip(base, other, strict=False)
    ]


def mean_ratios(rounds: list[dict]) -> dict:
    """Mean and standard error over rounds of each per-round ratio."""
    out: dict = {}
    for key in ("throughput_ratio", "server_cpu_per_1k_ratio"):
        known = [r[key] for r in rounds if r[key] is not None]
        out[key] = statistics.fmean(known) if known else None
        out[key + "_stderr"] = standard_error(known)
    return out


def standard_error(values: list[float | None]) -> float | None:
    """Standard error of the mean of the per-round values (None below two rounds)."""
    known = [v for v in values if v is not None]
    return statistics.stdev(known) / len(known) ** 0.5 if len(known) >= 2 else None


def bpf_time_per_request(traced: list[dict], t: dict, u: dict) -> dict:
    """With --bpf-stats: time inside the BPF programs per traced request (all programs,
    on every process's syscalls), and that against the untraced server CPU per request."""
    stats = [p["tracer"] for p in traced if p["tracer"].get("bpf_ns") is not None]
    if not stats or not t["completed"]:
        return {}
    ns = sum(s["bpf_ns"] for s in stats)
    us = ns / 1000 / t["completed"]
    # The kernel's timing reads the clock around every run; an empty program
    # measures that (it books nothing else), so it is taken off every run.
    floor_ns = sum(s["empty_program_ns"] for s in stats) / max(1, sum(s["empty_program_runs"] for s in stats))
    net_us = (ns - floor_ns * sum(s["bpf_runs"] for s in stats)) / 1000 / t["completed"]
    base = u["server_cpu_ms_per_1k"]  # ms per 1000 requests = us per request
    return {"bpf_us_per_request": us,
            "bpf_share_of_untraced_server_cpu": us / base if base else None,
            "bpf_stats_ns_per_run": floor_ns,
            "bpf_us_per_request_net_of_stats": net_us,
            "bpf_net_share_of_untraced_server_cpu": net_us / base if base else None}


def stderr_pct(stderr: float | None) -> str:
    return "" if stderr is None else f", per-round standard error {stderr * 100:.1f} %"


def print_summary(s: dict) -> None:
    def pct(r: float | None) -> str:
        return "-" if r is None else f"{(r - 1) * 100:+.1f} %"

    print()
    print("per round (traced/untraced):")
    for r in s["per_round"]:
        print(
            f"  round {r['round']}: throughput {fmt(r['throughput_ratio'], '.3f')}, "
            f"p99 ITL {fmt(r['itl_p99_ratio'], '.3f')}, "
            f"server CPU per request {fmt(r['server_cpu_per_1k_ratio'], '.3f')}"
        )
    u, t = s["untraced"], s["traced"]
    print(
        f"requests recorded by tracer / completed by client = "
        f"{s['traced_requests_recorded']} / {s['traced_requests_client']}"
    )
    print(
        f"server CPU per 1k requests: untraced = {fmt(u['server_cpu_ms_per_1k'], '.0f')} ms, "
        f"traced = {fmt(t['server_cpu_ms_per_1k'], '.0f')} ms "
        f"({pct(s['server_cpu_per_1k_ratio'])}{stderr_pct(s['server_cpu_per_1k_ratio_stderr'])})"
    )
    print(
        f"p50 TTFT traced/untraced = {fmt(s['ttft_p50_ratio'], '.3f')} "
        f"({pct(s['ttft_p50_ratio'])})"
    )
    print()
    print("== summary ==")
    thr = s["throughput_ratio"]
    loss = "-" if thr is None else f"{(1 - thr) * 100:.1f} %"
    print(f"throughput traced/untraced = {fmt(thr, '.3f')} (loss {loss}"
          f"{stderr_pct(s['throughput_ratio_stderr'])})")
    print(f"tokens/s ratio traced/untraced = {fmt(s['tokens_per_s_ratio'], '.3f')}")
    print(
        f"p99 ITL traced/untraced = {fmt(s['itl_p99_ratio'], '.3f')} "
        f"({pct(s['itl_p99_ratio'])})"
    )
    print(
        f"tracer CPU per 1k requests = {fmt(s['tracer_cpu_ms_per_1k_requests'], '.0f')} ms"
    )
    print(f"tracer peak RSS = {fmt(s['tracer_peak_rss_mb'], '.0f')} MB")
    print(f"lost events = {s['lost_events']}")
    if "attach_point_floor" in s:
        f = s["attach_point_floor"]
        print(f"attach points alone (do-nothing programs)/untraced: throughput "
              f"{fmt(f['throughput_ratio'], '.3f')}{stderr_pct(f['throughput_ratio_stderr'])}; "
              f"server CPU per request {fmt(f['server_cpu_per_1k_ratio'], '.3f')}"
              f"{stderr_pct(f['server_cpu_per_1k_ratio_stderr'])}")
    if "bpf_us_per_request" in s:
        share = s["bpf_share_of_untraced_server_cpu"]
        net = s["bpf_net_share_of_untraced_server_cpu"]
        print(f"BPF programs per request = {s['bpf_us_per_request']:.2f} us "
              f"({'-' if share is None else f'{share * 100:.1f} %'} of the untraced server CPU per request); "
              f"less the kernel's own timing ({s['bpf_stats_ns_per_run']:.0f} ns per run, an empty "
              f"program's): {s['bpf_us_per_request_net_of_stats']:.2f} us "
              f"({'-' if net is None else f'{net * 100:.1f} %'})")


# -- main ----------------------------------------------------------------------


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=3, help="untraced+traced pairs")
    ap.add_argument("--warmup", type=float, default=2.0, help="untimed load first (s)")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--unary", action="store_true",
                    help="one JSON response per request (headers and body in one write) instead "
                    "of an SSE stream: the many-small-requests case")
    ap.add_argument("--json", type=Path, default=None, help="write all numbers here")
    ap.add_argument(
        "--keep-dir", type=Path, default=None, help="keep recordings and logs in this folder"
    )
    ap.add_argument(
        "--server-log", action="store_true", help="let the server write its JSONL request log"
    )
    ap.add_argument("--bpf-stats", action="store_true",
                    help="also time the BPF programs themselves (kernel.bpf_stats_enabled, which "
                    "adds a little to every program run, so traced phases run slightly slower)")
    ap.add_argument("--floor", action="store_true",
                    help="a third phase per round with only do-nothing programs on the same socket "
                    "syscall tracepoints: the share of the overhead the attach points take by themselves")
    ap.add_argument("--record-arg", action="append", default=[],
                    help="extra argument for `inferprobe record` (repeat), e.g. --record-arg=--locks")
    args = ap.parse_args(argv)

    if os.geteuid() != 0:
        print("bench_overhead: loading BPF programs needs root", file=sys.stderr)
        return 2

    # SIGINT too: a shell may start background jobs with it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)
    with contextlib.ExitStack() as stack:
        if args.bpf_stats:
            stack.enter_context(bpf_stats_enabled())
        if args.keep_dir is not None:
            args.keep_dir.mkdir(parents=True, exist_ok=True)
            workdir = args.keep_dir
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ipbench-")))
        server = Server(workdir / "server_log.jsonl" if args.server_log else None)
        stack.callback(server.stop)

        print(
            f"server pid {server.pid} port {server.port}; {args.rounds} rounds x "
            f"({args.duration:g} s untraced + {args.duration:g} s traced), "
            f"{args.connections} connections, max_tokens {args.max_tokens}, "
            f"interval_ms {args.interval_ms:g}, {'unary' if args.unary else 'streamed'}; "
            f"{os.cpu_count()} CPUs",
            flush=True,
        )
        if args.warmup > 0:
            run_client(args, server.port, args.warmup)

        phases: list[dict] = []
        try:
            for rnd in range(1, args.rounds + 1):
                for mode in ("untraced", "traced", "empty") if args.floor else ("untraced", "traced"):
                    p = run_phase(args, server, workdir, rnd, mode)
                    phases.append(p)
                    c = p["client"]
                    extra = ""
                    if mode == "traced":
                        tr = p["tracer"]
                        extra = (
                            f", tracer {tr['cpu_s'] * 1000:.0f} ms CPU, "
                            f"{tr['requests']} recorded, {tr['lost_events']} lost"
                        )
                    print(
                        f"  round {rnd} {p['mode']:<8}: {c['requests_per_s']:.1f} req/s, "
                        f"p99 ITL {c['itl_ms_p99']} ms{extra}",
                        flush=True,
                    )
                    if c["errors"] or c["non_200"]:
                        print(
                            f"  warning: {c['errors']} client errors, {c['non_200']} non-200",
                            file=sys.stderr,
                        )
        except KeyboardInterrupt:
            print("\ninterrupted; cleaning up", file=sys.stderr)
            return 130

        print()
        print_table(phases, args.duration)
        summary = aggregate(phases)
        for p in phases:
            t = p.get("tracer")
            if t and t["requests"] is not None:
                n = p["client"]["completed"]
                if abs(t["requests"] - n) > max(2, 0.01 * n):
                    print(
                        f"warning: round {p['round']}: tracer recorded {t['requests']} "
                        f"requests, client completed {n}",
                        file=sys.stderr,
                    )
        print_summary(summary)

        if args.json is not None:
            doc = {
                "config": {
                    "duration_s": args.duration,
                    "rounds": args.rounds,
                    "warmup_s": args.warmup,
                    "connections": args.connections,
                    "max_tokens": args.max_tokens,
                    "interval_ms": args.interval_ms,
                    "unary": args.unary,
                    "cpus": os.cpu_count(),
                    "server_log": args.server_log,
                },
                "phases": phases,
                "summary": summary,
            }
            args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
            print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
