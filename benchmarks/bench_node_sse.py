#!/usr/bin/env python3
"""A Node SSE server at saturation, untraced and traced, side by side.

benchmarks/native/node_sse.js serves token streams with Node's http module:
each chunk of a chunked text/event-stream response is a writev() of four
iovecs (size, CRLF, data, CRLF), the write shape of Node, and much like
hyper's, that costs a tracer the most. `wrk` drives it with keep-alive
connections as fast as it answers, in alternating phases:

    warm-up, then N rounds of: [untraced D s] [traced D s]

A traced phase attaches `inferprobe record -p <node>` first (start-up is
not measured), runs the same load, stops the recorder and reads its
recording: every request wrk completed must be in it, and no event lost.
With kernel.bpf_stats_enabled the kernel also times every run of the
recorder's programs: BPF ns per request, per program as well where
bpftool can name them. The ratio to look at is traced/untraced requests
per second of the same round.

With --tls the server speaks HTTPS (Node's https module over the OpenSSL
linked into node, a certificate made for the run) and wrk drives it over
TLS: the recorder then reads the plaintext with uprobes on SSL_read and
SSL_write (docs/tls.md), and the kernel statistics name the TLS programs'
cost per call beside the syscall programs'.

    sudo .venv/bin/python benchmarks/bench_node_sse.py [--duration 10] [--rounds 3]
        [--connections 32] [--tokens 8] [--tls] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_support import REPO, EmptyPrograms, proc_cpu_s, read_report, stop_process, traced_run

SERVER = REPO / "benchmarks" / "native" / "node_sse.js"


def self_signed(directory: Path) -> dict[str, str]:
    """A key and certificate for the run (the openssl tool), as node_sse.js's environment."""
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=bench", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return {"TLS_CERT": str(cert), "TLS_KEY": str(key)}


def run_wrk(port: int, args: argparse.Namespace, server_pid: int | None = None) -> dict:
    """One load phase; with server_pid, the server's CPU time per request too."""
    cpu0 = proc_cpu_s(server_pid) if server_pid else 0.0
    res = subprocess.run(
        ["wrk", "-t1", f"-c{args.connections}", f"-d{args.duration}s",
         f"{'https' if args.tls else 'http'}://127.0.0.1:{port}/stream"],
        capture_output=True, text=True, timeout=args.duration + 60,
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"wrk failed ({res.returncode}): {res.stderr}")
    done = re.search(r"(\d+) requests in", res.stdout)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", res.stdout)
    errors = re.search(r"Socket errors: (.*)", res.stdout)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", res.stdout)
    if not done or not rate:
        raise RuntimeError(f"unexpected wrk output: {res.stdout}")
    if non_2xx:
        raise RuntimeError(f"wrk saw {non_2xx.group(1)} failed responses")
    out = {"requests": int(done.group(1)), "requests_per_s": float(rate.group(1)),
           "socket_errors": errors.group(1) if errors else None}
    if server_pid:
        out["server_cpu_us_per_request"] = round((proc_cpu_s(server_pid) - cpu0) * 1e6 / out["requests"], 1)
    return out


def empty_phase(pid: int, port: int, args: argparse.Namespace) -> dict:
    """Do-nothing programs on the socket syscall tracepoints: what attaching
    costs whatever the programs do."""
    empty = EmptyPrograms()
    try:
        return run_wrk(port, args, pid)
    finally:
        empty.stop()


