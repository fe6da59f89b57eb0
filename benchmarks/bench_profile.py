#!/usr/bin/env python3
"""On-CPU sampling overhead at 49, 99 and 999 Hz, and flame graph render time.

Part 1, overhead: one test streaming server (tests/servers/sse_server.py;
the demo server is built elsewhere) driven by closed-loop load in
alternating phases, all in one run:

    rounds x [untraced] [record (sockets only)] [record --profile at 49, 99, 999 Hz]

Each traced phase attaches first (compile time not measured), runs the same
load, then stops the recorder. Printed as ratios to the untraced phases of
the same run: throughput, p99 inter-token latency, and server CPU per
request (the BPF program runs on the CPU it samples, so its cost shows as
server CPU).

Part 2, render: a synthetic 100k-sample profile whose frames are real
function addresses of this Python process's own libraries (so
symbolisation reads real ELF files), timed through symbolise -> fold -> SVG
and speedscope.

Usage (root for part 1):
    sudo .venv/bin/python benchmarks/bench_profile.py [--duration 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import PY, Server, proc_cpu_s, run_client  # noqa: E402

RATES = (49, 99, 999)


def run_phase(args, server: Server, workdir: Path, name: str, record_flags: list[str] | None) -> dict:
    rec = None
    if record_flags is not None:
        out = workdir / f"{name}.ipr"
        rec = subprocess.Popen(
            [PY, "-m", "inferprobe.cli.main", "record", "-p", str(server.pid), "-o", str(out),
             *record_flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        while True:
            line = rec.stdout.readline()
            if not line:
                raise RuntimeError(f"recorder for {name} did not attach")
            if line.startswith("inferprobe: attached"):
                break
    try:
        s0 = proc_cpu_s(server.pid)
        summary, _client_cpu = run_client(args, server.port, args.duration)
        s1 = proc_cpu_s(server.pid)
    finally:
        if rec is not None:
            rec.terminate()
            rec.communicate(timeout=120)
    samples = None
    if record_flags and "--profile" in record_flags:
        from inferprobe.collector.model.recording import read_recording

        samples = read_recording(workdir / f"{name}.ipr").snapshots["profile"]["counters"]["samples"]
    return {
        "mode": name,
        "rps": summary["requests_per_s"],
        "itl_p99": summary["itl_ms_p99"],
        "cpu_per_req_ms": 1000 * (s1 - s0) / max(1, summary["completed"]),
        "samples": samples,
    }


def overhead(args) -> dict:
    modes: list[tuple[str, list[str] | None]] = [("untraced", None), ("sockets", [])]
    modes += [(f"profile-{hz}Hz", ["--profile", "--profile-hz", str(hz)]) for hz in RATES]
    results: dict[str, list[dict]] = {name: [] for name, _ in modes}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(None)
        try:
            run_client(args, server.port, 2)  # warm-up
            for rnd in range(args.rounds):
                for name, flags in modes:
                    phase = run_phase(args, server, Path(tmp), f"{name}-{rnd}", flags)
                    results[name].append(phase)
                    print(f"round {rnd} {name:>16}: {phase['rps']:8.1f} req/s  "
                          f"itl p99 {phase['itl_p99']} ms  server CPU/req {phase['cpu_per_req_ms']:.3f} ms"
                          + (f"  samples {phase['samples']}" if phase["samples"] is not None else ""),
                          flush=True)
        finally:
            server.stop()
    keys = ("rps", "itl_p99", "cpu_per_req_ms")
    base = {k: statistics.mean(p[k] for p in results["untraced"]) for k in keys}
    table = {}
    for name, phases in results.items():
        if name == "untraced":
            continue
        table[name] = {k: round(statistics.mean(p[k] for p in phases) / base[k], 3) for k in base}
    print("\ntraced / untraced (mean of rounds; same server, same run)")
    print(f"{'mode':>16}  {'throughput':>10}  {'p99 ITL':>8}  {'server CPU/request':>18}")
    for name, r in table.items():
        print(f"{name:>16}  {r['rps']:>10.3f}  {r['itl_p99']:>8.3f}  {r['cpu_per_req_ms']:>18.3f}")
    return table


def render_timing(n_samples: int = 100_000, distinct: int = 5000) -> dict:
    from inferprobe.analyzers import stack_fold as fold
    from inferprobe.collector.binaries.symbolizer import Symbolizer
    from inferprobe.flamegraphs import speedscope, svg

    sym = Symbolizer()
    pid = os.getpid()
    sym.remember_process(pid)
    info = sym.processes[pid]
    # real function addresses from the ELF files this process maps
    addrs = []
    for m in info.maps:
        if not m.is_file:
            continue
        elf = sym._table_for(pid, m)
        if elf is None:
            continue
        table = elf.name_table
        for a in table.addrs[:: max(1, len(table.addrs) // 400)]:
            for p_offset, p_filesz, p_vaddr, _memsz in elf.segments:
                if p_vaddr <= a < p_vaddr + p_filesz:
                    addr = a - p_vaddr + p_offset - m.offset + m.start
                    if m.start <= addr < m.end:
                        addrs.append(addr)
    rng = random.Random(1)
    raw_stacks = []
    for _ in range(distinct):
        raw_stacks.append([rng.choice(addrs) for _ in range(rng.randint(5, 40))])
    weights = [1] * distinct
    for _ in range(n_samples - distinct):
        weights[int(rng.paretovariate(1.2)) % distinct] += 1
    cold = Symbolizer()  # a fresh cache: ELF tables read again
    t0 = time.perf_counter()
    cold.remember_process(pid)
    stacks: fold.Stacks = {}
    for addr_list, w in zip(raw_stacks, weights, strict=True):
        key = ("bench",) + tuple(cold.user_stack(pid, addr_list))
        stacks[key] = stacks.get(key, 0) + w
    t1 = time.perf_counter()
    text = svg.render(stacks, "100k-sample benchmark profile")
    t2 = time.perf_counter()
    speedscope.dumps(stacks, "bench")
    t3 = time.perf_counter()
    timing = {
        "samples": fold.total(stacks),
        "distinct_stacks": len(stacks),
        "distinct_addresses": len({a for s in raw_stacks for a in s}),
        "symbolize_s": round(t1 - t0, 3),
        "svg_s": round(t2 - t1, 3),
        "svg_bytes": len(text),
        "speedscope_s": round(t3 - t2, 3),
    }
    print("\nrender of a 100k-sample profile:", json.dumps(timing))
    return timing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = {"render": render_timing()}
    if not args.render_only:
        result["overhead"] = overhead(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
