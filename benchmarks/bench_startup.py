#!/usr/bin/env python3
"""What `inferprobe record` costs before its first event, and to stop.

For each probe-set configuration, ROUNDS times, interleaved: start the test SSE
server (idle), run `inferprobe record -p PID`, and measure from the recorder's
spawn to its "inferprobe: attached" line (wall), the recorder's own split of
that wait (the recording's startup_s; the
rest is Python start-up and the engine /metrics probe), its peak resident size
(VmHWM), the time from SIGTERM to a written recording and the recorder's
exit ("stop"), and to the last of its BPF programs unloaded by the kernel
("detached": a child finishes that after the recorder has exited,
collector/attach/detach_on_exit.py). The stages are
prepare / verify / attach since the move to libbpf (issue 36), and were
prepare / compile_and_verify / load_and_attach with bcc: a baseline tree from
before shows its own, and "build+verify" is the verifier's share either way
(with bcc's compile in it).

Between runs the bench waits --settle seconds (3 by default): a recorder started
within ~2 s of another's stop spends 0.6-1.8 s in its attach stage against
0.04 s, though no process of the last one is left (most likely the RCU grace
period the kernel owes a tracepoint re-attached soon after its last probe
went: tracepoint_add_func's cond_synchronize_rcu). --settle 0 measures
back-to-back starts.

--baseline DIR runs the recorder of another checkout too (e.g. `git worktree add
/tmp/base <commit>`), interleaved with this one, config by config: the same
host, the same moments, the same server, so the two are compared in one run.
DIR's folders are imported as inferprobe.<part> through a link tree on
PYTHONPATH, ahead of this checkout's editable install; its BPF objects, if it
has any, must be built (scripts/build_bpf.sh in DIR).

Usage (root): .venv/bin/python benchmarks/bench_startup.py [--rounds 3] [--config defaults ...]
              [--baseline DIR] [--settle SECONDS]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import Recorder, Server, baseline_env, proc_status_kb  # noqa: E402

CONFIGS = {
    "defaults": (),
    "every-set": ("--locks", "--network", "--profile", "--offcpu"),
    "locks+network": ("--locks", "--network"),
    "locks+profile": ("--locks", "--profile"),
    "profile+offcpu": ("--profile", "--offcpu"),
}


def one_start(extra: tuple[str, ...], tmp: Path, name: str, env: dict[str, str] | None = None) -> dict:
    from inferprobe.collector.model.recording import read_recording

    server = Server(log=None)
    try:
        output = tmp / f"{name}.ipr"
        rec = Recorder(server.pid, output, tmp / f"{name}.stderr", extra, env=env)
        peak_kb = proc_status_kb(rec.proc.pid, "VmHWM")
        stop_s = rec.stop()
    finally:
        server.stop()
    stages = read_recording(output).meta.get("startup_s", {})
    return {"attach_s": rec.attach_s, "stop_s": stop_s, "detached_s": rec.detached_s,
            "peak_mb": (peak_kb or 0) / 1024, **stages}


# The stage that compiles (bcc) or verifies (libbpf), and the one after it, by either naming.
VERIFY_STAGE = {"verify": "verify", "compile_and_verify": "verify"}
AFTER_STAGE = {"attach": "attach", "load_and_attach": "attach"}


def summarize(runs: list[dict]) -> dict:
    runs = [{**{VERIFY_STAGE.get(k, AFTER_STAGE.get(k, k)): v for k, v in r.items()}} for r in runs]
    keys = ("attach_s", "prepare", "verify", "attach", "stop_s", "detached_s", "peak_mb")
    out = {k: statistics.median(r[k] for r in runs) for k in keys if all(k in r for r in runs)}
    out["range_attach_s"] = (min(r["attach_s"] for r in runs), max(r["attach_s"] for r in runs))
    if "verify" in out:
        out["verify_share"] = out["verify"] / out["attach_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", action="append", choices=sorted(CONFIGS),
                    help="a configuration to measure (repeatable; default: all)")
    ap.add_argument("--baseline", type=Path, help="another checkout to measure beside this one")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds between runs, for the kernel's grace periods owed by the last detach")
    args = ap.parse_args()
    configs = args.config or list(CONFIGS)
    with tempfile.TemporaryDirectory() as tmp:
        trees: dict[str, dict[str, str] | None] = {"": None}
        if args.baseline:
            trees = {"": None, " (baseline)": baseline_env(args.baseline.resolve(), Path(tmp))}
        rows = [config + label for config in configs for label in trees]
        runs: dict[str, list[dict]] = {row: [] for row in rows}
        for r in range(args.rounds):
            for config in configs:  # interleaved, so a slow moment of the host hits every one
                for label, env in trees.items():
                    row = config + label
                    name = f"{config}-{r}{label.strip()}"
                    time.sleep(args.settle)
                    runs[row].append(one_start(CONFIGS[config], Path(tmp), name, env))
                    print(f"round {r + 1} {row}: {runs[row][-1]}", flush=True)
    configs = rows
    print(f"\nmedians of {args.rounds} round(s), idle test server, seconds unless said:")
    print(f"{'config':<26} {'to attached':>12} {'range':>13} {'prepare':>8} {'build+verify':>12} "
          f"{'attach':>8} {'share':>6} {'stop':>6} {'detached':>9} {'peak RSS':>9}")
    for config in configs:
        s = summarize(runs[config])
        lo, hi = s["range_attach_s"]
        print(f"{config:<26} {s['attach_s']:>12.2f} {f'{lo:.2f}-{hi:.2f}':>13} {s.get('prepare', 0):>8.2f} "
              f"{s.get('verify', 0):>12.2f} {s.get('attach', 0):>8.2f} "
              f"{100 * s.get('verify_share', 0):>5.0f}% {s['stop_s']:>6.2f} {s['detached_s']:>9.2f} "
              f"{s['peak_mb']:>6.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
