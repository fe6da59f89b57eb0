#!/usr/bin/env python3
"""What tracing adds to each syscall of an HTTP server, measured on a C server.

benchmarks/native/http_pingpong.c is a keep-alive HTTP server that does
nothing but read() the request and write() the answer, and a separate
client process. With no interpreter in the way, the time per request is
the kernel's, so traced minus untraced, divided by the server's syscalls
per request, is what inferprobe's socket probes cost per syscall.

The workloads, interleaved in rounds (untraced, traced, untraced, ...):
  unary    one read() and one write() per request (Content-Length reply)
  write    one read() and K+2 writes: headers, K SSE token chunks, last chunk,
           each chunk one write() (Go's net/http, h11)
  writev   the same, each chunk a writev() of 4 iovecs (Node's http module)
  sendmsg  the same, each chunk a sendmsg() of 3 iovecs (asyncio, hyper)
  writev16 four chunks per writev() of 16 iovecs (Node with the socket corked)

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
run it on a quiet machine. Beside it, per program: ns per run and runs per
request, which is where a change shows; and the BPF time per syscall of a
process nobody traces (`http_pingpong spin`: write()s to /dev/null), which
every process on the host pays.

    sudo .venv/bin/python benchmarks/bench_syscalls.py [--rounds 3] [--requests 20000]
        [--stream-events 16] [--record-arg=--network] [--kernel-only]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_support import (
    REPO,
    DrainedTracer,
    EmptyPrograms,
    Recorder,
    _run_time,
    bpf_program_time,
    bpf_stats_enabled,
    per_program,
    stop_process,
)

from inferprobe.collector.attach import built_objects

MODES = ("untraced", "empty", "traced")
SHAPES = ("write", "writev", "sendmsg", "writev16")
SOURCE = REPO / "benchmarks" / "native" / "http_pingpong.c"


@contextlib.contextmanager
def bpf_source(source: Path):
    """Loads the probes from another copy of bpf/ meanwhile."""
    before = built_objects.BPF_DIR
    built_objects.BPF_DIR = source
    try:
        yield
    finally:
        built_objects.BPF_DIR = before


def program_times(bpf) -> dict[str, tuple[int, int]]:
    """(run time ns, runs) per loaded program of the sockets set's object (a bcc
    module for a baseline tree from before the move to libbpf). Tail-called
    programs have none of their own: their time is their caller's."""
    if hasattr(bpf, "funcs"):   # bcc
        fds = {name.decode().removeprefix("tracepoint__syscalls__"): fn.fd for name, fn in bpf.funcs.items()}
    else:
        fds = {name: bpf.program_fd(name) for name in bpf.programs() if bpf.autoloads(name)}
    out = {}
    for name, fd in fds.items():
        t = _run_time(Path(f"/proc/self/fdinfo/{fd}"))
        if t is not None and t[1]:
            out[name] = t
    return out


