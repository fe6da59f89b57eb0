#!/usr/bin/env python3
"""A grpcio token-streaming server at saturation, untraced and traced, side by side.

tests/servers/grpc_token_server.py streams --tokens messages per call with no
pause; a grpcio client process keeps --concurrency streaming calls in flight
on one channel (one HTTP/2 connection, multiplexed) for --duration seconds:

    warm-up, then N rounds of: [untraced D s] [traced D s]

A traced phase attaches `inferprobe record -p <server>` first (start-up is
not measured), stops it after the load and reads the recording: every call
the client completed must be in it with all its messages, and no event
lost. One more traced phase with kernel.bpf_stats_enabled books the
kernel's own time per program: the HTTP/2 frame walk (h2_frames) per run
and per call, beside the syscall programs. The ratio to look at is
traced/untraced calls per second of the same round; the server's CPU per
call says what the tracer cost it.

    sudo .venv/bin/python benchmarks/bench_grpc_stream.py [--duration 8] [--rounds 3]
        [--concurrency 8] [--tokens 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from bench_support import REPO, proc_cpu_s, read_report, stop_process, traced_run

SERVER = REPO / "tests" / "servers" / "grpc_token_server.py"

# The load: streaming calls kept in flight for a while; prints the calls it completed.
LOAD = textwrap.dedent("""
    import json, sys, threading, time, grpc
    port, seconds, concurrency, tokens = (int(a) for a in sys.argv[1:5])
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=10)
    stream = channel.unary_stream("/llm.Generator/Stream")
    ask = json.dumps({"tokens": tokens, "gap_ms": 0, "first_delay_ms": 0}).encode()
    done, end = [0] * concurrency, time.monotonic() + seconds
    def worker(i):
        while time.monotonic() < end:
            if sum(1 for _ in stream(ask, timeout=30)) == tokens:
                done[i] += 1
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(sum(done))
""")


def run_load(port: int, args: argparse.Namespace, server_pid: int) -> dict:
    cpu0 = proc_cpu_s(server_pid)
    out = subprocess.run([sys.executable, "-c", LOAD, str(port), str(args.duration), str(args.concurrency),
                          str(args.tokens)], capture_output=True, text=True, check=True,
                         timeout=args.duration + 60)
    calls = int(out.stdout.strip())
    cpu = proc_cpu_s(server_pid) - cpu0
    return {"calls": calls, "calls_per_s": calls / args.duration,
            "server_cpu_us_per_call": round(cpu * 1e6 / max(calls, 1), 1)}


def traced_phase(pid: int, port: int, args: argparse.Namespace, workdir: Path, rnd: int,
                 stats: bool = False) -> dict:
    out = workdir / f"r{rnd}.ipr"
    result = traced_run(pid, out, workdir / f"r{rnd}.err", lambda: run_load(port, args, pid), "calls", stats)
    report = read_report(out)
    result["recorded_whole"] = sum(1 for r in report["requests"] if r["outcome"] == "complete"
                                   and sum(r["token_chunk_events"]) == args.tokens)
    result["lost_events"] = report.get("lost_events")
    if stats:
        result["bpf_ns_per_call"] = round(result.pop("bpf_ns_total") / max(result["calls"], 1))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=int, default=8, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8, help="streaming calls in flight")
    ap.add_argument("--tokens", type=int, default=16, help="messages per call")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    server = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True)
    rounds: list[dict] = []
    try:
        port = int(server.stdout.readline().split()[1])
        run_load(port, argparse.Namespace(**{**vars(args), "duration": 2}), server.pid)  # warm-up
        with tempfile.TemporaryDirectory() as tmp:
            for rnd in range(args.rounds):
                untraced = run_load(port, args, server.pid)
                traced = traced_phase(server.pid, port, args, Path(tmp), rnd)
                ratio = traced["calls_per_s"] / untraced["calls_per_s"]
                rounds.append({"untraced": untraced, "traced": traced, "ratio": round(ratio, 3)})
                print(f"round {rnd + 1}: {untraced['calls_per_s']:.0f} calls/s untraced, "
                      f"{traced['calls_per_s']:.0f} traced (x{ratio:.3f}); the client completed "
                      f"{traced['calls']}, recorded whole {traced['recorded_whole']}, "
                      f"{traced['lost_events']} events lost; server CPU per call "
                      f"{untraced['server_cpu_us_per_call']} / {traced['server_cpu_us_per_call']} us, "
                      f"recorder {traced['recorder_cpu_us_per_call']} us", flush=True)
            stats = traced_phase(server.pid, port, args, Path(tmp), args.rounds, stats=True)
            top = ", ".join(f"{name} {p['ns_per_run']} ns x{p['runs_per_request']}"
                            for name, p in list(stats["programs"].items())[:6])
            print(f"kernel statistics (one more traced phase, kernel.bpf_stats_enabled): "
                  f"{stats['bpf_ns_per_call']} ns of BPF per call of {args.tokens} messages: {top}")
    finally:
        stop_process(server, 5)
    ratios = [r["ratio"] for r in rounds]
    summary = {"ratio_mean": round(statistics.mean(ratios), 3), "ratios": ratios,
               "bpf_ns_per_call": stats["bpf_ns_per_call"], "programs": stats["programs"],
               "lost_events": sum(r["traced"]["lost_events"] or 0 for r in rounds),
               "missing_calls": sum(max(0, r["traced"]["calls"] - r["traced"]["recorded_whole"])
                                    for r in rounds)}
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
