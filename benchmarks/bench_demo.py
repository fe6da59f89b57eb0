#!/usr/bin/env python3
"""Tracer overhead on the demo inference server (the real model), traced vs untraced.

One demo server process (`inferprobe demo --port 0`, SmolLM2 on CPU) runs for
the whole benchmark. The load client (`inferprobe demo --load N`, its own
process per phase) keeps N streaming completions in flight. For each tracer
configuration, each round runs an untraced phase and then a traced phase of
the same length on the same server::

    warm-up, then R rounds of: for each config: [untraced D s] [traced D s]

so every traced phase has an untraced neighbour measured a few seconds
earlier; the ratios pair them. Configurations: the default probe sets,
``--locks``, and ``--profile --profile-hz 99``. Attach (BPF compile) time is
not measured; the recorder is stopped after the client's phase ended.

Measured per phase, by the client: tokens/s, p50 TTFT, p99 ITL; server CPU
per 1k tokens (the BPF programs run in the server's own threads, so their
cost is server CPU).

Usage (needs root)::

    sudo .venv/bin/python benchmarks/bench_demo.py [--duration 20] [--rounds 2]
        [--streams 4] [--max-tokens 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The /proc readers, the recorder wrapper and the report reader are the test-server benchmark's.
from bench_support import (  # noqa: E402
    PY,
    Recorder,
    box_cpu,
    fmt,
    proc_cpu_s,
    raise_interrupt,
    read_report,
    stop_process,
)

CONFIGS: dict[str, tuple[str, ...]] = {
    "default": (),
    "locks": ("--locks",),
    "profile99": ("--profile", "--profile-hz", "99"),
}
START_TIMEOUT_S = 300.0  # a cold model load on 2 busy cores


class DemoServer:
    def __init__(self, log: Path) -> None:
        self._log = open(log, "w", encoding="utf-8")  # noqa: SIM115
        self.log = log
        self.proc = subprocess.Popen(
            [PY, "-m", "inferprobe.cli.main", "demo", "--port", "0"],
            stdout=subprocess.PIPE, stderr=self._log, text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        line = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            if select.select([self.proc.stdout], [], [], 1.0)[0]:
                line = self.proc.stdout.readline()
                if line.startswith("inferprobe demo: serving"):
                    break
        if not line.startswith("inferprobe demo: serving"):
            self.stop()
            raise RuntimeError(f"demo server did not start: {log.read_text()[-2000:]}")
        self.url = "http://" + line.split("http://", 1)[1].split()[0]
        self.pid = self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)
        self._log.close()


def run_load(args: argparse.Namespace, url: str, duration: float, out: Path) -> dict:
    """One closed-loop phase in its own process; the client's summary."""
    cmd = [PY, "-m", "inferprobe.cli.main", "demo", "--load", str(args.streams),
           "--duration", str(duration), "--max-tokens", str(args.max_tokens),
           "--url", url, "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if res.returncode != 0:
        raise RuntimeError(f"load client failed ({res.returncode}): {res.stderr}")
    return json.loads(out.read_text())["summary"]


def run_phase(args, server: DemoServer, workdir: Path, rnd: int, config: str, traced: bool) -> dict:
    tag = f"r{rnd}-{config}-{'traced' if traced else 'untraced'}"
    rec = None
    if traced:
        rec = Recorder(server.pid, workdir / f"{tag}.ipr", workdir / f"{tag}.err", CONFIGS[config])
    try:
        s0, b0 = proc_cpu_s(server.pid), box_cpu()
        client = run_load(args, server.url, args.duration, workdir / f"{tag}.client.json")
        s1, b1 = proc_cpu_s(server.pid), box_cpu()
        phase = {
            "round": rnd, "config": config, "mode": "traced" if traced else "untraced",
            "client": client,
            "server_cpu_s": round(s1 - s0, 3),
            "box_busy_pct": round(100.0 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1]), 1),
        }
        if rec is not None:
            cpu, _hwm = rec.sample_before_stop()
            rec.stop()
            report = read_report(rec.output)
            phase["tracer"] = {"cpu_s": round(cpu, 3), "lost_events": report.get("lost_events"),
                               "requests": (report.get("summary") or {}).get("requests")}
            rec = None
        return phase
    finally:
        if rec is not None:
            rec.kill()


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cpu_per_1k_tokens(p: dict) -> float | None:
    toks = p["client"]["tokens"]
    return 1e6 * p["server_cpu_s"] / toks if toks else None


