#!/usr/bin/env python3
"""What the Python frame walk costs per sample and per off-CPU stack, side by side in one run.

A pure-Python burner (tests/programs/python_burn.py, or its --sleeper mode
for off-CPU) runs under one interpreter; the tracer is loaded in this
process with the profile (999 Hz) or offcpu set, in alternating phases:

    rounds x [untraced] [stacks, no Python walk] [stacks with the Python walk]

Printed per phase: the kernel's own statistics of each program
(kernel.bpf_stats_enabled: ns per run, from /proc/self/fdinfo, read with
bench_overhead's program_times_by_id and per_program), the share of
samples that carried Python frames, and the burner's work per wall second
as a ratio to the untraced phases (the BPF program runs on the CPU it
samples, so its cost is taken from the burner).

Usage (root):
    sudo .venv/bin/python benchmarks/bench_python_frames.py [--python /usr/bin/python3]
        [--duration 5] [--rounds 2] [--set profile|offcpu]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT.parent))
from bench_support import bpf_stats_enabled, per_program, program_times_by_id  # noqa: E402

BURNER = ROOT / "tests" / "programs" / "python_burn.py"
PROGRAMS = {"profile": "profile_on_cpu", "offcpu": "offcpu_on_switch"}


def run_phase(args, python: str, walk: bool | None) -> dict:
    from inferprobe.collector.attach.loader import load_tracer

    extra = ["--sleeper"] if args.set == "offcpu" else []
    proc = subprocess.Popen([python, str(BURNER), *extra], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("READY")
    tracer = None
    try:
        if walk is not None:
            tracer = load_tracer([proc.pid], sets=("sockets", args.set),
                                 options={"profile_hz": args.hz, "python_frames": walk})
        before = program_times_by_id(os.getpid())
        rounds0 = _rounds(proc)
        t0 = time.monotonic()
        deadline = t0 + args.duration
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            if tracer is not None:
                tracer.refresh()
        elapsed = time.monotonic() - t0
        rounds = _rounds(proc) - rounds0
        after = program_times_by_id(os.getpid())
        snap = tracer.snapshots()[args.set] if tracer is not None else None
        names = _program_names(tracer.bpf) if tracer is not None else {}
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        if tracer is not None:
            tracer.close()
    row: dict = {"walk": walk, "work_per_s": rounds / elapsed}
    if tracer is not None:
        costs = per_program(before, after, 1)
        program = PROGRAMS[args.set]
        for prog_id, cost in costs.items():
            if names.get(prog_id) == program:
                row["ns_per_run"] = cost["ns_per_run"]
                row["runs"] = cost["runs_per_request"]
        c = snap["counters"] if snap else {}
        # The program runs for every task on every CPU and returns early for
        # the others: its whole time over the target's samples is what one
        # target sample (or switch) costs, early returns included.
        if "ns_per_run" in row and c.get("samples"):
            row["ns_per_target_sample"] = round(row["ns_per_run"] * row["runs"] / c["samples"])
        row["python_share"] = round(c.get("python_stacks", 0) / c["samples"], 3) if c.get("samples") else None
    return row


def _rounds(proc: subprocess.Popen) -> int:
    """The burner's rounds of work (or sleeps) so far, as it reports them on SIGUSR2."""
    proc.send_signal(signal.SIGUSR2)
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the burner exited")
        if line.startswith("rounds="):
            return int(line.split("=")[1])


def _program_names(bpf) -> dict[int, str]:
    """prog_id -> function name of the tracer's loaded programs (the id from each one's fdinfo)."""
    out = {}
    for name, fn in bpf.funcs.items():
        try:
            text = Path(f"/proc/self/fdinfo/{fn.fd}").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("prog_id:"):
                out[int(line.split(":")[1])] = name.decode() if isinstance(name, bytes) else name
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hz", type=int, default=999)
    parser.add_argument("--set", choices=sorted(PROGRAMS), default="profile")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_python_frames: needs root (BPF)", file=sys.stderr)
        return 1
    rows: dict[str, list[dict]] = {"untraced": [], "no walk": [], "walk": []}
    with bpf_stats_enabled():
        for _ in range(args.rounds):
            rows["untraced"].append(run_phase(args, args.python, None))
            rows["no walk"].append(run_phase(args, args.python, False))
            rows["walk"].append(run_phase(args, args.python, True))
    key = "work_per_s"
    base = statistics.mean(r[key] for r in rows["untraced"] if r.get(key))
    print(f"{args.set} at {args.hz} Hz, {args.python}, {args.rounds} x {args.duration:.0f} s phases")
    print(f"{'phase':10} {'ns/run':>8} {'runs':>8} {'ns/target':>10} {'python %':>9} {'rounds/s ratio':>18}")
    summary = {}
    for name, rs in rows.items():
        ns = [r["ns_per_run"] for r in rs if "ns_per_run" in r]
        per_target = [r["ns_per_target_sample"] for r in rs if "ns_per_target_sample" in r]
        runs = [r["runs"] for r in rs if "runs" in r]
        share = [r["python_share"] for r in rs if r.get("python_share") is not None]
        ratio = statistics.mean(r[key] for r in rs if r.get(key)) / base
        summary[name] = {"ns_per_run": round(statistics.mean(ns)) if ns else None,
                         "ns_per_target_sample": round(statistics.mean(per_target)) if per_target else None,
                         "python_share": statistics.mean(share) if share else None, "ratio": round(ratio, 4)}
        runs_text = round(statistics.mean(runs)) if runs else "-"
        share_text = f"{100 * statistics.mean(share):.1f}" if share else "-"
        ns_text = summary[name]["ns_per_run"] or "-"
        target_text = summary[name]["ns_per_target_sample"] or "-"
        print(f"{name:10} {ns_text:>8} {runs_text:>8} {target_text:>10} {share_text:>9} {ratio:>18.4f}")
    walk_ns, none_ns = summary["walk"]["ns_per_target_sample"], summary["no walk"]["ns_per_target_sample"]
    if walk_ns and none_ns:
        what = "sample" if args.set == "profile" else "switch-out"
        print(f"the walk adds {walk_ns - none_ns} ns per target {what} (kernel statistics)")
    print(json.dumps({"summary": summary, "rounds": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
