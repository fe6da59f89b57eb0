#!/usr/bin/env python3
"""Uprobe cost per CUDA launch: one launch-heavy process, untraced and traced, side by side.

A worker process loads the real libcudart (nvidia-cuda-runtime wheel) and
runs decode-like steps through ctypes: L x cudaLaunchKernel, then one
cudaStreamSynchronize. Without a GPU each call fails fast inside the
library, so the loop is as launch-dense as a Python loop can be, and the
probes' cost is a large, easy-to-see share of it (on a real GPU a launch
itself costs a few µs, so the ratio there is smaller; the added ns per
launch is what carries over).

Phases, in one run, on the same worker process, alternating:

    [untraced] [traced, launches summed in the kernel (--gpu-launch-run 256)]
    [untraced] [traced, one event per launch (--gpu-launch-run 1)]   x rounds

Each traced phase attaches `inferprobe record -p <worker>` first (compile
and attach time not measured) and stops it after. Reported: ns per launch
(median over rounds), traced/untraced ratios and the ns each launch gained,
plus what the recorder received and lost.

Usage (root): sudo .venv/bin/python benchmarks/bench_gpu_launch.py [--steps 2000]
    [--launches 50] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import PY, REPO  # noqa: E402

WORKER = r"""
import ctypes, sys, time
from pathlib import Path
import nvidia.cuda_runtime
lib = ctypes.CDLL(str(Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib" / "libcudart.so.12"))
class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
launch = lib.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
sync = lib.cudaStreamSynchronize
sync.argtypes = [ctypes.c_void_p]
grid, block, kernel = Dim3(1, 1, 1), Dim3(32, 1, 1), ctypes.c_void_p(0x1234)
print("READY", flush=True)
for line in sys.stdin:
    steps, launches = map(int, line.split())
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        for _ in range(launches):
            launch(kernel, grid, block, None, 0, None)
        sync(None)
    print(time.perf_counter_ns() - t0, flush=True)
"""


class Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([PY, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout.readline().strip() == "READY"

    def run(self, steps: int, launches: int) -> float:
        """ns per launch (the step's one sync included)."""
        self.proc.stdin.write(f"{steps} {launches}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline()) / (steps * launches)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def traced(worker: Worker, run_max: int, steps: int, launches: int, out: Path) -> tuple[float, dict]:
    rec = subprocess.Popen([PY, "-m", "inferprobe.cli.main", "record", "-p", str(worker.proc.pid),
                            "--no-listen-check", "--gpu-launch-run", str(run_max), "-o", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = rec.stdout.readline()
        if not line:
            raise SystemExit(f"recorder failed: {rec.stderr.read()}")
        if line.startswith("inferprobe: attached"):
            break
    ns = worker.run(steps, launches)
    rec.terminate()
    stdout, _ = rec.communicate(timeout=120)
    m = re.search(r"(\d+) events, (\d+) lost", stdout)
    return ns, {"events": int(m.group(1)), "lost": int(m.group(2))} if m else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--launches", type=int, default=50, help="launches per step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    worker = Worker()
    results: dict[str, list[float]] = {"untraced": [], "summed": [], "every_launch": []}
    received: dict[str, list[dict]] = {"summed": [], "every_launch": []}
    try:
        worker.run(args.steps // 4, args.launches)  # warm-up
        with tempfile.TemporaryDirectory() as tmp:
            for rnd in range(args.rounds):
                for mode, run_max in (("summed", 256), ("every_launch", 1)):
                    results["untraced"].append(worker.run(args.steps, args.launches))
                    out = Path(tmp) / f"{mode}{rnd}.ipr"
                    ns, got = traced(worker, run_max, args.steps, args.launches, out)
                    results[mode].append(ns)
                    received[mode].append(got)
    finally:
        worker.close()
    base = statistics.median(results["untraced"])
    launches = args.steps * args.launches
    report = {"launches_per_phase": launches, "launches_per_step": args.launches,
              "untraced_ns_per_launch": base, "modes": {}}
    print(f"{launches} launches per phase ({args.launches} per step + 1 sync), medians of "
          f"{args.rounds} rounds; untraced {base:.0f} ns/launch")
    for mode in ("summed", "every_launch"):
        ns = statistics.median(results[mode])
        events = statistics.median(r.get("events", 0) for r in received[mode])
        lost = max(r.get("lost", 0) for r in received[mode])
        report["modes"][mode] = {"ns_per_launch": ns, "ratio": ns / base, "added_ns_per_launch": ns - base,
                                 "events_per_phase": events, "lost_max": lost}
        print(f"  traced, {mode:13s}: {ns:7.0f} ns/launch  ratio {ns / base:5.2f}  "
              f"+{ns - base:6.0f} ns/launch  events {events:.0f} (lost {lost})")
    if args.json:
        args.json.write_text(json.dumps({"raw": results, "received": received, **report}, indent=1))


if __name__ == "__main__":
    main()
