#!/usr/bin/env python3
"""Server CPU per request with the probes detached, attached to no target, and tracing.

bench_overhead.py starts a fresh `inferprobe record` for every traced phase,
so its phases are tens of seconds apart, and on a small VM the machine's
own speed drifts by more than the few percent being measured. Here the
tracer is compiled and loaded once, in this process, and switched between
short phases:

  detached    no program on any tracepoint: the server runs as untraced
  untargeted  every program attached, the server's pid not in the target
              set: what the tracepoints cost whatever a tracer does (they
              fire for every process on the host), plus the target check
  traced      the server traced, as `record` traces it

Each round runs the three in a rotated order, so that drift falls on each
state alike, and the ratios are taken within a round. What is compared is
the server's own CPU time per completed request (utime + stime from /proc),
where the BPF programs and the tracepoints' slow path are paid; throughput
is shown too. Events of the traced phases are drained (not written) by a
thread of this process, whose CPU is not the server's.

    sudo .venv/bin/python benchmarks/bench_attach_toggle.py [--rounds 9] [--phase-s 3]
        [--connections 16] [--max-tokens 1] [--interval-ms 0] [--bpf-stats] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path

from bench_support import DrainedTracer, Server, bpf_program_time, bpf_stats_enabled, proc_cpu_s, run_client

STATES = ("detached", "untargeted", "traced")


class SwitchedTracer(DrainedTracer):
    """The default probe sets, loaded once, switched between STATES."""

    def __init__(self, pid: int, ringbuf_pages: int) -> None:
        super().__init__(pid, ringbuf_pages)
        self.pid = pid
        self.tracepoints = list(self.tracer.bpf.tracepoint_fds)
        self.attached = True

    def _attach(self, on: bool) -> None:
        if on == self.attached:
            return
        bpf = self.tracer.bpf
        for tp in self.tracepoints:
            if on:
                category, event = tp.decode().split(":")
                bpf.attach_tracepoint(tp=tp, fn_name=f"tracepoint__{category}__{event}".encode())
            else:
                bpf.detach_tracepoint(tp)
        self.attached = on

    def switch(self, state: str) -> None:
        from inferprobe.collector.attach.target_bitmap import add_targets, remove_targets

        self._attach(state != "detached")
        (add_targets if state == "traced" else remove_targets)(self.tracer.bpf, [self.pid])


def run_phase(args: argparse.Namespace, server: Server, tracer: SwitchedTracer, state: str) -> dict:
    tracer.switch(state)
    bpf0 = bpf_program_time(os.getpid())
    cpu0 = proc_cpu_s(server.pid)
    summary, _ = run_client(args, server.port, args.phase_s)
    cpu1 = proc_cpu_s(server.pid)
    bpf1 = bpf_program_time(os.getpid())
    n = summary["completed"]
    return {
        "completed": n,
        "requests_per_s": summary["requests_per_s"],
        "server_cpu_us_per_request": (cpu1 - cpu0) * 1e6 / n if n else None,
        "bpf_us_per_request": (bpf1[0] - bpf0[0]) / 1000 / n if n and args.bpf_stats else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9, help="rounds of the three states, order rotated")
    ap.add_argument("--phase-s", type=float, default=3.0, help="seconds of load per phase")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--interval-ms", type=float, default=0.0)
    ap.add_argument("--bpf-stats", action="store_true",
                    help="also time the BPF programs (kernel.bpf_stats_enabled; adds its own "
                         "clock reads to every run, so it inflates the attached phases a little)")
    ap.add_argument("--ringbuf-pages", type=int, default=2048, help="as record's default (8 MiB)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_attach_toggle: loading BPF programs needs root", file=sys.stderr)
        return 2

    with contextlib.ExitStack() as stack:
        if args.bpf_stats:
            stack.enter_context(bpf_stats_enabled())
        server = Server(None)
        stack.callback(server.stop)
        tracer = SwitchedTracer(server.pid, args.ringbuf_pages)
        run_client(args, server.port, 2.0)  # warm-up, traced
        rounds = []
        for i in range(args.rounds):
            order = STATES[i % 3:] + STATES[:i % 3]
            phases = {state: run_phase(args, server, tracer, state) for state in order}
            base = phases["detached"]
            r = {"phases": phases}
            for state in ("untargeted", "traced"):
                r[f"{state}_server_cpu_ratio"] = (phases[state]["server_cpu_us_per_request"]
                                                  / base["server_cpu_us_per_request"])
                r[f"{state}_throughput_ratio"] = phases[state]["requests_per_s"] / base["requests_per_s"]
            if args.bpf_stats:
                r["bpf_share"] = phases["traced"]["bpf_us_per_request"] / base["server_cpu_us_per_request"]
            rounds.append(r)
            bpf = f" (BPF {phases['traced']['bpf_us_per_request']:.2f} us/request)" if args.bpf_stats else ""
            print(f"round {i + 1}: server CPU/request detached {base['server_cpu_us_per_request']:.1f} us; "
                  f"untargeted x{r['untargeted_server_cpu_ratio']:.3f}, "
                  f"traced x{r['traced_server_cpu_ratio']:.3f}{bpf}", flush=True)
        tracer.switch("traced")
        counters = tracer.close()

    def spread(key: str) -> dict:
        values = [r[key] for r in rounds]
        quartiles = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
        return {"median": statistics.median(values), "q1": quartiles[0], "q3": quartiles[2]}

    summary = {key: spread(key) for key in ("untargeted_server_cpu_ratio", "traced_server_cpu_ratio",
                                            "untargeted_throughput_ratio", "traced_throughput_ratio")}
    if args.bpf_stats:
        summary["bpf_share_of_detached_server_cpu"] = spread("bpf_share")
    summary["events_sent"] = counters.get("events_sent")
    summary["events_lost"] = counters.get("events_lost")
    print()
    for key, label in (("untargeted_server_cpu_ratio", "server CPU per request, untargeted/detached"),
                       ("traced_server_cpu_ratio", "server CPU per request, traced/detached"),
                       ("untargeted_throughput_ratio", "throughput, untargeted/detached"),
                       ("traced_throughput_ratio", "throughput, traced/detached"),
                       ("bpf_share_of_detached_server_cpu", "BPF programs / detached server CPU")):
        if key in summary:
            s = summary[key]
            print(f"{label}: median {s['median']:.3f} (quartiles {s['q1']:.3f}-{s['q3']:.3f})")
    print(f"events sent {summary['events_sent']}, lost {summary['events_lost']}")
    if args.json is not None:
        args.json.write_text(json.dumps({"config": vars(args) | {"json": str(args.json)},
                                         "rounds": rounds, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