def summarize(phases: list[dict]) -> dict:
    """Per config: traced/untraced ratios, per round (paired neighbours) and pooled."""
    out = {}
    for config in CONFIGS:
        ps = [p for p in phases if p["config"] == config]
        un = [p for p in ps if p["mode"] == "untraced"]
        tr = [p for p in ps if p["mode"] == "traced"]

        def pooled(group: list[dict]) -> dict:
            wall = sum(p["client"]["wall_s"] for p in group)
            toks = sum(p["client"]["tokens"] for p in group)

            def mean(key: str) -> float | None:
                vals = [p["client"][key] for p in group if p["client"][key] is not None]
                return statistics.fmean(vals) if vals else None

            return {"tokens_per_s": toks / wall if wall else None,
                    "ttft_ms_p50": mean("ttft_ms_p50"), "itl_ms_p99": mean("itl_ms_p99"),
                    "server_cpu_ms_per_1k_tokens":
                        1e6 * sum(p["server_cpu_s"] for p in group) / toks if toks else None}

        u, t = pooled(un), pooled(tr)
        out[config] = {
            "untraced": u, "traced": t,
            "ratios": {k: _ratio(t[k], u[k]) for k in u},
            "per_round": [{"round": a["round"],
                           "tokens_per_s": _ratio(b["client"]["tokens_per_s"], a["client"]["tokens_per_s"]),
                           "ttft_ms_p50": _ratio(b["client"]["ttft_ms_p50"], a["client"]["ttft_ms_p50"]),
                           "itl_ms_p99": _ratio(b["client"]["itl_ms_p99"], a["client"]["itl_ms_p99"])}
                          for a, b in zip(un, tr, strict=False)],
            "lost_events": sum(p["tracer"]["lost_events"] or 0 for p in tr),
        }
    return out


def print_phases(phases: list[dict]) -> None:
    print(f"{'rnd':>3} {'config':<10} {'mode':<8} {'tok/s':>7} {'TTFTp50':>8} {'ITLp99':>7} "
          f"{'srvCPU/1ktok':>12} {'box%':>5} {'req cli/trc':>11} {'lost':>5}")
    for p in phases:
        c, t = p["client"], p.get("tracer")
        reqs = f"{c['completed']}/{t['requests'] if t else '-'}"
        print(f"{p['round']:>3} {p['config']:<10} {p['mode']:<8} {c['tokens_per_s']:>7.1f} "
              f"{fmt(c['ttft_ms_p50'], '.1f'):>8} {fmt(c['itl_ms_p99'], '.1f'):>7} "
              f"{fmt(cpu_per_1k_tokens(p), '.0f'):>12} {p['box_busy_pct']:>5.1f} {reqs:>11} "
              f"{fmt(t['lost_events'] if t else None, 'd'):>5}")


def print_summary(s: dict) -> None:
    def pct(r: float | None) -> str:
        return "-" if r is None else f"{(r - 1) * 100:+.1f} %"

    print()
    print("traced/untraced (pooled over rounds; per-round pairs in brackets):")
    print(f"{'config':<10} {'tokens/s':>22} {'p50 TTFT':>22} {'p99 ITL':>22} {'srvCPU/tok':>10}")
    for config, v in s.items():
        cells = [f"{pct(v['ratios'][key])} [{','.join(fmt(x[key], '.2f') for x in v['per_round'])}]"
                 for key in ("tokens_per_s", "ttft_ms_p50", "itl_ms_p99")]
        print(f"{config:<10} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22} "
              f"{pct(v['ratios']['server_cpu_ms_per_1k_tokens']):>10}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per phase")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=5.0, help="untimed load first (s)")
    ap.add_argument("--streams", type=int, default=4, help="streaming requests in flight")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    ap.add_argument("--json", type=Path, default=None, help="write all numbers here")
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        print(f"bench_demo: unknown config {unknown[0]!r}; choose from {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench_demo: loading BPF programs needs root", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)

    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ipbench-demo-")))
        server = DemoServer(workdir / "server.log")
        stack.callback(server.stop)
        print(f"demo server pid {server.pid} {server.url}; {args.rounds} rounds x {configs} x "
              f"({args.duration:g} s untraced + {args.duration:g} s traced), {args.streams} streams, "
              f"max_tokens {args.max_tokens}; {os.cpu_count()} CPUs", flush=True)
        if args.warmup > 0:
            run_load(args, server.url, args.warmup, workdir / "warmup.json")
        phases: list[dict] = []
        try:
            for rnd in range(1, args.rounds + 1):
                for config in configs:
                    for traced in (False, True):
                        p = run_phase(args, server, workdir, rnd, config, traced)
                        phases.append(p)
                        c = p["client"]
                        print(f"  round {rnd} {config:<10} {p['mode']:<8}: {c['tokens_per_s']} tok/s, "
                              f"TTFT p50 {c['ttft_ms_p50']} ms, ITL p99 {c['itl_ms_p99']} ms", flush=True)
        except KeyboardInterrupt:
            print("\ninterrupted; cleaning up", file=sys.stderr)
            return 130
        print()
        print_phases(phases)
        summary = {k: v for k, v in summarize(phases).items() if k in configs}
        print_summary(summary)
        if args.json is not None:
            args.json.write_text(json.dumps({"config": vars(args) | {"json": str(args.json)},
                                             "phases": phases, "summary": summary}, indent=2) + "\n")
            print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
