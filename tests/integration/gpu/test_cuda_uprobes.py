"""The gpu probe set against the real CUDA runtime library, without a GPU.

tests/programs/cuda_calls.py loads libcudart from the nvidia-cuda-runtime
wheel and calls it through ctypes. With no GPU (and no driver) each call
fails at once, but it runs the library's real code, so the uprobes fire;
the program times every call with CLOCK_MONOTONIC, the clock of the
kernel's timestamps. Checked: exact call counts, the arguments captured
(sizes, directions, addresses), return codes, launch runs, and that every
traced call lies inside the caller's own before/after timestamps.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.kernel import needs_root
from tests.support.paths import REPO
from tests.support.processes import Recorder, inferprobe_cmd

pytest.importorskip(
    "nvidia.cuda_runtime",
    reason="the nvidia-cuda-runtime-cu12 wheel is not installed (pip install -e '.[test]')",
)

from inferprobe.collector.attach.probe_sets.gpu import DRM_TRACEPOINTS, TRACEFS_EVENTS  # noqa: E402
from inferprobe.collector.model.events import (  # noqa: E402
    GpuCallRecord,
    GpuCopyKind,
    GpuFlushReason,
    GpuFunction,
    GpuLaunchesRecord,
    decode,
)
from inferprobe.collector.model.recording import read_recording  # noqa: E402

pytestmark = [needs_root, pytest.mark.bpf]

PROGRAM = REPO / "tests" / "programs" / "cuda_calls.py"
STEPS, LAUNCHES, TAIL = 5, 7, 3
FN_OF = {"cudaGetDeviceCount": GpuFunction.CUDA_GET_DEVICE_COUNT,
         "cudaLaunchKernel": GpuFunction.CUDA_LAUNCH_KERNEL,
         "cudaMemcpy": GpuFunction.CUDA_MEMCPY,
         "cudaStreamSynchronize": GpuFunction.CUDA_STREAM_SYNCHRONIZE,
         "cudaMalloc": GpuFunction.CUDA_MALLOC,
         "cudaFree": GpuFunction.CUDA_FREE}


class CudaProgram:
    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, str(PROGRAM), "--steps", str(STEPS),
                                      "--launches", str(LAUNCHES), "--tail-launches", str(TAIL),
                                      *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = int(self.ask(None, "READY").split()[1])

    def ask(self, command: str | None, reply: str) -> str:
        if command:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line.startswith(reply), line
        return line

    def run_plan(self) -> list[dict]:
        return json.loads(self.ask("go", "CALLS").split(" ", 1)[1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=10)


def wait_for_line(rec: Recorder, needle: str, timeout: float) -> str:
    """Reads the recorder's stdout until a line contains needle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([rec.proc.stdout], [], [], 0.2)
        if ready:
            line = rec.proc.stdout.readline()
            rec.stdout_lines.append(line)
            if needle in line:
                return line
    raise AssertionError(f"recorder never said {needle!r}: {''.join(rec.stdout_lines)}")


def record_program(tmp: Path, *record_args: str, load_later: bool = False):
    prog = CudaProgram(*(["--load-later"] if load_later else []))
    try:
        rec = Recorder([prog.pid], tmp / "gpu.ipr", "--no-listen-check", *record_args)
        attach_note = None
        if load_later:
            prog.ask("load", "LOADED")
            attach_note = wait_for_line(rec, f"in pid {prog.pid}", timeout=20)
        calls = prog.run_plan()
        rec.stop()
    finally:
        prog.close()
    recording = read_recording(tmp / "gpu.ipr")
    events = [decode(raw) for raw in recording.events]
    return recording, events, calls, attach_note


@pytest.fixture(scope="module")
def batched(tmp_path_factory):
    return record_program(tmp_path_factory.mktemp("gpu"))


@pytest.fixture(scope="module")
def loaded_later(tmp_path_factory):
    # --gpu: nothing is mapped at start; one event per launch, to test that mode too.
    return record_program(tmp_path_factory.mktemp("gpu_later"), "--gpu", "--gpu-launch-run", "1",
                          load_later=True)


