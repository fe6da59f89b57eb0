#!/usr/bin/env python3
"""Server CPU per request with the probes attached and detached, seconds apart.

bench_overhead.py starts a fresh `inferprobe record` for every traced phase,
so its phases are tens of seconds apart, and on a small VM the machine's
own speed drifts by more than the few percent being measured. Here the
tracer is compiled and loaded once, in this process, and its tracepoints
are detached and attached again between short phases (ABBA order: detached,
attached, attached, detached, ...), so each pair of phases sees the same
machine. What is compared is the server's own CPU time per completed
request (utime + stime from /proc), which is where the BPF programs and the
syscall tracepoints' slow path are paid; throughput is shown too.

With the probes detached the server runs exactly as untraced: no program is
attached to any tracepoint. The events of the attached phases are drained
(not written) by a thread of this process, whose CPU is not the server's.

    sudo .venv/bin/python benchmarks/bench_attach_toggle.py [--pairs 8] [--phase-s 4]
        [--connections 16] [--max-tokens 1] [--interval-ms 0] [--bpf-stats] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
from pathlib import Path

from bench_overhead import Server, bpf_program_time, bpf_stats_enabled, proc_cpu_s, run_client


class ToggledTracer:
    """The default probe sets, loaded once; tracepoints detached or attached on demand."""

    def __init__(self, pid: int) -> None:
        from inferprobe.collector.loader import DEFAULT_SETS, load_tracer
        from inferprobe.collector.ringbuf import RingBufferReader

        self.tracer = load_tracer([pid], sets=DEFAULT_SETS)
        self.tracepoints = list(self.tracer.bpf.tracepoint_fds)
        self.reader = RingBufferReader(self.tracer, lambda chunk: None)
        self._stop = threading.Event()
        self._pump = threading.Thread(target=self._drain, daemon=True)
        self._pump.start()
        self.attached = True

    def _drain(self) -> None:
        while not self._stop.is_set():
            self.reader.poll(50)

    def attach(self, on: bool) -> None:
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

    def close(self) -> dict:
        self._stop.set()
        self._pump.join()
        self.reader.drain()
        counters = self.tracer.counters()
        self.reader.close()
        self.tracer.close()
        return counters


def run_phase(args: argparse.Namespace, server: Server, tracer: ToggledTracer, attached: bool) -> dict:
    tracer.attach(attached)
    bpf0 = bpf_program_time(os.getpid())
    cpu0 = proc_cpu_s(server.pid)
    summary, _ = run_client(args, server.port, args.phase_s)
    cpu1 = proc_cpu_s(server.pid)
    bpf1 = bpf_program_time(os.getpid())
    n = summary["completed"]
    return {
        "attached": attached,
        "completed": n,
        "requests_per_s": summary["requests_per_s"],
        "server_cpu_us_per_request": (cpu1 - cpu0) * 1e6 / n if n else None,
        "bpf_us_per_request": (bpf1[0] - bpf0[0]) / 1000 / n if n and args.bpf_stats else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8, help="detached/attached pairs (ABBA order)")
    ap.add_argument("--phase-s", type=float, default=4.0, help="seconds of load per phase")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--interval-ms", type=float, default=0.0)
    ap.add_argument("--bpf-stats", action="store_true",
                    help="also time the BPF programs (kernel.bpf_stats_enabled; adds its own "
                         "clock reads to every run, so it inflates the attached phases a little)")
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
        tracer = ToggledTracer(server.pid)
        run_client(args, server.port, 2.0)  # warm-up, attached
        pairs = []
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            phases = {attached: run_phase(args, server, tracer, attached) for attached in order}
            off, on = phases[False], phases[True]
            pair = {
                "detached": off,
                "attached": on,
                "server_cpu_ratio": on["server_cpu_us_per_request"] / off["server_cpu_us_per_request"],
                "throughput_ratio": on["requests_per_s"] / off["requests_per_s"],
            }
            if args.bpf_stats:
                pair["bpf_share"] = on["bpf_us_per_request"] / off["server_cpu_us_per_request"]
            pairs.append(pair)
            print(f"pair {i + 1}: server CPU/request {off['server_cpu_us_per_request']:.1f} -> "
                  f"{on['server_cpu_us_per_request']:.1f} us (x{pair['server_cpu_ratio']:.3f}), "
                  f"throughput x{pair['throughput_ratio']:.3f}"
                  + (f", BPF {on['bpf_us_per_request']:.2f} us/request" if args.bpf_stats else ""),
                  flush=True)
        tracer.attach(True)
        counters = tracer.close()

    def median(key: str) -> float:
        return statistics.median(p[key] for p in pairs)

    summary = {
        "pairs": len(pairs),
        "server_cpu_per_request_ratio_median": median("server_cpu_ratio"),
        "server_cpu_per_request_ratio_quartiles": statistics.quantiles(
            [p["server_cpu_ratio"] for p in pairs], n=4) if len(pairs) >= 2 else None,
        "throughput_ratio_median": median("throughput_ratio"),
        "events_sent": counters.get("events_sent"),
        "events_lost": counters.get("events_lost"),
    }
    if args.bpf_stats:
        summary["bpf_share_of_detached_server_cpu_median"] = median("bpf_share")
    print()
    quartiles = summary["server_cpu_per_request_ratio_quartiles"]
    print(f"server CPU per request, attached/detached: median "
          f"x{summary['server_cpu_per_request_ratio_median']:.3f}"
          + (f" (quartiles {', '.join(f'{q:.3f}' for q in quartiles)})" if quartiles else ""))
    print(f"throughput, attached/detached: median x{summary['throughput_ratio_median']:.3f}")
    if args.bpf_stats:
        print(f"BPF programs: median {summary['bpf_share_of_detached_server_cpu_median'] * 100:.1f} % "
              "of the detached server CPU per request")
    print(f"events sent {summary['events_sent']}, lost {summary['events_lost']}")
    if args.json is not None:
        args.json.write_text(json.dumps({"config": vars(args) | {"json": str(args.json)},
                                         "pairs": pairs, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
