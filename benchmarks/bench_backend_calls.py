#!/usr/bin/env python3
"""What tracing costs a server's calls to a non-HTTP backend (a database, a cache).

An inference server talks to more than its clients: Redis, Postgres, a
vector store, over connections it connect()s. The socket probes follow every
connected socket of a target (its outbound HTTP calls are the client side,
docs/client-calls.md), so those backend connections are seen too. This
benchmark measures what they cost: a target process makes --calls round
trips of a small non-HTTP message (a Redis-like "*1\\r\\n$4\\r\\nPING\\r\\n")
to a local TCP echo server, untraced and then traced, in one run:

    [untraced] [traced, kernel.bpf_stats_enabled]

and prints the round trip's wall time both ways (a ratio), the BPF time
the kernel booked per round trip, per program, and whether the connection
was recorded (it must not be: it carried no HTTP).

    sudo .venv/bin/python benchmarks/bench_backend_calls.py [--calls 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

from bench_support import (
    Recorder,
    bpf_ns_between,
    bpf_stats_enabled,
    per_program,
    program_names,
    program_times_by_id,
    read_report,
)

# The target: waits for a line on stdin, then makes the round trips and prints their mean in ns.
TARGET = textwrap.dedent("""
    import socket, sys, time
    port, calls = int(sys.argv[1]), int(sys.argv[2])
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"*1\\r\\n$4\\r\\nPING\\r\\n"
    print("ready", flush=True)
    for _ in range(2):
        sys.stdin.readline()
        start = time.monotonic_ns()
        for _ in range(calls):
            conn.sendall(msg)
            conn.recv(64)
        print((time.monotonic_ns() - start) // calls, flush=True)
""")


def echo_server() -> int:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := conn.recv(64):
            conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    port = echo_server()
    target = subprocess.Popen([sys.executable, "-c", TARGET, str(port), str(args.calls)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        target.stdin.write("go\n")
        target.stdin.flush()
        untraced_ns = int(target.stdout.readline())
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run.ipr"
            rec = Recorder(target.pid, out, Path(tmp) / "err")
            try:
                with bpf_stats_enabled():
                    before = program_times_by_id(rec.proc.pid)
                    target.stdin.write("go\n")
                    target.stdin.flush()
                    traced_ns = int(target.stdout.readline())
                    after = program_times_by_id(rec.proc.pid)
                    names = program_names()
            finally:
                rec.stop()
            report = read_report(out)
    finally:
        target.kill()
    programs = {names.get(i, str(i)).removeprefix("tracepoint__syscalls__"): cost
                for i, cost in per_program(before, after, args.calls).items()}
    bpf_ns = bpf_ns_between(before, after) / args.calls
    summary = {"untraced_ns_per_round_trip": untraced_ns, "traced_ns_per_round_trip": traced_ns,
               "ratio": round(untraced_ns / traced_ns, 3), "bpf_ns_per_round_trip": round(bpf_ns),
               "requests_recorded": len(report["requests"]),
               "unrecognised_connections": report.get("unrecognised_connections"), "programs": programs}
    top = ", ".join(f"{n} {p['ns_per_run']} ns x{p['runs_per_request']}"
                    for n, p in list(programs.items())[:5])
    print(f"round trip {untraced_ns} ns untraced, {traced_ns} ns traced (x{summary['ratio']}); "
          f"BPF {summary['bpf_ns_per_round_trip']} ns per round trip: {top}; recorded "
          f"{summary['requests_recorded']} requests, "
          f"{summary['unrecognised_connections']} unrecognised connection(s)")
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
