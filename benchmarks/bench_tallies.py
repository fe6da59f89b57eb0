#!/usr/bin/env python3
"""What a connection costs when the agent only tallies it, beside one followed in full.

Under `agent --max-cpu` only a sample of new connections is followed in full;
every accepted connection, sampled or not, is still counted and timed in the
kernel (bpf/host_wide.bpf.c's tallies). This measures both kinds on the same
server, `benchmarks/native/http_pingpong server` (C doing nothing but the
syscalls, so the tracer's cost inside them is undiluted), with streamed
responses (headers, --tokens chunks, the closing chunk: one write each):

    untraced | (not a target | followed in full | tallied only) x rounds | untraced

"not a target" is a second server of the same binary that the host-wide
filter (--port) leaves out: the hooks still run in its syscalls and turn it
away, the baseline each round's ratios are paired with, so that a loaded
machine's drift cancels. Each phase is a fresh keep-alive connection, the
traced ones accepted after the follow ratio was set to 1 or 0, with the
programs loaded once. Printed per phase: the client's ns per request (its
own CLOCK_MONOTONIC) and its ratio to the round's "not a target" phase; with
kernel.bpf_stats_enabled, the kernel's BPF run time per request, in all and
per program; and the tallies' own count of the requests (it must equal what
the client sent, followed or not).

    sudo .venv/bin/python benchmarks/bench_tallies.py [--requests 20000] [--tokens 8] [--rounds 3]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_host_wide import build
from bench_support import (
    DrainedTracer,
    bpf_stats_enabled,
    per_program,
    program_names,
    program_times_by_id,
    stop_process,
)

from inferprobe.collector.attach.probe_sets.host_wide import host_wide_set
from inferprobe.collector.model.connection_tallies import read_tallies
from inferprobe.collector.processes import host_wide


def run_client(exe: Path, port: int, requests: int, tokens: int) -> float:
    """ns per request over one new connection."""
    out = subprocess.run([str(exe), "client", str(port)], input=f"stream {requests} {tokens} write\n",
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return int(out.split()[0]) / requests


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000, help="requests per phase")
    ap.add_argument("--tokens", type=int, default=8, help="streamed chunks per response")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        server = subprocess.Popen([str(exe), "server"], stdout=subprocess.PIPE, text=True)
        other = subprocess.Popen([str(exe), "server"], stdout=subprocess.PIPE, text=True)
        try:
            port = int(server.stdout.readline().split()[-1])
            other_port = int(other.stdout.readline().split()[-1])
            run_client(exe, port, 500, args.tokens)   # warm-up
            untraced = [run_client(exe, port, args.requests, args.tokens)]
            phases: dict[str, list[dict]] = {"not_a_target": [], "followed": [], "tallied": []}
            with bpf_stats_enabled():
                filters = host_wide.make_filters((port,), None, None)
                traced = DrainedTracer(server.pid, sets=("sockets", "host_wide"),
                                       options={"host_wide": {"filters": filters}})
                bpf = traced.tracer.bpf
                host = host_wide_set(traced.tracer)
                for _ in range(args.rounds):
                    for phase, ratio in (("not_a_target", 1.0), ("followed", 1.0), ("tallied", 0.0)):
                        host.set_follow_ratio(bpf, ratio)
                        tallies0, times0 = read_tallies(bpf), program_times_by_id(os.getpid())
                        ns = run_client(exe, other_port if phase == "not_a_target" else port,
                                        args.requests, args.tokens)
                        times1, tallies1 = program_times_by_id(os.getpid()), read_tallies(bpf)
                        phases[phase].append({
                            "ns_per_request": ns,
                            "bpf": per_program(times0, times1, args.requests),
                            "bpf_ns_per_request": sum(t1[0] - times0.get(i, (0, 0))[0]
                                                      for i, t1 in times1.items()) / args.requests,
                            "tallied_requests": tallies1.minus(tallies0).counters["turns"],
                        })
                names = program_names()
                counters = traced.close()
            untraced.append(run_client(exe, port, args.requests, args.tokens))
        finally:
            stop_process(server, 5)
            stop_process(other, 5)

    base = statistics.mean(untraced)
    result = {"requests_per_phase": args.requests, "tokens": args.tokens, "rounds": args.rounds,
              "untraced_ns_per_request": round(base), "events_lost": counters.get("events_lost", 0)}
    print(f"untraced (no programs, before and after): {base:,.0f} ns per request ({args.tokens} chunks), "
          f"rounds: {args.rounds}")
    baselines = [r["ns_per_request"] for r in phases["not_a_target"]]
    for phase, runs in phases.items():
        ns = statistics.mean(r["ns_per_request"] for r in runs)
        paired = statistics.mean(r["ns_per_request"] / b for r, b in zip(runs, baselines, strict=True))
        bpf_ns = statistics.mean(r["bpf_ns_per_request"] for r in runs)
        counted = [r["tallied_requests"] for r in runs]
        programs: dict[str, dict] = {}
        for prog_id, figures in runs[-1]["bpf"].items():
            programs[names.get(prog_id, str(prog_id))] = figures
        result[phase] = {"ns_per_request": round(ns), "ratio_to_not_a_target": round(paired, 3),
                         "bpf_ns_per_request": round(bpf_ns), "tallied_requests": counted,
                         "programs": programs}
        print(f"{phase:>12}: {ns:,.0f} ns per request (x{paired:.3f}), BPF {bpf_ns:,.0f} ns per request, "
              f"tallied {counted} of {args.requests} per round")
        for name, figures in list(programs.items())[:6]:
            print(f"           {name:<28} {figures['ns_per_run']:>6} ns x {figures['runs_per_request']} runs")
    print(f"events lost: {result['events_lost']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
