#!/usr/bin/env python3
"""What tracing costs an unmodified vLLM, now that its engine's messages are read too.

vLLM's API server hands each request to EngineCore and reads every engine step's
outputs back over ZeroMQ; the kernel walks those messages in place (bpf/protocols/zmtp.bpf.h).
This benchmark starts vLLM's CPU build (scripts/setup_vllm.sh) on --max-num-seqs 4,
drives closed bursts of --streams streamed chat completions, and alternates rounds:

    [untraced] [traced, kernel.bpf_stats_enabled], the order reversed every other round

It prints output tokens per second both ways (a ratio, per round and overall), the
BPF time the kernel booked per engine step and per program (a tail call's time counts
in the syscall program that made it: scan_zmtp's in sys_exit_recvfrom and
sys_enter_sendto's exit), and what the recording found: requests, engine steps, and
the engine_ipc events that carried them.

    sudo .venv/bin/python benchmarks/bench_vllm.py [--rounds 2] [--streams 8] [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench_support import REPO, traced_run

sys.path.insert(0, str(REPO))
from inferprobe.collector.ingest.pipeline import ingest  # noqa: E402
from inferprobe.collector.model.events import EngineIpcRecord  # noqa: E402
from inferprobe.collector.model.recording import read_recording  # noqa: E402

from tests.support.vllm_server import VllmServer  # noqa: E402  (the tests' own start-up of vLLM)


def burst(server: VllmServer, streams: int, tokens: int) -> dict:
    t0 = time.monotonic()
    done = server.burst(streams, tokens)
    wall = time.monotonic() - t0
    return {"requests": len(done), "wall_s": wall, "tokens_per_s": len(done) * tokens / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out: dict = {"rounds": []}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = VllmServer(tmp / "vllm.log")
        try:
            burst(server, 2, 4)  # warm: the first requests of a fresh vLLM compile more
            for r in range(args.rounds):
                recording = tmp / f"round{r}.ipr"

                def traced_burst() -> dict:
                    return traced_run(server.proc.pid, recording, tmp / f"round{r}.err",  # noqa: B023
                                      lambda: burst(server, args.streams, args.tokens), "requests",
                                      stats=True)

                if r % 2:  # the VM's speed drifts: each order half the time
                    traced = traced_burst()
                    untraced = burst(server, args.streams, args.tokens)
                else:
                    untraced = burst(server, args.streams, args.tokens)
                    traced = traced_burst()
                ingested = ingest(read_recording(recording).events)
                steps = len(ingested.server.steps)
                traced.update(ratio=round(traced["tokens_per_s"] / untraced["tokens_per_s"], 3),
                              untraced_tokens_per_s=round(untraced["tokens_per_s"], 1),
                              recorded_requests=sum(1 for q in ingested.requests if q.method == "POST"),
                              tied=ingested.correlated, engine_steps=steps,
                              engine_ipc_events=sum(isinstance(e, EngineIpcRecord) for e in ingested.events),
                              bpf_ns_per_step=round(traced["bpf_ns_total"] / max(steps, 1)))
                out["rounds"].append(traced)
                print(f"round {r + 1}: tokens/s traced/untraced {traced['ratio']} "
                      f"({traced['tokens_per_s']:.1f} / {untraced['tokens_per_s']:.1f}); "
                      f"{traced['recorded_requests']} requests recorded, {traced['tied']} tied, "
                      f"{steps} engine steps, BPF {traced['bpf_ns_per_step']} ns per step")
                for name, cost in list(traced["programs"].items())[:6]:
                    print(f"    {name}: {cost['ns_per_run']} ns x{cost['runs_per_request']} per request")
        finally:
            server.stop()
    ratios = [r["ratio"] for r in out["rounds"]]
    out["ratio_mean"] = round(sum(ratios) / len(ratios), 3)
    print(f"tokens/s traced/untraced, mean of {len(ratios)} rounds: {out['ratio_mean']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