def calls_of(events, fn: GpuFunction) -> list[GpuCallRecord]:
    return sorted((e for e in events if isinstance(e, GpuCallRecord) and e.function == fn),
                  key=lambda e: e.ts_ns)


def test_the_runtime_was_found_and_hooked(batched):
    recording, _, _, _ = batched
    active = recording.meta["probe_sets"]["active"]
    assert "gpu" in active and "libcudart" in active["gpu"]
    (att,) = recording.snapshots["gpu"]["attachments"]
    assert att["library"] == "libcudart" and att["path"].endswith("nvidia/cuda_runtime/lib/libcudart.so.12")
    assert not att["failed"]
    # the _ptsz/_ptds variants are separate entry points and hooked too
    assert {"cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaMemcpy_ptds"} <= set(att["symbols"])
    # DRM tracepoints this kernel has were compiled in and attached (the program loaded with them)
    present = sorted(tp for tp in DRM_TRACEPOINTS if (TRACEFS_EVENTS / tp).is_dir())
    assert recording.snapshots["gpu"]["drm_tracepoints"] == present


def test_call_counts_are_exact(batched):
    recording, events, calls, _ = batched
    made = Counter(FN_OF[c["fn"]] for c in calls)
    assert made[GpuFunction.CUDA_LAUNCH_KERNEL] == STEPS * LAUNCHES + TAIL
    stats = recording.snapshots["gpu"]["functions"]
    for fn, n in made.items():
        assert stats[fn.name]["calls"] == n, fn.name
        assert stats[fn.name]["nested"] == 0, fn.name  # no libcuda here: nothing nests
        # every call failed (no driver), and the kernel saw each failure
        assert stats[fn.name]["errors"] == sum(c["ret"] != 0 for c in calls if FN_OF[c["fn"]] == fn)
        if fn != GpuFunction.CUDA_LAUNCH_KERNEL:
            assert len(calls_of(events, fn)) == n, fn.name
    assert set(stats) == {fn.name for fn in made}


def test_arguments_and_return_codes_are_captured(batched):
    _, events, calls, _ = batched
    for fn in FN_OF.values():
        if fn == GpuFunction.CUDA_LAUNCH_KERNEL:
            continue
        mine = [c for c in calls if FN_OF[c["fn"]] == fn]
        traced = calls_of(events, fn)
        for c, t in zip(mine, traced, strict=True):
            assert t.ret == c["ret"] and t.ret != 0
            if fn == GpuFunction.CUDA_MEMCPY:
                assert (t.bytes, t.copy_kind) == (c["bytes"], GpuCopyKind(c["kind"]))
            if fn == GpuFunction.CUDA_MALLOC:
                assert t.bytes == c["bytes"] and t.addr == 0  # failed: no address to read back
            if fn == GpuFunction.CUDA_FREE:
                assert t.addr == c["addr"]
    kinds = Counter(t.copy_kind for t in calls_of(events, GpuFunction.CUDA_MEMCPY))
    assert kinds == {GpuCopyKind.DTOH: STEPS, GpuCopyKind.HTOD: 1, GpuCopyKind.DTOD: 1}


def test_traced_calls_lie_inside_the_callers_own_timing(batched):
    """Same clock on both sides: entry >= the caller's before, return <= its after.

    The caller's interval also holds ctypes' own work, so the traced duration
    is shorter; no tolerance is needed for the containment itself.
    """
    _, events, calls, _ = batched
    for fn in FN_OF.values():
        if fn == GpuFunction.CUDA_LAUNCH_KERNEL:
            continue
        mine = [c for c in calls if FN_OF[c["fn"]] == fn]
        for c, t in zip(mine, calls_of(events, fn), strict=True):
            assert c["before_ns"] <= t.ts_ns <= t.exit_ns <= c["after_ns"], fn.name
            assert 0 <= t.duration_ns <= c["after_ns"] - c["before_ns"]


