#!/usr/bin/env python3
"""What tracing adds to each syscall of an HTTP server, measured on a C server.

benchmarks/native/http_pingpong.c is a keep-alive HTTP server that does
nothing but read() the request and write() the answer, and a separate
client process. With no interpreter in the way, the time per request is
the kernel's, so traced minus untraced, divided by the server's syscalls
per request, is what inferprobe's socket probes cost per syscall.

Two workloads, interleaved in rounds (untraced, traced, untraced, ...):
  unary    one read() and one write() per request (Content-Length reply)
  stream   one read() and K+2 write()s: headers, K SSE events, last chunk

Each traced phase attaches `inferprobe record -p SERVER` (attach time not
measured) and checks the recording saw every request. A third phase per
round attaches programs that return at once to the same syscall
tracepoints: the floor the kernel's tracepoint machinery costs whatever a
tracer does, so the rest is inferprobe's own work.

Wall-clock ping-pong on a small VM is noisy, so a last phase measures the
programs themselves: with kernel.bpf_stats_enabled the kernel times every
run of every BPF program (tail calls included in their caller), read back
from /proc/self/fdinfo of a tracer loaded in this process. That figure, in
ns of BPF per server syscall, is the one to compare between versions of the
probes. It includes the target filter running on every other process's
socket syscalls meanwhile (the client's, and anything else on the host):
run it on a quiet machine.

    sudo .venv/bin/python benchmarks/bench_syscalls.py [--rounds 3] [--requests 20000]
        [--stream-events 16] [--record-arg=--network]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_overhead import (
    DrainedTracer,
    EmptyPrograms,
    Recorder,
    bpf_program_time,
    bpf_stats_enabled,
    stop_process,
)

REPO = Path(__file__).resolve().parent.parent
MODES = ("untraced", "empty", "traced")
SOURCE = REPO / "benchmarks" / "native" / "http_pingpong.c"


def measure_in_kernel(app: PingPong, workloads: dict) -> dict:
    """BPF time per server syscall, from the kernel's own per-program statistics."""
    tracer = DrainedTracer(app.pid)
    out = {}
    try:
        with bpf_stats_enabled():
            for name, (command, n, syscalls) in workloads.items():
                before = bpf_program_time(os.getpid())
                app.run(command)
                after = bpf_program_time(os.getpid())
                ns, runs = after[0] - before[0], after[1] - before[1]
                out[name] = {"bpf_ns_per_server_syscall": round(ns / (n * syscalls)),
                             "program_runs_per_server_syscall": round(runs / (n * syscalls), 2)}
    finally:
        tracer.close()
    return out


class PingPong:
    def __init__(self, exe: Path) -> None:
        self.server = subprocess.Popen([str(exe), "server"], stdout=subprocess.PIPE, text=True)
        line = self.server.stdout.readline()
        if not line.startswith("LISTENING"):
            stop_process(self.server, 5)
            raise RuntimeError(f"http_pingpong server did not start: {line!r}")
        self.pid = self.server.pid
        self.client = subprocess.Popen([str(exe), "client", line.split()[1]], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)

    def run(self, command: str) -> int:
        """Elapsed ns of one batch ("unary N" or "stream N K")."""
        self.client.stdin.write(command + "\n")
        self.client.stdin.flush()
        line = self.client.stdout.readline()
        if not line:
            raise RuntimeError("http_pingpong client exited")
        return int(line)

    def close(self) -> None:
        self.client.stdin.close()
        stop_process(self.client, 5)
        stop_process(self.server, 5)


def recorded_requests(recording: Path) -> int:
    out = subprocess.run([sys.executable, "-m", "inferprobe.cli.main", "report", str(recording),
                          "--format", "json"], capture_output=True, text=True, check=True).stdout
    return len(json.loads(out)["requests"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20000, help="unary requests per phase")
    ap.add_argument("--stream-events", type=int, default=16)
    ap.add_argument("--record-arg", action="append", default=[])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--kernel-only", action="store_true",
                    help="only the in-kernel program time (quick, low noise: for comparing probe versions)")
    args = ap.parse_args(argv)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("bench_syscalls: needs a C compiler")
    k = args.stream_events
    streams = max(1, args.requests // (k + 2))
    workloads = {
        "unary": (f"unary {args.requests}", args.requests, 2),
        "stream": (f"stream {streams} {k}", streams, k + 3),
    }
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        exe = tmp / "http_pingpong"
        subprocess.run([cc, "-O2", "-o", str(exe), str(SOURCE)], check=True)
        app = PingPong(exe)
        try:
            for command, _, _ in workloads.values():  # warm-up
                app.run(command)
            ns: dict[tuple[str, str], list[float]] = {}
            for rnd in range(0 if args.kernel_only else args.rounds):
                for mode in MODES:
                    rec = empty = None
                    if mode == "traced":
                        out = tmp / f"r{rnd}.ipr"
                        rec = Recorder(app.pid, out, tmp / f"r{rnd}.err", tuple(args.record_arg))
                    elif mode == "empty":
                        empty = EmptyPrograms()
                    sent = 0
                    for name, (command, n, _) in workloads.items():
                        per_request = app.run(command) / n
                        ns.setdefault((name, mode), []).append(per_request)
                        sent += n
                    if empty is not None:
                        empty.stop()
                    if rec is not None:
                        rec.stop()
                        seen = recorded_requests(out)
                        # The server sat in read() when the recorder attached: that
                        # read began unseen, so its request cannot be recorded.
                        if seen < sent - 1:
                            raise RuntimeError(f"round {rnd}: recorded {seen} of {sent} requests")
                    print(f"round {rnd + 1} {mode:8s}: "
                          + ", ".join(f"{name} {ns[(name, mode)][-1] / 1000:.2f} us/request"
                                      for name in workloads), flush=True)
            in_kernel = measure_in_kernel(app, workloads)
        finally:
            app.close()
    if args.kernel_only:
        print(json.dumps(in_kernel))
        return 0
    summary = {}
    for name, (_, _, syscalls) in workloads.items():
        base, floor, traced = (statistics.median(ns[(name, m)]) for m in MODES)
        summary[name] = {
            "untraced_ns_per_request": round(base),
            "empty_programs_ns_per_request": round(floor),
            "traced_ns_per_request": round(traced),
            "ratio": round(traced / base, 3),
            "server_syscalls_per_request": syscalls,
            "added_ns_per_server_syscall": round((traced - base) / syscalls),
            "tracepoint_floor_ns_per_server_syscall": round((floor - base) / syscalls),
            "rounds": {m: [round(v) for v in ns[(name, m)]] for m in MODES},
            **in_kernel[name],
        }
        print(f"{name:6s}: {base / 1000:.2f} -> {traced / 1000:.2f} us/request "
              f"(x{traced / base:.3f}), +{(traced - base) / syscalls:.0f} ns per server syscall "
              f"({syscalls} per request), of which the tracepoints alone "
              f"+{(floor - base) / syscalls:.0f} ns; in BPF programs "
              f"{in_kernel[name]['bpf_ns_per_server_syscall']} ns per server syscall")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
