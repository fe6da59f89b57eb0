#!/usr/bin/env python3
"""What `record --all` costs a host where nothing it records is happening.

The host gets --idle idle processes (sleep) and --listeners idle servers (a
listening socket each, never connected to). The workload is a process that
serves nothing and makes syscalls as fast as it can:
`benchmarks/native/http_pingpong spin N` (one-byte read()s of /dev/zero and
write()s to /dev/null, the syscalls sock.bpf.c hooks). Nothing it does can
match: it neither listens nor accepts.

Phases interleaved in rounds: untraced; do-nothing BPF programs on the same
syscall tracepoints (what any syscall tracer pays: the tracepoints put every
syscall of the host on the slow path); then under `inferprobe record --all`
(the idle servers adopted, so the hooks' target test is not trivially empty).
Printed per phase: ns per workload syscall (its own CLOCK_MONOTONIC), the
traced/untraced ratio, and with kernel.bpf_stats_enabled the kernel's run
time of the recorder's BPF programs (every run, every CPU: from the
recorder's /proc/<pid>/fdinfo) per workload syscall, with the programs that
ran, beside the recorder's own CPU (its /proc scans every 5 s included).
Last, the time one /proc listener scan takes with this many processes.

    sudo .venv/bin/python benchmarks/bench_host_wide.py [--rounds 3] [--syscalls 2000000]
        [--idle 1000] [--listeners 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_support import (
    PY,
    REPO,
    EmptyPrograms,
    bpf_stats_enabled,
    per_program,
    proc_cpu_s,
    program_names,
    program_times_by_id,
    stop_process,
)

SOURCE = REPO / "benchmarks" / "native" / "http_pingpong.c"
LISTENER = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); time.sleep(3600)"


def build(tmp: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("bench_host_wide: needs a C compiler (cc) for benchmarks/native/http_pingpong.c")
    exe = tmp / "http_pingpong"
    subprocess.run([cc, "-O2", "-o", str(exe), str(SOURCE)], check=True)
    return exe


def spin_ns_per_syscall(exe: Path, n: int) -> float:
    out = subprocess.run([str(exe), "spin", str(n)], capture_output=True, text=True, check=True).stdout
    return int(out) / (2 * n)


class RecordAll:
    def __init__(self, output: Path):
        self.proc = subprocess.Popen([PY, "-m", "inferprobe.cli.main", "record", "--all", "-o", str(output)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in self.proc.stdout:
            if line.startswith("inferprobe: attached"):
                self.attached = line.strip()
                return
        raise RuntimeError("record --all did not attach")

    def stop(self) -> None:
        stop_process(self.proc, timeout=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--syscalls", type=int, default=2_000_000, help="read+write pairs per phase")
    ap.add_argument("--idle", type=int, default=1000, help="idle processes (sleep)")
    ap.add_argument("--listeners", type=int, default=20, help="idle listening processes")
    args = ap.parse_args()

    from inferprobe.collector.processes.host_wide import ListenerScan

    tmp = Path(tempfile.mkdtemp(prefix="bench_host_wide."))
    exe = build(tmp)
    crowd = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.idle)]
    crowd += [subprocess.Popen([PY, "-c", LISTENER]) for _ in range(args.listeners)]
    time.sleep(1)   # the listeners bind
    rows = []
    try:
        for rnd in range(args.rounds):
            untraced = spin_ns_per_syscall(exe, args.syscalls)
            empty = EmptyPrograms()
            try:
                floor = spin_ns_per_syscall(exe, args.syscalls)
                with bpf_stats_enabled():
                    e0 = empty.run_time()
                    spin_ns_per_syscall(exe, args.syscalls)
                    e1 = empty.run_time()
            finally:
                empty.stop()
            # What the kernel books per run of a program that does nothing: its timing overhead.
            booked_per_run = (e1[0] - e0[0]) / max(1, e1[1] - e0[1])
            rec = RecordAll(tmp / f"r{rnd}.ipr")
            try:
                # Wall clock without the statistics (they add two clock reads to every program run) ...
                traced = spin_ns_per_syscall(exe, args.syscalls)
                # ... and the kernel's own figures with them.
                with bpf_stats_enabled():
                    before, cpu0 = program_times_by_id(rec.proc.pid), proc_cpu_s(rec.proc.pid)
                    t0 = time.monotonic()
                    spin_ns_per_syscall(exe, args.syscalls)
                    wall = time.monotonic() - t0
                    after, cpu1 = program_times_by_id(rec.proc.pid), proc_cpu_s(rec.proc.pid)
                    names = program_names()
            finally:
                rec.stop()
            ran = per_program(before, after, 2 * args.syscalls)
            programs = {names.get(pid, str(pid)): v for pid, v in ran.items()}
            spent = sum(after[p][0] - before.get(p, (0, 0))[0] for p in after)
            bpf_ns = spent / (2 * args.syscalls)
            rows.append({"untraced": untraced, "floor": floor, "booked_per_run": booked_per_run,
                         "traced": traced, "bpf_ns": bpf_ns, "programs": programs,
                         "recorder_cpu_share": (cpu1 - cpu0) / wall, "attached": rec.attached})
            print(f"round {rnd + 1}: untraced {untraced:.1f} ns/syscall, empty programs {floor:.1f}, "
                  f"record --all {traced:.1f} (x{traced / untraced:.3f}, x{traced / floor:.3f} of empty); "
                  f"BPF {bpf_ns:.1f} ns per workload syscall; "
                  f"recorder CPU {rows[-1]['recorder_cpu_share']:.2%}", flush=True)
        t0 = time.perf_counter()
        scanner = ListenerScan()
        scanner.scan()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        scanner.scan()
        again = time.perf_counter() - t0
    finally:
        for proc in crowd:
            proc.kill()
        for proc in crowd:
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    ratios = [r["traced"] / r["untraced"] for r in rows]
    bpf = [r["bpf_ns"] for r in rows]
    cpu = statistics.median(r["recorder_cpu_share"] for r in rows)
    top = list(rows[-1]["programs"].items())[:8]
    print()
    print(f"host: {args.idle} idle processes, {args.listeners} idle listeners; {rows[-1]['attached']}")
    print("traced / untraced per syscall of a process that matches nothing: "
          f"median x{statistics.median(ratios):.3f} (rounds: {', '.join(f'x{r:.3f}' for r in ratios)})")
    print("BPF run time per workload syscall (kernel.bpf_stats_enabled): "
          f"median {statistics.median(bpf):.1f} ns")
    print("per program (last round), ns per run x runs per workload syscall: "
          + ", ".join(f"{name} {p['ns_per_run']} x {p['runs_per_request']}" for name, p in top))
    floors = [r["traced"] / r["floor"] for r in rows]
    print("record --all / do-nothing programs on the same tracepoints (what any syscall tracer pays): "
          f"median x{statistics.median(floors):.3f}")
    print("of the BPF time, the statistics' own booking per run (measured on the do-nothing programs): "
          f"median {statistics.median(r['booked_per_run'] for r in rows):.0f} ns")
    print(f"recorder CPU meanwhile: median {cpu:.2%} of a CPU")
    print(f"/proc listener scan: {first * 1e3:.1f} ms the first time (fds walked), {again * 1e3:.1f} ms "
          "after (listening sockets per network namespace only), every 5 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