def test_launches_are_summed_per_step(batched):
    recording, events, calls, _ = batched
    runs = sorted((e for e in events if isinstance(e, GpuLaunchesRecord)), key=lambda e: e.ts_ns)
    # one run per step, closed by that step's device-to-host copy
    assert [(r.kernels, r.graphs, r.reason) for r in runs] == [(LAUNCHES, 0, GpuFlushReason.CALL)] * STEPS
    for step, run in enumerate(runs):
        mine = [c for c in calls if c["fn"] == "cudaLaunchKernel" and c["step"] == step]
        assert mine[0]["before_ns"] <= run.ts_ns <= mine[0]["after_ns"]
        assert mine[-1]["before_ns"] <= run.last_ns <= mine[-1]["after_ns"]
        assert 0 < run.launch_ns <= sum(c["after_ns"] - c["before_ns"] for c in mine)
    # the tail launches had no call after them: still open at stop, kept in the snapshot
    (open_run,) = recording.snapshots["gpu"]["open_runs"]
    assert open_run["kernels"] == TAIL
    tail = [c for c in calls if c["fn"] == "cudaLaunchKernel" and c["step"] == STEPS]
    assert tail[0]["before_ns"] <= open_run["first_ns"] <= tail[0]["after_ns"]


def test_a_library_loaded_after_recording_started_is_attached(loaded_later):
    recording, events, calls, note = loaded_later
    assert "libcudart.so.12" in note
    assert "no CUDA library mapped yet" in recording.meta["probe_sets"]["active"]["gpu"]
    (att,) = recording.snapshots["gpu"]["attachments"]
    assert att["symbols"]
    stats = recording.snapshots["gpu"]["functions"]
    assert stats["CUDA_LAUNCH_KERNEL"]["calls"] == STEPS * LAUNCHES + TAIL
    assert len(calls_of(events, GpuFunction.CUDA_STREAM_SYNCHRONIZE)) == STEPS


def test_a_run_of_one_streams_every_launch(loaded_later):
    recording, events, calls, _ = loaded_later
    runs = sorted((e for e in events if isinstance(e, GpuLaunchesRecord)), key=lambda e: e.ts_ns)
    launches = [c for c in calls if c["fn"] == "cudaLaunchKernel"]
    open_runs = recording.snapshots["gpu"]["open_runs"]
    assert all(r.kernels == 1 for r in runs) and len(open_runs) == 1
    assert len(runs) + 1 == len(launches)
    for c, r in zip(launches, runs, strict=False):
        assert c["before_ns"] <= r.ts_ns == r.last_ns <= c["after_ns"]


def test_report_json_has_a_gpu_section(batched, tmp_path):
    recording, _, calls, _ = batched
    out = subprocess.run(inferprobe_cmd("report", str(recording.path), "--format", "json"),
                         capture_output=True, text=True, check=True).stdout
    gpu = json.loads(out)["gpu"]
    fns = gpu["functions"]
    assert fns["cudaLaunchKernel"]["calls"] == STEPS * LAUNCHES + TAIL
    memcpy = fns["cudaMemcpy"]
    assert memcpy["calls"] == STEPS + 2
    assert memcpy["bytes"] == sum(c["bytes"] for c in calls if c["fn"] == "cudaMemcpy")
    assert memcpy["library"] == "libcudart" and memcpy["category"] == "copy"
    mine = [c["after_ns"] - c["before_ns"] for c in calls if c["fn"] == "cudaStreamSynchronize"]
    sync = fns["cudaStreamSynchronize"]
    assert 0 <= sync["total_ns"] <= sum(mine) and 0 <= sync["p99_ns"] <= max(mine)
    (proc,) = gpu["processes"]
    assert proc["launches"] == STEPS * LAUNCHES + TAIL and proc["graph_launches"] == 0
    assert proc["copies"]["device_to_host"] == {"count": STEPS, "bytes": 4 * STEPS * (STEPS + 1) // 2}
    assert proc["allocations"]["count"] == 2 and proc["allocations"]["frees"] == 2
