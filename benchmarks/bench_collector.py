#!/usr/bin/env python3
"""Collector throughput: our bulk ring buffer reader vs bcc's per-event callback.

The same event stream for both: tests/programs/usdt_flood.c fires the
token_emit USDT probe N times as fast as it can; each firing is one 56-byte
event in the kernel ring buffer. Each consumer drains it into a recording
file (RecordingWriter), in alternating rounds within one run:

  bulk      collector/attach/ringbuf.py: maps the ring, copies committed runs whole
  callback  bcc's open_ring_buffer + ring_buffer_poll, one Python call per
            event copying it out (what the collector did before)

Reported per consumer: events received, lost (counted by the kernel), the
consumer thread's CPU time per event, and its capacity = events per CPU
second (what one core could sustain), plus the bulk/callback ratios. The
generator's own rate is printed too: on a small VM the uprobe trap caps how
fast a single producer can fire, so capacity, not the producer's rate, is
the figure that says whether the collector keeps up with 1M events/s.

Usage (root):  sudo .venv/bin/python benchmarks/bench_collector.py [--events 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import REPO  # noqa: E402

from inferprobe.collector.attach.loader import load_tracer  # noqa: E402
from inferprobe.collector.attach.ringbuf import RingBufferReader  # noqa: E402
from inferprobe.collector.model.recording import RecordingWriter  # noqa: E402


def build_flood(tmp: Path) -> Path:
    out = tmp / "usdt_flood"
    subprocess.run(["cc", "-O2", "-o", str(out), str(REPO / "tests/programs/usdt_flood.c")], check=True)
    return out


def thread_cpu() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def one_run(binary: Path, n: int, consumer: str, tmp: Path) -> dict:
    proc = subprocess.Popen([str(binary), str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    fired = {}

    def wait_fired() -> None:
        line = proc.stdout.readline()  # "fired N in S s"
        if line.startswith("fired"):
            fired["seconds"] = float(line.split()[3])
        fired["done"] = True

    tracer = load_tracer([proc.pid], sets=("usdt",), ringbuf_pages=2048, require_listener=False)
    writer = RecordingWriter(tmp / f"{consumer}.ipr", {"bench": consumer})
    if consumer == "bulk":
        reader = RingBufferReader(tracer, writer.add_ring_chunk)
        poll, drain = reader.poll, reader.drain
    else:
        def on_event(_ctx, data, size) -> int:
            writer.add_event(ctypes.string_at(data, size))
            return 0

        tracer.bpf[b"events"].open_ring_buffer(on_event)
        drain = tracer.bpf.ring_buffer_consume

        def poll(timeout_ms: int) -> None:
            # libbpf's poll consumes only rings that woke it, and the probes
            # wake the reader once per 256 KiB per CPU: consume on the timer too.
            tracer.bpf.ring_buffer_poll(timeout_ms)
            drain()
    watcher = threading.Thread(target=wait_fired, daemon=True)
    watcher.start()
    cpu0, wall0 = thread_cpu(), time.monotonic()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    while "done" not in fired:
        poll(50)
    drain()
    cpu, wall = thread_cpu() - cpu0, time.monotonic() - wall0
    counters = tracer.counters()
    writer.close({"lost_events": counters["events_lost"]})
    received = reader.events if consumer == "bulk" else writer.events_written
    if consumer == "bulk":
        reader.close()
    tracer.close()
    proc.kill()
    proc.wait()
    return {
        "consumer": consumer,
        "received": received,
        "lost": counters["events_lost"],
        "sent": counters["events_sent"],
        "producer_rate": n / fired["seconds"] if fired.get("seconds") else None,
        "cpu_s": cpu,
        "wall_s": wall,
        "ns_per_event": 1e9 * cpu / max(received, 1),
        "capacity_per_cpu_s": received / cpu if cpu else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        binary = build_flood(tmp)
        results: dict[str, list[dict]] = {"bulk": [], "callback": []}
        for r in range(args.rounds):
            for consumer in ("bulk", "callback") if r % 2 == 0 else ("callback", "bulk"):
                res = one_run(binary, args.events, consumer, tmp)
                results[consumer].append(res)
                print(f"round {r + 1} {consumer:8s} received {res['received']:>9,} lost {res['lost']:>9,} "
                      f"producer {res['producer_rate'] / 1e6:.2f} M/s  consumer {res['ns_per_event']:.0f} "
                      f"ns/event CPU  capacity {res['capacity_per_cpu_s'] / 1e6:.2f} M events/CPU-s",
                      flush=True)
    med = {c: {k: statistics.median(x[k] for x in rs) for k in ("ns_per_event", "capacity_per_cpu_s",
                                                                 "lost", "producer_rate")}
           for c, rs in results.items()}
    print()
    print(f"median over {args.rounds} rounds of {args.events:,} events each:")
    for c, m in med.items():
        capacity = m["capacity_per_cpu_s"] / 1e6
        print(f"  {c:8s} {m['ns_per_event']:7.0f} ns/event CPU, capacity {capacity:5.2f} M events/CPU-s"
              f", lost {m['lost']:,.0f}, producer {m['producer_rate'] / 1e6:.2f} M/s")
    ratio = med["callback"]["ns_per_event"] / med["bulk"]["ns_per_event"]
    print(f"  bulk reader costs 1/{ratio:.1f} of the callback consumer per event")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
