#!/usr/bin/env python3
"""Tracer overhead benchmark: the same server, untraced and traced, side by side.

One server process (tests/servers/sse_server.py) runs for the whole benchmark.
It is driven by closed-loop streaming load (tests/servers/sse_client.py, run
as its own process per phase so this driver never competes for the client's
GIL) in alternating phases::

    warm-up, then N rounds of: [untraced D s] [traced D s]

A traced phase attaches ``inferprobe record -p <server>`` first (compile and
attach time is not measured), runs the same load, then stops the recorder with
SIGTERM and reads its recording with ``inferprobe report --format json``.
Interleaving the phases cancels most of the drift of a small, noisy machine.

Measured per phase: client requests/s, tokens/s, p50 TTFT and p99 ITL; CPU
time of the server, of the load client and of the whole box (they all share
the same cores with the tracer).  Traced phases add the recorder's CPU time
from "attached" to just before SIGTERM, its peak RSS (VmHWM), lost events and
the number of requests it recorded (which should match the client's count).

Note that the BPF programs run in the server's own syscalls: their cost shows
up as extra *server* CPU time, not in the recorder's.

With --floor, each round has a third phase with do-nothing programs on the
same socket syscall tracepoints and no recorder: what the attach points cost
by themselves, which no change to the programs can take back.

Usage (needs root for the BPF part)::

    sudo .venv/bin/python benchmarks/bench_overhead.py [--duration 10] [--rounds 3]
        [--connections 32] [--max-tokens 16] [--interval-ms 2] [--unary] [--floor] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import (  # noqa: E402
    EmptyPrograms,
    Recorder,
    Server,
    box_cpu,
    bpf_program_time,
    bpf_stats_enabled,
    fmt,
    proc_cpu_s,
    raise_interrupt,
    read_report,
    run_client,
)

# -- phases --------------------------------------------------------------------


def run_phase(
    args: argparse.Namespace, server: Server, workdir: Path, rnd: int, mode: str
) -> dict:
    """One load phase; mode is "untraced", "traced" (inferprobe record) or
    "empty" (only EmptyPrograms: what the attach points cost by themselves)."""
    rec = empty = None
    if mode == "traced":
        rec = Recorder(server.pid, workdir / f"round{rnd}.ipr", workdir / f"round{rnd}.err",
                       tuple(args.record_arg))
        if args.bpf_stats:
            empty = EmptyPrograms()  # what the kernel's timing itself books per run
    elif mode == "empty":
        empty = EmptyPrograms()
    try:
        s0 = proc_cpu_s(server.pid)
        b0 = box_cpu()
        bpf0 = bpf_program_time(rec.proc.pid) if rec is not None and empty is not None else None
        empty0 = empty.run_time() if empty is not None else None
        summary, client_cpu = run_client(args, server.port, args.duration)
        bpf1 = bpf_program_time(rec.proc.pid) if rec is not None and empty is not None else None
        empty1 = empty.run_time() if empty is not None else None
        b1 = box_cpu()
        s1 = proc_cpu_s(server.pid)
        phase: dict = {
            "round": rnd,
            "mode": mode,
            "client": summary,
            "client_cpu_s": round(client_cpu, 3),
            "server_cpu_s": round(s1 - s0, 3),
            "box_busy_pct": round(100.0 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1]), 1),
        }
        if rec is not None:
            cpu, hwm_kb = rec.sample_before_stop()
            stop_s = rec.stop()
            report = read_report(rec.output)
            recd = report.get("recording") or {}
            phase["tracer"] = {
                "attach_s": round(rec.attach_s, 2),
                "cpu_s": round(cpu, 3),
                "peak_rss_kb": hwm_kb,
                "stop_s": round(stop_s, 2),
                "lost_events": report.get("lost_events"),
                "requests": (report.get("summary") or {}).get("requests"),
                "events": recd.get("events"),
                "complete": recd.get("complete"),
                "bpf_ns": None if bpf1 is None else bpf1[0] - bpf0[0],
                "bpf_runs": None if bpf1 is None else bpf1[1] - bpf0[1],
                "empty_program_ns": None if empty1 is None else empty1[0] - empty0[0],
                "empty_program_runs": None if empty1 is None else empty1[1] - empty0[1],
            }
            rec = None
        return phase
    finally:
        if empty is not None:
            empty.stop()
        if rec is not None:
            rec.kill()


# -- output --------------------------------------------------------------------


def per_1k(ms_total: float, requests: int) -> float | None:
    return 1000.0 * ms_total / requests if requests else None


def print_table(phases: list[dict], duration: float) -> None:
    hdr = (
        f"{'rnd':>3} {'mode':<8} {'req/s':>8} {'tok/s':>9} {'TTFTp50':>8} {'ITLp99':>7} "
        f"{'srvCPU':>7} {'srv/1k':>7} {'cliCPU':>7} {'box':>5} "
        f"{'trcCPU':>7} {'trc/1k':>7} {'RSS':>6} {'req cli/trc':>13} {'lost':>5}"
    )
    units = (
        f"{'':>3} {'':<8} {'':>8} {'':>9} {'ms':>8} {'ms':>7} "
        f"{'%core':>7} {'ms':>7} {'%core':>7} {'%':>5} "
        f"{'ms':>7} {'ms':>7} {'MB':>6} {'':>13} {'':>5}"
    )
    print(hdr)
    print(units)
    print("-" * len(hdr))
    for p in phases:
        c = p["client"]
        wall = c["wall_s"] or duration
        t = p.get("tracer")
        trc_ms = t["cpu_s"] * 1000 if t else None
        reqs = f"{c['completed']}/{t['requests']}" if t else f"{c['completed']}/-"
        print(
            f"{p['round']:>3} {p['mode']:<8} {c['requests_per_s']:>8.1f} "
            f"{c['tokens_per_s']:>9.0f} {fmt(c['ttft_ms_p50'], '.2f'):>8} "
            f"{fmt(c['itl_ms_p99'], '.2f'):>7} "
            f"{100 * p['server_cpu_s'] / wall:>7.1f} "
            f"{fmt(per_1k(p['server_cpu_s'] * 1000, c['completed']), '.1f'):>7} "
            f"{100 * p['client_cpu_s'] / wall:>7.1f} {p['box_busy_pct']:>5.1f} "
            f"{fmt(trc_ms, '.0f'):>7} "
            f"{fmt(per_1k(trc_ms, c['completed']) if t else None, '.1f'):>7} "
            f"{fmt(t['peak_rss_kb'] / 1024 if t and t['peak_rss_kb'] else None, '.1f'):>6} "
            f"{reqs:>13} {fmt(t['lost_events'] if t else None, 'd'):>5}"
        )


def aggregate(phases: list[dict]) -> dict:
    def mode(m: str) -> list[dict]:
        return [p for p in phases if p["mode"] == m]

    def agg(ps: list[dict]) -> dict:
        wall = sum(p["client"]["wall_s"] for p in ps)
        done = sum(p["client"]["completed"] for p in ps)
        toks = sum(p["client"]["tokens"] for p in ps)

        def mean(key: str) -> float | None:
            vals = [p["client"][key] for p in ps if p["client"][key] is not None]
            return statistics.fmean(vals) if vals else None

        return {
            "phases": len(ps),
            "wall_s": wall,
            "completed": done,
            "requests_per_s": done / wall if wall else None,
            "tokens_per_s": toks / wall if wall else None,
            "itl_ms_p99_mean": mean("itl_ms_p99"),
            "ttft_ms_p50_mean": mean("ttft_ms_p50"),
            "server_cpu_ms_per_1k": per_1k(sum(p["server_cpu_s"] for p in ps) * 1000, done),
        }

    u, t = agg(mode("untraced")), agg(mode("traced"))
    traced = mode("traced")
    trc_cpu_ms = sum(p["tracer"]["cpu_s"] for p in traced) * 1000
    rss = [p["tracer"]["peak_rss_kb"] for p in traced if p["tracer"]["peak_rss_kb"]]

    paired = paired_ratios(mode("untraced"), traced)
    floor = paired_ratios(mode("untraced"), mode("empty"))
    return {
        "untraced": u,
        "traced": t,
        "throughput_ratio": ratio(t["requests_per_s"], u["requests_per_s"]),
        "tokens_per_s_ratio": ratio(t["tokens_per_s"], u["tokens_per_s"]),
        "itl_p99_ratio": ratio(t["itl_ms_p99_mean"], u["itl_ms_p99_mean"]),
        "ttft_p50_ratio": ratio(t["ttft_ms_p50_mean"], u["ttft_ms_p50_mean"]),
        "server_cpu_per_1k_ratio": ratio(t["server_cpu_ms_per_1k"], u["server_cpu_ms_per_1k"]),
        "tracer_cpu_ms": trc_cpu_ms,
        "tracer_cpu_ms_per_1k_requests": per_1k(trc_cpu_ms, t["completed"]),
        "tracer_peak_rss_mb": max(rss) / 1024 if rss else None,
        "lost_events": sum(p["tracer"]["lost_events"] or 0 for p in traced),
        "traced_requests_recorded": sum(p["tracer"]["requests"] or 0 for p in traced),
        "traced_requests_client": t["completed"],
        "per_round": paired,
        # How far the rounds scatter: on a small shared VM a round can be
        # 10 % off, so a ratio means little without it.
        "throughput_ratio_stderr": standard_error([r["throughput_ratio"] for r in paired]),
        "server_cpu_per_1k_ratio_stderr": standard_error([r["server_cpu_per_1k_ratio"] for r in paired]),
        **bpf_time_per_request(traced, t, u),
        **({"attach_point_floor": mean_ratios(floor)} if floor else {}),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def paired_ratios(base: list[dict], other: list[dict]) -> list[dict]:
    """Per round, the other phase against the untraced one next to it."""
    return [
        {
            "round": pu["round"],
            "throughput_ratio": ratio(px["client"]["requests_per_s"], pu["client"]["requests_per_s"]),
            "itl_p99_ratio": ratio(px["client"]["itl_ms_p99"], pu["client"]["itl_ms_p99"]),
            "server_cpu_per_1k_ratio": ratio(
                per_1k(px["server_cpu_s"] * 1000, px["client"]["completed"]),
                per_1k(pu["server_cpu_s"] * 1000, pu["client"]["completed"]),
            ),
        }
        for pu, px in zip(base, other, strict=False)
    ]


def mean_ratios(rounds: list[dict]) -> dict:
    """Mean and standard error over rounds of each per-round ratio."""
    out: dict = {}
    for key in ("throughput_ratio", "server_cpu_per_1k_ratio"):
        known = [r[key] for r in rounds if r[key] is not None]
        out[key] = statistics.fmean(known) if known else None
        out[key + "_stderr"] = standard_error(known)
    return out


def standard_error(values: list[float | None]) -> float | None:
    """Standard error of the mean of the per-round values (None below two rounds)."""
    known = [v for v in values if v is not None]
    return statistics.stdev(known) / len(known) ** 0.5 if len(known) >= 2 else None


def bpf_time_per_request(traced: list[dict], t: dict, u: dict) -> dict:
    """With --bpf-stats: time inside the BPF programs per traced request (all programs,
    on every process's syscalls), and that against the untraced server CPU per request."""
    stats = [p["tracer"] for p in traced if p["tracer"].get("bpf_ns") is not None]
    if not stats or not t["completed"]:
        return {}
    ns = sum(s["bpf_ns"] for s in stats)
    us = ns / 1000 / t["completed"]
    # The kernel's timing reads the clock around every run; an empty program
    # measures that (it books nothing else), so it is taken off every run.
    floor_ns = sum(s["empty_program_ns"] for s in stats) / max(1, sum(s["empty_program_runs"] for s in stats))
    net_us = (ns - floor_ns * sum(s["bpf_runs"] for s in stats)) / 1000 / t["completed"]
    base = u["server_cpu_ms_per_1k"]  # ms per 1000 requests = us per request
    return {"bpf_us_per_request": us,
            "bpf_share_of_untraced_server_cpu": us / base if base else None,
            "bpf_stats_ns_per_run": floor_ns,
            "bpf_us_per_request_net_of_stats": net_us,
            "bpf_net_share_of_untraced_server_cpu": net_us / base if base else None}


def stderr_pct(stderr: float | None) -> str:
    return "" if stderr is None else f", per-round standard error {stderr * 100:.1f} %"


def print_summary(s: dict) -> None:
    def pct(r: float | None) -> str:
        return "-" if r is None else f"{(r - 1) * 100:+.1f} %"

    print()
    print("per round (traced/untraced):")
    for r in s["per_round"]:
        print(
            f"  round {r['round']}: throughput {fmt(r['throughput_ratio'], '.3f')}, "
            f"p99 ITL {fmt(r['itl_p99_ratio'], '.3f')}, "
            f"server CPU per request {fmt(r['server_cpu_per_1k_ratio'], '.3f')}"
        )
    u, t = s["untraced"], s["traced"]
    print(
        f"requests recorded by tracer / completed by client = "
        f"{s['traced_requests_recorded']} / {s['traced_requests_client']}"
    )
    print(
        f"server CPU per 1k requests: untraced = {fmt(u['server_cpu_ms_per_1k'], '.0f')} ms, "
        f"traced = {fmt(t['server_cpu_ms_per_1k'], '.0f')} ms "
        f"({pct(s['server_cpu_per_1k_ratio'])}{stderr_pct(s['server_cpu_per_1k_ratio_stderr'])})"
    )
    print(
        f"p50 TTFT traced/untraced = {fmt(s['ttft_p50_ratio'], '.3f')} "
        f"({pct(s['ttft_p50_ratio'])})"
    )
    print()
    print("== summary ==")
    thr = s["throughput_ratio"]
    loss = "-" if thr is None else f"{(1 - thr) * 100:.1f} %"
    print(f"throughput traced/untraced = {fmt(thr, '.3f')} (loss {loss}"
          f"{stderr_pct(s['throughput_ratio_stderr'])})")
    print(f"tokens/s ratio traced/untraced = {fmt(s['tokens_per_s_ratio'], '.3f')}")
    print(
        f"p99 ITL traced/untraced = {fmt(s['itl_p99_ratio'], '.3f')} "
        f"({pct(s['itl_p99_ratio'])})"
    )
    print(
        f"tracer CPU per 1k requests = {fmt(s['tracer_cpu_ms_per_1k_requests'], '.0f')} ms"
    )
    print(f"tracer peak RSS = {fmt(s['tracer_peak_rss_mb'], '.0f')} MB")
    print(f"lost events = {s['lost_events']}")
    if "attach_point_floor" in s:
        f = s["attach_point_floor"]
        print(f"attach points alone (do-nothing programs)/untraced: throughput "
              f"{fmt(f['throughput_ratio'], '.3f')}{stderr_pct(f['throughput_ratio_stderr'])}; "
              f"server CPU per request {fmt(f['server_cpu_per_1k_ratio'], '.3f')}"
              f"{stderr_pct(f['server_cpu_per_1k_ratio_stderr'])}")
    if "bpf_us_per_request" in s:
        share = s["bpf_share_of_untraced_server_cpu"]
        net = s["bpf_net_share_of_untraced_server_cpu"]
        print(f"BPF programs per request = {s['bpf_us_per_request']:.2f} us "
              f"({'-' if share is None else f'{share * 100:.1f} %'} of the untraced server CPU per request); "
              f"less the kernel's own timing ({s['bpf_stats_ns_per_run']:.0f} ns per run, an empty "
              f"program's): {s['bpf_us_per_request_net_of_stats']:.2f} us "
              f"({'-' if net is None else f'{net * 100:.1f} %'})")


# -- main ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=3, help="untraced+traced pairs")
    ap.add_argument("--warmup", type=float, default=2.0, help="untimed load first (s)")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--unary", action="store_true",
                    help="one JSON response per request (headers and body in one write) instead "
                    "of an SSE stream: the many-small-requests case")
    ap.add_argument("--json", type=Path, default=None, help="write all numbers here")
    ap.add_argument(
        "--keep-dir", type=Path, default=None, help="keep recordings and logs in this folder"
    )
    ap.add_argument(
        "--server-log", action="store_true", help="let the server write its JSONL request log"
    )
    ap.add_argument("--bpf-stats", action="store_true",
                    help="also time the BPF programs themselves (kernel.bpf_stats_enabled, which "
                    "adds a little to every program run, so traced phases run slightly slower)")
    ap.add_argument("--floor", action="store_true",
                    help="a third phase per round with only do-nothing programs on the same socket "
                    "syscall tracepoints: the share of the overhead the attach points take by themselves")
    ap.add_argument("--record-arg", action="append", default=[],
                    help="extra argument for `inferprobe record` (repeat), e.g. --record-arg=--locks")
    args = ap.parse_args(argv)

    if os.geteuid() != 0:
        print("bench_overhead: loading BPF programs needs root", file=sys.stderr)
        return 2

    # SIGINT too: a shell may start background jobs with it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)
    with contextlib.ExitStack() as stack:
        if args.bpf_stats:
            stack.enter_context(bpf_stats_enabled())
        if args.keep_dir is not None:
            args.keep_dir.mkdir(parents=True, exist_ok=True)
            workdir = args.keep_dir
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ipbench-")))
        server = Server(workdir / "server_log.jsonl" if args.server_log else None)
        stack.callback(server.stop)

        print(
            f"server pid {server.pid} port {server.port}; {args.rounds} rounds x "
            f"({args.duration:g} s untraced + {args.duration:g} s traced), "
            f"{args.connections} connections, max_tokens {args.max_tokens}, "
            f"interval_ms {args.interval_ms:g}, {'unary' if args.unary else 'streamed'}; "
            f"{os.cpu_count()} CPUs",
            flush=True,
        )
        if args.warmup > 0:
            run_client(args, server.port, args.warmup)

        phases: list[dict] = []
        try:
            for rnd in range(1, args.rounds + 1):
                for mode in ("untraced", "traced", "empty") if args.floor else ("untraced", "traced"):
                    p = run_phase(args, server, workdir, rnd, mode)
                    phases.append(p)
                    c = p["client"]
                    extra = ""
                    if mode == "traced":
                        tr = p["tracer"]
                        extra = (
                            f", tracer {tr['cpu_s'] * 1000:.0f} ms CPU, "
                            f"{tr['requests']} recorded, {tr['lost_events']} lost"
                        )
                    print(
                        f"  round {rnd} {p['mode']:<8}: {c['requests_per_s']:.1f} req/s, "
                        f"p99 ITL {c['itl_ms_p99']} ms{extra}",
                        flush=True,
                    )
                    if c["errors"] or c["non_200"]:
                        print(
                            f"  warning: {c['errors']} client errors, {c['non_200']} non-200",
                            file=sys.stderr,
                        )
        except KeyboardInterrupt:
            print("\ninterrupted; cleaning up", file=sys.stderr)
            return 130

        print()
        print_table(phases, args.duration)
        summary = aggregate(phases)
        for p in phases:
            t = p.get("tracer")
            if t and t["requests"] is not None:
                n = p["client"]["completed"]
                if abs(t["requests"] - n) > max(2, 0.01 * n):
                    print(
                        f"warning: round {p['round']}: tracer recorded {t['requests']} "
                        f"requests, client completed {n}",
                        file=sys.stderr,
                    )
        print_summary(summary)

        if args.json is not None:
            doc = {
                "config": {
                    "duration_s": args.duration,
                    "rounds": args.rounds,
                    "warmup_s": args.warmup,
                    "connections": args.connections,
                    "max_tokens": args.max_tokens,
                    "interval_ms": args.interval_ms,
                    "unary": args.unary,
                    "cpus": os.cpu_count(),
                    "server_log": args.server_log,
                },
                "phases": phases,
                "summary": summary,
            }
            args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
            print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