def measure_in_kernel(app: PingPong, workloads: dict, spin_syscalls: int) -> dict:
    """BPF time per server syscall, from the kernel's own per-program statistics;
    and per syscall of an untraced process."""
    tracer = DrainedTracer(app.pid)
    bpf = tracer.tracer.bpf
    out = {}
    try:
        with bpf_stats_enabled():
            for name, (command, n, syscalls) in workloads.items():
                before, programs_before = bpf_program_time(os.getpid()), program_times(bpf)
                app.run(command)
                after, programs_after = bpf_program_time(os.getpid()), program_times(bpf)
                ns, runs = after[0] - before[0], after[1] - before[1]
                out[name] = {"bpf_ns_per_server_syscall": round(ns / (n * syscalls)),
                             "bpf_ns_per_request": round(ns / n),
                             "program_runs_per_server_syscall": round(runs / (n * syscalls), 2),
                             "programs": per_program(programs_before, programs_after, n)}
            # spin N: N reads and N writes
            before, programs_before = bpf_program_time(os.getpid()), program_times(bpf)
            subprocess.run([str(app.exe), "spin", str(spin_syscalls // 2)], check=True, capture_output=True)
            after, programs_after = bpf_program_time(os.getpid()), program_times(bpf)
            out["untraced"] = {"bpf_ns_per_syscall": round((after[0] - before[0]) / spin_syscalls),
                               "program_runs_per_syscall": round((after[1] - before[1]) / spin_syscalls, 2),
                               "programs": per_program(programs_before, programs_after, spin_syscalls // 2)}
            empty = EmptyPrograms()
            try:
                before = empty.run_time()
                subprocess.run([str(app.exe), "spin", str(spin_syscalls // 2)], check=True,
                               capture_output=True)
                after = empty.run_time()
            finally:
                empty.stop()
            out["untraced"]["empty_programs_ns_per_syscall"] = round((after[0] - before[0]) / spin_syscalls)
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
        self.exe = exe
        self.client = subprocess.Popen([str(exe), "client", line.split()[1]], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)

    def run(self, command: str) -> int:
        """Elapsed ns of one batch ("unary N" or "stream N K SHAPE")."""
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


def print_in_kernel(in_kernel: dict) -> None:
    """One line per workload: BPF ns per request and per server syscall, then
    the programs that cost the most, as ns a run x runs a request."""
    for name, row in in_kernel.items():
        if name == "untraced":
            programs = ", ".join(f"{prog} {p['ns_per_run']} ns x{p['runs_per_request']}"
                                 for prog, p in row["programs"].items())
            print(f"untraced process: {row['bpf_ns_per_syscall']} ns of BPF per syscall "
                  f"({row['program_runs_per_syscall']} program runs: {programs}; do-nothing programs on "
                  f"every tracepoint of the 16 before: {row['empty_programs_ns_per_syscall']} ns)")
            continue
        top = ", ".join(f"{prog} {p['ns_per_run']} ns x{p['runs_per_request']}"
                        for prog, p in list(row["programs"].items())[:4])
        print(f"{name:8s}: {row['bpf_ns_per_request']} ns of BPF per request, "
              f"{row['bpf_ns_per_server_syscall']} per server syscall; {top}")


# The write syscall of each workload: its entry and exit programs are what a token write costs.
WRITE_SYSCALL = {"unary": "write", "write": "write", "writev": "writev", "sendmsg": "sendmsg",
                 "writev16": "writev"}


def token_write_ns(row: dict, workload: str) -> int:
    """BPF ns of one write of the workload: its syscall's entry and exit programs, a run each."""
    syscall = WRITE_SYSCALL[workload]
    return sum(p["ns_per_run"] for name, p in row["programs"].items()
               if name in (f"sys_enter_{syscall}", f"sys_exit_{syscall}"))


def compare_trees(app: PingPong, workloads: dict, trees: list[Path], rounds: int, spin_syscalls: int) -> None:
    """The probes of several copies of bpf/ (this tree's first), each measured once a
    round, in turn (reversed every other round, so none always follows another);
    per tree and workload, the median and minimum over the rounds. On a VM whose
    speed drifts between phases the minimum is the steadier figure."""
    got: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for rnd in range(rounds):
        order = list(enumerate(trees)) if rnd % 2 == 0 else list(reversed(list(enumerate(trees))))
        for index, source in order:
            with bpf_source(source):
                figures = measure_in_kernel(app, workloads, spin_syscalls)
            for name in workloads:
                got.setdefault((index, name), []).append(
                    (figures[name]["bpf_ns_per_server_syscall"], token_write_ns(figures[name], name)))
        print(f"round {rnd + 1} of {rounds} measured", flush=True)
    print(f"-- BPF ns, median (min) over {rounds} rounds; tree 0 is this one:")
    for index, source in enumerate(trees):
        print(f"tree {index}: {source}")
        for name in workloads:
            per_syscall = [a for a, _ in got[(index, name)]]
            per_write = [b for _, b in got[(index, name)]]
            print(f"  {name:8s}: per server syscall {statistics.median(per_syscall):.0f} "
                  f"({min(per_syscall)}), per write (entry + exit) {statistics.median(per_write):.0f} "
                  f"({min(per_write)})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20000, help="unary requests per phase")
    ap.add_argument("--stream-events", type=int, default=16)
    ap.add_argument("--record-arg", action="append", default=[])
    ap.add_argument("--bpf-dir", type=Path, action="append", default=[],
                    help="with --kernel-only: measure the probes of this source tree (a copy of bpf/, "
                         "e.g. from `git worktree add`, its objects built) too, in turn with the current "
                         "one for --rounds rounds, for a side-by-side comparison of versions in one run")
    ap.add_argument("--workloads", default=",".join(("unary",) + SHAPES),
                    help="comma-separated subset of: unary," + ",".join(SHAPES))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--kernel-only", action="store_true",
                    help="only the in-kernel program time (quick, low noise: for comparing probe versions)")
    args = ap.parse_args(argv)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("bench_syscalls: needs a C compiler")
    k = args.stream_events
    if k % 4:
        sys.exit("bench_syscalls: --stream-events must be a multiple of 4 (writev16 writes four a syscall)")
    streams = max(1, args.requests // (k + 2))
    workloads = {"unary": (f"unary {args.requests}", args.requests, 2)}
    for shape in SHAPES:
        writes = k // 4 if shape == "writev16" else k
        workloads[shape] = (f"stream {streams} {k} {shape}", streams, writes + 3)
    unknown = set(args.workloads.split(",")) - set(workloads)
    if unknown:
        sys.exit(f"bench_syscalls: no workload named {', '.join(sorted(unknown))}")
    workloads = {name: w for name, w in workloads.items() if name in args.workloads.split(",")}
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
            in_kernel = measure_in_kernel(app, workloads, args.requests * 4)
            if args.bpf_dir:
                compare_trees(app, workloads, [built_objects.BPF_DIR, *(d.resolve() for d in args.bpf_dir)],
                              args.rounds, args.requests * 4)
        finally:
            app.close()
    print_in_kernel(in_kernel)
    if args.kernel_only:
        if args.json:
            args.json.write_text(json.dumps(in_kernel, indent=2))
        return 0
    summary = {"untraced_process": in_kernel["untraced"]}
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
