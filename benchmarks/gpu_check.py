#!/usr/bin/env python3
"""Check the gpu probe set and the CUPTI shim on a real NVIDIA GPU, against torch.profiler.

UNVERIFIED ON REAL HARDWARE: written on a host without a GPU; run it on one.

Two checks, each skipped with its reason where the host cannot run it:

1. The CUPTI shim (probes/cupti/, needs no BPF): the shim is built against
   the CUDA installed here, then one child process runs a served-request
   decode loop with the shim injected at start (CUDA_INJECTION64_PATH, the
   documented start-up mode) writing its records to a dump file
   (INFERPROBE_CUPTI_DUMP), and a second child runs the same loop under
   torch.profiler (CUPTI too: two CUPTI clients cannot share one process).
   analyzers/gpu_execution.py joins the shim's records to their launches by
   correlation id, maps them onto CLOCK_MONOTONIC and gives each request its
   GPU busy time. Checked: kernel, copy and launch-call counts equal the
   profiler's (within 0.5 %), kernel GPU time and the requests' busy time
   within 5 % of the profiler's, at least 99 % of kernels joined to their
   launch, no kernel starting before its launch (beyond the clock fit's
   residual). With --attach-gdb PATH (a gdb; the GPU image has cuda-gdb),
   also `inferprobe gpu-attach` into a third child that already has a CUDA
   context, then --detach. --out FILE writes the figures as JSON (docs/gpu.md).
2. The uprobes (needs root, bcc): as below.

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

Needs: torch with CUDA, an NVIDIA GPU, a C compiler and <sys/sdt.h> (check 1);
root and bcc (check 2). Usage:
    sudo .venv/bin/python benchmarks/gpu_check.py [--steps 200] [--layers 8] [--shim-only] [--out F]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import PY, REPO  # noqa: E402

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


def uprobe_check(args) -> bool | None:
    """Check 2; None (with the reason printed) where this host cannot run it."""
    if os.geteuid() != 0:
        print("\n== uprobes: skipped: loading BPF programs needs root")
        return None
    try:
        import bcc  # noqa: F401
    except ImportError:
        print("\n== uprobes: skipped: bcc is not importable here (python3-bpfcc); the launch, sync and "
              "copy counts of the uprobes need it")
        return None
    import torch
    from torch.profiler import ProfilerActivity, profile

    print("\n== uprobes against torch.profiler")
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
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="decode steps per uprobe run (check 2)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=10, help="requests served in the shim check")
    parser.add_argument("--steps-per-request", type=int, default=20)
    parser.add_argument("--shim-only", action="store_true", help="skip the uprobe check")
    parser.add_argument("--attach-gdb", default=None, help="a gdb for the gpu-attach check (cuda-gdb works)")
    parser.add_argument("--out", type=Path, default=None, help="write the shim check's figures as JSON")
    parser.add_argument("--child", choices=("shim", "profiler", "attach"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return serve_child(args)
    try:
        import torch
    except ImportError:
        raise SystemExit("gpu_check: needs PyTorch (pip install torch)") from None
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA GPU here")
    results = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name()}
    ok = shim_check(args, results)
    if args.attach_gdb:
        ok &= attach_check(args, results)
    if not args.shim_only:
        uprobes = uprobe_check(args)
        results["uprobes_ok"] = uprobes
        ok &= uprobes is not False
    results["ok"] = ok
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\ngpu_check: {'all checks passed' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


# ---------------------------------------------------------------------------------- check 1: the shim

KERNEL_TIME_TOLERANCE = 0.05
COUNT_TOLERANCE = 0.005
JOINED_MIN_SHARE = 0.99
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC")
RUNTIME_DOMAIN = 2  # CUPTI_CB_DOMAIN_RUNTIME_API


def import_inferprobe() -> None:
    """From a bare checkout too (the GPU machine has no installed inferprobe): each top-level folder
    is a subpackage of the namespace package inferprobe, as pyproject.toml maps them."""
    try:
        import inferprobe.analyzers.gpu_execution  # noqa: F401
        return
    except ImportError:
        pass
    farm = Path(tempfile.mkdtemp(prefix="inferprobe-pkg-")) / "inferprobe"
    farm.mkdir()
    for part in ("probes", "bpf", "collector", "analyzers", "flamegraphs", "cli", "exporters", "reports",
                 "demo"):
        (farm / part).symlink_to(REPO / part)
    sys.path.insert(0, str(farm.parent))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(farm.parent), os.environ.get("PYTHONPATH")]))


def find_file(roots: list[Path], pattern: str) -> Path | None:
    for root in roots:
        if root.is_dir():
            found = sorted(root.rglob(pattern))
            if found:
                return found[0]
    return None


def cuda_roots() -> list[Path]:
    roots = [Path("/usr/local/cuda")]
    try:
        import nvidia

        roots = [Path(p) for p in nvidia.__path__] + roots
    except ImportError:
        pass
    return roots


def build_shim(work: Path) -> Path:
    """The shim built against this host's CUDA (its CUPTI must be the one the driver and torch use)."""
    roots = cuda_roots()
    cupti_h = find_file(roots, "cupti.h")
    libcupti = find_file(roots, "libcupti.so.[0-9]*")
    host_defines = find_file(roots, "crt/host_defines.h")
    missing = [n for n, f in (("cupti.h", cupti_h), ("libcupti.so.N", libcupti),
                              ("crt/host_defines.h", host_defines)) if f is None]
    if missing:
        raise SystemExit(f"gpu_check: no {', '.join(missing)} under {', '.join(map(str, roots))}")
    cuda_h = find_file([host_defines.parent.parent], "cuda.h") or find_file(roots, "cuda.h")
    include = work / "cuda-include"  # cuda.h and crt/ side by side, wherever this host keeps them
    include.mkdir()
    (include / "crt").symlink_to(host_defines.parent)
    for header in cuda_h.parent.glob("*.h"):
        if not (include / header.name).exists():
            (include / header.name).symlink_to(header)
    env = {**os.environ, "CUPTI_CACHE": str(work / "cache"), "CUPTI_INCLUDE": str(cupti_h.parent),
           "CUPTI_LIB": str(libcupti.parent), "CUDA_INCLUDE": str(include)}
    subprocess.run(["bash", str(REPO / "scripts" / "build_cupti_shim.sh")], env=env, check=True)
    out = subprocess.run(["bash", str(REPO / "scripts" / "build_cupti_shim.sh"), "--path"], env=env,
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


def serve(torch, model, requests: int, steps: int) -> list[list[int]]:
    """Requests served one after another, each `steps` decode steps: [t_start, t_first_token, t_end]."""
    windows = []
    for _ in range(requests):
        t0 = time.monotonic_ns()
        token = torch.zeros(1, dtype=torch.long, device="cuda")
        first = None
        for _ in range(steps):
            token = model(token).argmax(-1)
            token.item()  # the sampled token to the host: the end of a decode step
            first = first or time.monotonic_ns()
        windows.append([t0, first, time.monotonic_ns()])
    return windows


def serve_child(args) -> None:
    import torch

    torch.manual_seed(0)
    model = build_model(torch, args.layers, args.width, vocab=4096)
    with torch.inference_mode():
        serve(torch, model, 2, 5)  # kernels loaded, cuBLAS handles made, the allocator warm
        torch.cuda.synchronize()
        if args.child == "attach":
            print(f"READY {os.getpid()}", flush=True)
            sys.stdin.readline()
        report: dict = {"pid": os.getpid()}
        if args.child == "profiler":
            from torch.autograd import DeviceType
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                serve(torch, model, args.requests, args.steps_per_request)
                torch.cuda.synchronize()
            gpu: dict[str, list[float]] = {}
            api: Counter = Counter()
            for e in prof.events():
                if e.device_type == DeviceType.CUDA:
                    row = gpu.setdefault(e.name, [0, 0.0])
                    row[0] += 1
                    row[1] += e.time_range.elapsed_us()
                elif e.name.startswith(("cuda", "cu")):
                    api[e.name] += 1
            report.update(gpu=gpu, api=dict(api))
        else:
            t0 = time.monotonic_ns()
            report["windows"] = serve(torch, model, args.requests, args.steps_per_request)
            torch.cuda.synchronize()
            report["loop"] = [t0, time.monotonic_ns()]
            if os.environ.get("CUDA_INJECTION64_PATH"):
                # Flush while CUDA is still up (an atexit flush may come after its teardown).
                import ctypes

                ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"]).inferprobe_cupti_stop()
    print("REPORT " + json.dumps(report), flush=True)


def run_child(kind: str, args, env: dict) -> dict:
    argv = [PY, __file__, "--child", kind, "--layers", str(args.layers), "--width", str(args.width),
            "--requests", str(args.requests), "--steps-per-request", str(args.steps_per_request)]
    done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("REPORT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"gpu_check: the {kind} child failed: {done.stderr[-2000:]}")
    return json.loads(line.removeprefix("REPORT "))


def profiler_totals(prof: dict) -> dict:
    kernels = {n: v for n, v in prof["gpu"].items() if not n.startswith(("Memcpy", "Memset"))}
    return {
        "kernels": sum(c for c, _ in kernels.values()),
        "kernel_ns": 1000 * sum(t for _, t in kernels.values()),
        "copies": sum(c for n, (c, _) in prof["gpu"].items() if n.startswith("Memcpy")),
        "memsets": sum(c for n, (c, _) in prof["gpu"].items() if n.startswith("Memset")),
        "gpu_ns": 1000 * sum(t for _, t in prof["gpu"].values()),
        "launch_calls": sum(prof["api"].get(n, 0) for n in LAUNCH_CALLS),
    }


def shim_totals(records: list, shim_run: dict) -> tuple[dict, list, object]:
    from inferprobe.analyzers import gpu_execution as gx
    from inferprobe.collector.model.events import (
        GpuActivityKind,
        GpuActivityRecord,
        GpuApiRecord,
        GpuClockRecord,
        GpuKernelNameRecord,
    )
    from inferprobe.collector.model.timeline import Outcome, Request

    apis = [r for r in records if isinstance(r, GpuApiRecord)]
    joined = gx.join([r for r in records if isinstance(r, GpuActivityRecord)], apis,
                     [r for r in records if isinstance(r, GpuClockRecord)],
                     [r for r in records if isinstance(r, GpuKernelNameRecord)])
    lo, hi = shim_run["loop"]
    # The measured loop only (the warm-up ran before it): by launch time, or GPU start for the unjoined.
    mine = [x for x in joined.executions
            if lo <= (x.launch_ns if x.launch_ns is not None else x.start_ns) <= hi]
    kernels = [x for x in mine if x.kind == GpuActivityKind.KERNEL]
    pid = shim_run["pid"]
    requests = [Request(pid=pid, tid=pid, conn=i, method="POST", path="/v1/completions", t_ingress_ns=t0,
                        outcome=Outcome.COMPLETE, t_end_ns=t1, token_ns=[first])
                for i, (t0, first, t1) in enumerate(shim_run["windows"])]
    per_request = gx.per_request(requests, mine)
    # cudaLaunchKernel(_ptsz), cudaLaunchKernelExC(_ptsz): the runtime calls torch.profiler counts
    launch_cbids = {211, 214, 430, 431}
    clock = joined.clocks.get(pid)
    early = [x for x in kernels if x.launch_ns is not None
             and x.start_ns < x.launch_ns - (clock.max_residual_ns if clock else 0)]
    totals = {
        "kernels": len(kernels),
        "kernel_ns": sum(x.duration_ns for x in kernels),
        "copies": sum(1 for x in mine if x.kind == GpuActivityKind.MEMCPY),
        "memsets": sum(1 for x in mine if x.kind == GpuActivityKind.MEMSET),
        "gpu_ns": sum(x.duration_ns for x in mine),
        "launch_calls": sum(1 for a in apis if lo <= a.ts_ns <= hi and a.cbid in launch_cbids
                            and a.domain == RUNTIME_DOMAIN),
        "joined_share": sum(1 for x in kernels if x.launch_ns is not None) / len(kernels) if kernels else 0.0,
        "kernels_before_their_launch": len(early),
        "clock_pairs": clock.pairs if clock else 0,
        "clock_max_residual_ns": clock.max_residual_ns if clock else None,
        "requests_busy_ns": sum(r.gpu.busy_ns for r in per_request),
        "without_clock": joined.without_clock,
    }
    return totals, per_request, gx.kernel_table(kernels, max_rows=10)


def within(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1)


def shim_check(args, results: dict) -> bool:
    import_inferprobe()
    from inferprobe.collector.ingest.cupti_dump import read_dump

    print("\n== CUPTI shim against torch.profiler")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shim = build_shim(work)
        dump = work / "shim.dump"
        shim_run = run_child("shim", args, {"CUDA_INJECTION64_PATH": str(shim),
                                            "INFERPROBE_CUPTI_DUMP": str(dump)})
        records = read_dump(dump, shim_run["pid"])
        prof = run_child("profiler", args, {})
    statuses = {r.text for r in records if type(r).__name__ == "GpuShimStatusRecord"}
    print("shim said: " + " / ".join(sorted(statuses)))
    ours, per_request, table = shim_totals(records, shim_run)
    theirs = profiler_totals(prof)
    checks = [
        ("kernels", within(ours["kernels"], theirs["kernels"], COUNT_TOLERANCE)),
        ("copies", within(ours["copies"], theirs["copies"], COUNT_TOLERANCE)),
        ("launch calls", within(ours["launch_calls"], theirs["launch_calls"], COUNT_TOLERANCE)),
        ("kernel GPU time", within(ours["kernel_ns"], theirs["kernel_ns"], KERNEL_TIME_TOLERANCE)),
        ("requests' GPU busy time",
         within(ours["requests_busy_ns"], theirs["gpu_ns"], KERNEL_TIME_TOLERANCE)),
        ("kernels joined to their launch", ours["joined_share"] >= JOINED_MIN_SHARE),
        ("no kernel before its launch", ours["kernels_before_their_launch"] == 0),
    ]
    print(f"{'':28s} {'shim':>14s} {'torch.profiler':>15s}")
    for key in ("kernels", "copies", "memsets", "launch_calls", "kernel_ns", "gpu_ns"):
        print(f"{key:28s} {ours[key]:14.0f} {theirs[key]:15.0f}")
    print(f"{'requests_busy_ns':28s} {ours['requests_busy_ns']:14.0f} {theirs['gpu_ns']:15.0f} "
          "(profiler: all GPU work)")
    print(f"joined share {ours['joined_share']:.4f}; clock pairs {ours['clock_pairs']}, worst residual "
          f"{ours['clock_max_residual_ns']} ns; kernels before their launch "
          f"{ours['kernels_before_their_launch']}")
    for r in per_request[:5]:
        print(f"request {r.index}: GPU busy {r.gpu.busy_ns / 1e6:.3f} ms, idle {r.gpu.idle_ns / 1e6:.3f} ms, "
              f"first launch -> GPU {r.launch_queue_ns / 1e3:.1f} us, last GPU end -> first token "
              f"{(r.last_gpu_end_to_first_token_ns or 0) / 1e3:.1f} us")
    for row in table[:5]:
        print(f"kernel {row.name[:70]:70s} {row.count:6d} {row.total_ns / 1e3:10.1f} us")
    for name, good in checks:
        print(f"{name}: {'ok' if good else 'MISMATCH'}")
    results["shim"] = {"ours": ours, "profiler": theirs, "checks": dict(checks), "statuses": sorted(statuses),
                       "requests": [{"busy_ns": r.gpu.busy_ns, "idle_ns": r.gpu.idle_ns,
                                     "launch_queue_ns": r.launch_queue_ns,
                                     "last_gpu_end_to_first_token_ns": r.last_gpu_end_to_first_token_ns}
                                    for r in per_request]}
    return all(good for _, good in checks)


def attach_check(args, results: dict) -> bool:
    """`inferprobe gpu-attach` into a child that already runs CUDA, through the given gdb."""
    import_inferprobe()
    print(f"\n== gpu-attach through {args.attach_gdb}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shim = build_shim(work)
        dump = work / "attach.dump"
        env = {**os.environ, "INFERPROBE_CUPTI_DUMP": str(dump)}
        argv = [PY, __file__, "--child", "attach", "--layers", str(args.layers), "--width", str(args.width),
                "--requests", str(args.requests), "--steps-per-request", str(args.steps_per_request)]
        child = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        pid = int(child.stdout.readline().split()[1])
        # What `inferprobe gpu-attach` runs (cli/gpu_attach.py is flags around it), in this process: the
        # CLI's other commands import packages this GPU image may not have (pyelftools, snappy).
        from inferprobe.collector.attach import cupti_attach
        from inferprobe.collector.errors import InferprobeError

        cupti_attach.GDB = args.attach_gdb
        os.environ["INFERPROBE_CUPTI_SHIM"] = str(shim)

        def call(fn) -> tuple[int, str]:
            try:
                reply = fn(pid, timeout_s=240)
                return int(reply.status), reply.sentence
            except InferprobeError as err:
                return -1, str(err)

        on = call(cupti_attach.attach)
        print(f"attach: status {on[0]}: {on[1]}")
        child.stdin.write("go\n")
        child.stdin.flush()
        report = json.loads(child.stdout.readline().removeprefix("REPORT "))
        off = call(cupti_attach.detach)
        print(f"detach: status {off[0]}: {off[1]}")
        child.stdin.close()
        child.wait(timeout=60)
        records = read_dump_records(dump, pid)
    kernels = [r for r in records if type(r).__name__ == "GpuActivityRecord"]
    good = on[1].startswith("CUPTI is recording") and off[1].startswith("CUPTI activity collection stopped") \
        and len(kernels) > 0
    print(f"records after attach: {len(kernels)}; {'ok' if good else 'MISMATCH'}")
    results["attach"] = {"attach": on[1], "detach": off[1], "records": len(kernels),
                         "windows": len(report.get("windows", [])), "ok": good}
    return good


def read_dump_records(path: Path, pid: int) -> list:
    from inferprobe.collector.ingest.cupti_dump import read_dump

    return read_dump(path, pid) if path.exists() else []


if __name__ == "__main__":
    main()