def traced_phase(pid: int, port: int, args: argparse.Namespace, workdir: Path, rnd: int,
                 stats: bool = False) -> dict:
    """One recorded phase. With `stats`, the kernel times the programs (which
    costs a little of its own: throughput is measured without)."""
    out = workdir / f"r{rnd}.ipr"
    load = traced_run(pid, out, workdir / f"r{rnd}.err", lambda: run_wrk(port, args, pid), "requests", stats)
    report = read_report(out)
    recorded = report["requests"]
    # complete, with every token chunk (wrk's last requests may be cut off by its stop)
    complete = sum(1 for r in recorded if r["outcome"] == "complete" and r["status"] == 200
                   and len(r["token_ns"]) == args.tokens)
    total_ns = load.pop("bpf_ns_total", None)
    return {**load, "recorded": len(recorded), "recorded_complete": complete,
            "lost_events": report.get("lost_events"),
            "bpf_ns_per_request": round(total_ns / load["requests"]) if total_ns is not None else None,
            "programs": load.get("programs", {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=8, help="token chunks per response")
    ap.add_argument("--tls", action="store_true", help="serve and drive over HTTPS")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    for tool in ("node", "wrk"):
        if shutil.which(tool) is None:
            sys.exit(f"bench_node_sse: needs {tool} (apt install nodejs wrk)")
    certificate = tempfile.TemporaryDirectory()
    tls_env = self_signed(Path(certificate.name)) if args.tls else {}
    env = {**os.environ, "TOKENS": str(args.tokens), **tls_env}
    server = subprocess.Popen(["node", str(SERVER)], stdout=subprocess.PIPE, text=True, env=env)
    rounds: list[dict] = []
    stats: dict = {}
    try:
        line = server.stdout.readline()
        if not line.startswith("LISTENING"):
            raise RuntimeError(f"node server did not start: {line!r}")
        port = int(line.split()[1])
        run_wrk(port, argparse.Namespace(**{**vars(args), "duration": 2}))  # warm-up: JIT, connections
        with tempfile.TemporaryDirectory() as tmp:
            for rnd in range(args.rounds):
                untraced = run_wrk(port, args, server.pid)
                empty = empty_phase(server.pid, port, args)
                traced = traced_phase(server.pid, port, args, Path(tmp), rnd)
                ratio = traced["requests_per_s"] / untraced["requests_per_s"]
                floor = empty["requests_per_s"] / untraced["requests_per_s"]
                rounds.append({"untraced": untraced, "empty_programs": empty, "traced": traced,
                               "ratio": round(ratio, 3), "empty_programs_ratio": round(floor, 3)})
                print(f"round {rnd + 1}: {untraced['requests_per_s']:.0f} requests/s untraced, "
                      f"{empty['requests_per_s']:.0f} with do-nothing programs (x{floor:.3f}), "
                      f"{traced['requests_per_s']:.0f} traced (x{ratio:.3f}); wrk completed "
                      f"{traced['requests']}, recorded {traced['recorded']} ({traced['recorded_complete']} "
                      f"complete), {traced['lost_events']} events lost; server CPU per request "
                      f"{untraced['server_cpu_us_per_request']} / {empty['server_cpu_us_per_request']} / "
                      f"{traced['server_cpu_us_per_request']} us, recorder "
                      f"{traced['recorder_cpu_us_per_request']} us", flush=True)
            stats = traced_phase(server.pid, port, args, Path(tmp), args.rounds, stats=True)
            top = ", ".join(f"{name} {p['ns_per_run']} ns x{p['runs_per_request']}"
                            for name, p in list(stats["programs"].items())[:6])
            print(f"kernel statistics (one more traced phase, kernel.bpf_stats_enabled): "
                  f"{stats['bpf_ns_per_request']} ns of BPF per request: {top}")
    finally:
        stop_process(server, 5)
        certificate.cleanup()
    ratios = [r["ratio"] for r in rounds]
    summary = {"ratio_mean": round(statistics.mean(ratios), 3), "ratios": ratios,
               "empty_programs_ratios": [r["empty_programs_ratio"] for r in rounds],
               "bpf_ns_per_request": stats["bpf_ns_per_request"], "programs": stats["programs"],
               "lost_events": sum(r["traced"]["lost_events"] or 0 for r in rounds),
               "missing_requests": sum(max(0, r["traced"]["requests"] - r["traced"]["recorded_complete"])
                                       for r in rounds),
               "rounds": rounds}
    transport = "TLS (https): " if args.tls else ""
    print(f"{transport}traced/untraced requests/s: mean x{summary['ratio_mean']:.3f} "
          f"over {len(ratios)} rounds "
          f"({', '.join(f'{r:.3f}' for r in ratios)}); {summary['lost_events']} events lost; "
          f"{summary['missing_requests']} completed requests missing from the recordings")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
