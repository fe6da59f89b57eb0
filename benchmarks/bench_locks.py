#!/usr/bin/env python3
"""Cost of the locks probe set on a futex-heavy workload, traced vs untraced.

A two-thread semaphore ping-pong (benchmarks/native/futex_pingpong.c: every
handoff is a FUTEX_WAKE plus usually a FUTEX_WAIT and two context switches)
runs HANDOFFS handoffs per phase, in alternating phases of one process:
untraced, traced by `inferprobe record --locks`, untraced, ... The printed
ratio is traced time / untraced time: the worst case for this probe set,
since the workload does nothing but futex calls and context switches.

With --python-lock the workload is instead one Python thread doing
`with lock: pass` on a threading.Lock (CPython 3.11: sem_trywait and
sem_post, each a uprobe hit of the locks set's semaphore probes, and no
futex call): what those probes cost per acquire and release.

For a server under load run benchmarks/bench_overhead.py --record-arg=--locks
(the test SSE server) or benchmarks/bench_demo.py (the demo server).

--baseline DIR adds, to each round, a phase traced by another checkout's recorder
(bench_support.baseline_env): the locks programs of two trees on the same
process, in the same run. --record-arg passes more to `record` (--offcpu: the
off-CPU profile too, on the same tracker). --bpf-stats adds the kernel's own
time per handoff of each traced phase, in all and per program
(kernel.bpf_stats_enabled, which costs a little itself).

Usage (root): .venv/bin/python benchmarks/bench_locks.py [--handoffs 200000] [--rounds 3] [--python-lock]
              [--baseline DIR] [--record-arg=--offcpu] [--bpf-stats]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import (  # noqa: E402
    REPO,
    baseline_env,
    bpf_ns_between,
    bpf_stats_enabled,
    per_program,
    program_names,
    program_times_by_id,
)

SOURCE = REPO / "benchmarks" / "native" / "futex_pingpong.c"
# Same protocol as futex_pingpong: "ready", then per line N on stdin, the ns N operations took.
PYTHON_LOCK_LOOP = """
import sys, threading, time
lock = threading.Lock()
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with lock:
            pass
    print(time.perf_counter_ns() - t0, flush=True)
"""


def build(tmp: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("bench_locks: no C compiler (install gcc)")
    exe = tmp / "futex_pingpong"
    subprocess.run([cc, "-O2", "-pthread", "-o", str(exe), str(SOURCE)], check=True)
    return exe


def run_phase(proc: subprocess.Popen, handoffs: int) -> float:
    proc.stdin.write(f"{handoffs}\n")
    proc.stdin.flush()
    return int(proc.stdout.readline()) / 1e9


def attach(pid: int, output: Path, env: dict[str, str] | None = None,
           extra: tuple[str, ...] = ()) -> subprocess.Popen:
    rec = subprocess.Popen(
        [sys.executable, "-m", "inferprobe.cli.main", "record", "-p", str(pid), "--locks", *extra,
         "-o", str(output)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in rec.stdout:
        if line.startswith("inferprobe: attached"):
            return rec
    sys.exit(f"bench_locks: recorder did not attach: {rec.stderr.read()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--handoffs", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python-lock", action="store_true",
                    help="time threading.Lock acquire+release in Python instead of the ping-pong")
    ap.add_argument("--baseline", type=Path, help="another checkout whose recorder traces a phase too")
    ap.add_argument("--record-arg", action="append", default=[], help="passed on to `record` (repeatable)")
    ap.add_argument("--bpf-stats", action="store_true", help="the kernel's time per handoff, per program")
    args = ap.parse_args()
    what = "threading.Lock acquire+release" if args.python_lock else "futex ping-pong"
    unit = "operation" if args.python_lock else "handoff"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        argv = [sys.executable, "-c", PYTHON_LOCK_LOOP] if args.python_lock else [str(build(tmp))]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()
        run_phase(proc, args.handoffs // 4)  # warm-up
        tracers = {"traced": None}
        if args.baseline:
            tracers["traced (baseline)"] = baseline_env(args.baseline.resolve(), tmp)
        plain: list[float] = []
        traced: dict[str, list[float]] = {name: [] for name in tracers}
        kernel_ns: dict[str, list[float]] = {name: [] for name in tracers}
        for i in range(args.rounds):
            plain.append(run_phase(proc, args.handoffs))
            for name, env in tracers.items():
                rec = attach(proc.pid, tmp / f"r{i}-{len(traced[name])}{bool(env)}.ipr", env,
                             tuple(args.record_arg))
                with bpf_stats_enabled() if args.bpf_stats else contextlib.nullcontext():
                    before = program_times_by_id(rec.pid)
                    traced[name].append(run_phase(proc, args.handoffs))
                    after = program_times_by_id(rec.pid)
                if args.bpf_stats:
                    kernel_ns[name].append(_kernel_per_handoff(before, after, args.handoffs))
                rec.send_signal(signal.SIGTERM)
                out, _ = rec.communicate(timeout=120)
                print(f"round {i + 1}: untraced {plain[-1]:.3f} s, {name} {traced[name][-1]:.3f} s"
                      f"  ({out.strip()})")
        proc.kill()
    p = statistics.median(plain)
    for name, times in traced.items():
        t = statistics.median(times)
        per_handoff_us = (t - p) / args.handoffs * 1e6
        print(f"{what}, {args.handoffs} {unit}s: untraced {p:.3f} s, {name} {t:.3f} s, "
              f"ratio {t / p:.2f} ({per_handoff_us:+.2f} us per {unit})")
        if kernel_ns[name]:
            print(f"  {name}: BPF programs {statistics.median(kernel_ns[name]):.0f} ns per {unit} "
                  f"(rounds: {', '.join(f'{v:.0f}' for v in kernel_ns[name])})")
    return 0


def _kernel_per_handoff(before: dict, after: dict, handoffs: int) -> float:
    """The kernel's time in the recorder's programs per handoff, printed per program too
    (bench_support.per_program, as the other benchmarks print it)."""
    names = program_names()
    for prog_id, cost in per_program(before, after, handoffs).items():
        print(f"    {names.get(prog_id, prog_id)}: {cost['ns_per_run']} ns a run, "
              f"{cost['runs_per_request']} runs per handoff")
    return bpf_ns_between(before, after) / handoffs


if __name__ == "__main__":
    sys.exit(main())
