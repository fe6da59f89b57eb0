#!/usr/bin/env python3
"""Check the gpu probe set on a real NVIDIA GPU: inferprobe's counts against torch.profiler's.

UNVERIFIED ON REAL HARDWARE: written on a host without a GPU; run it on one.

A small decode loop (embedding, a few linear layers, argmax, .item() to
bring the sampled token to the host, as a serving engine does each step)
runs in this process twice: eagerly (one kernel launch per op) and as a
replayed CUDA graph (one graph launch per step). For each, this process
attaches `inferprobe record --gpu -p <its own pid>`, runs the loop under
torch.profiler, stops the recorder, and prints, per CUDA function, the
calls inferprobe counted next to the calls the profiler saw, with the
GPU findings inferprobe drew. It exits non-zero when launch or sync counts
disagree beyond the tolerance below (the profiler itself makes a few CUDA
calls when it starts and stops, inside inferprobe's window).

Needs: root (BPF), torch with CUDA, an NVIDIA GPU. Usage:
    sudo .venv/bin/python benchmarks/gpu_check.py [--steps 200] [--layers 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

PY = sys.executable
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
         "cuEventSynchronize", "cuCtxSynchronize")
COPIES = ("cudaMemcpy", "cudaMemcpyAsync", "cuMemcpyDtoH", "cuMemcpyDtoHAsync", "cuMemcpyAsync")
SLACK_ABS = 10  # calls the profiler's own start/stop may add
SLACK_REL = 0.02


def build_model(torch, layers: int, width: int, vocab: int):
    blocks = [torch.nn.Embedding(vocab, width)]
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.LayerNorm(width)]
    blocks.append(torch.nn.Linear(width, vocab))
    return torch.nn.Sequential(*blocks).cuda().eval()


def decode_eager(torch, model, steps: int) -> None:
    token = torch.zeros(1, dtype=torch.long, device="cuda")
    for _ in range(steps):
        token = model(token).argmax(-1)
        token.item()  # device-to-host copy + sync: the end of a decode step


def capture_step(torch, model):
    """One decode step captured as a CUDA graph: (graph, its input, its output)."""
    static_in = torch.zeros(1, dtype=torch.long, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as torch's docs require
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_in).argmax(-1)
    torch.cuda.synchronize()
    return graph, static_in, static_out


def replay(graph, static_in, static_out, steps: int) -> None:
    for _ in range(steps):
        graph.replay()
        static_in.copy_(static_out)
        static_out.item()


def start_recorder(out: Path) -> subprocess.Popen:
    rec = subprocess.Popen([PY, "-m", "inferprobe.cli.main", "record", "-p", str(os.getpid()), "--gpu",
                            "--no-listen-check", "-o", str(out)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = rec.stdout.readline()
        if not line:
            raise SystemExit(f"inferprobe record did not start: {rec.stderr.read()}")
        if line.startswith("inferprobe: attached"):
            time.sleep(1.5)  # one rescan: libcuda is mapped by now, in case it was not at attach
            return rec
    raise SystemExit("inferprobe record did not attach within 180 s")


def inferprobe_gpu(out: Path) -> dict:
    doc = subprocess.run([PY, "-m", "inferprobe.cli.main", "report", str(out), "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(doc)["gpu"] or {}


def profiler_counts(prof) -> Counter:
    return Counter(e.name for e in prof.events() if e.name.startswith(("cu", "cuda")))


def compare(label: str, gpu: dict, prof: Counter) -> bool:
    ours = {name: f["calls"] for name, f in gpu.get("functions", {}).items()}
    print(f"\n== {label}")
    print(f"{'function':28s} {'inferprobe':>11s} {'profiler':>9s}")
    for name in sorted(set(ours) | {n for n in prof if n in LAUNCHES + GRAPH_LAUNCHES + SYNCS + COPIES}):
        print(f"{name:28s} {ours.get(name, 0):11d} {prof.get(name, 0):9d}")
    ok = True
    for group, names in (("launches", LAUNCHES), ("graph launches", GRAPH_LAUNCHES), ("syncs", SYNCS)):
        a, b = sum(ours.get(n, 0) for n in names), sum(prof.get(n, 0) for n in names)
        good = abs(a - b) <= SLACK_ABS + SLACK_REL * max(a, b)
        ok &= good
        print(f"{group}: inferprobe {a}, profiler {b}: {'ok' if good else 'MISMATCH'}")
    for finding in gpu.get("findings", []):
        print(f"finding: {finding['message']}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("gpu_check: needs root to load BPF programs: run it with sudo")
    try:
        import torch
    except ImportError:
        raise SystemExit("gpu_check: needs PyTorch (pip install torch)") from None
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA GPU here")
    from torch.profiler import ProfilerActivity, profile

    model = build_model(torch, args.layers, args.width, vocab=4096)
    ok = True
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        decode_eager(torch, model, 5)  # load kernels, cuBLAS handles, the allocator
        captured = capture_step(torch, model)
        torch.cuda.synchronize()
        for label, run in (("eager", lambda: decode_eager(torch, model, args.steps)),
                           ("CUDA graph", lambda: replay(*captured, args.steps))):
            out = Path(tmp) / f"{label.replace(' ', '_')}.ipr"
            rec = start_recorder(out)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run()
                torch.cuda.synchronize()
            rec.terminate()
            rec.communicate(timeout=120)
            ok &= compare(f"{label}: {args.steps} decode steps", inferprobe_gpu(out), profiler_counts(prof))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
