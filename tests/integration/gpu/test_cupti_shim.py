"""The CUPTI shim in a real process on a host without a GPU, and `gpu-attach`'s refusals.

tests/programs/cuda_calls.py maps the real libcudart (nvidia-cuda-runtime
wheel). `inferprobe gpu-attach` loads the real shim, built against
NVIDIA's CUPTI headers and linked to the real libcupti, into it through gdb;
CUPTI there finds no device (no driver on this host) and the shim says so in
one sentence, which must come back twice: from gpu-attach (read through gdb
from the process) and through the shim's USDT status probe, bpf/gpu.bpf.c
and a recording. The shim's self-test (inferprobe_cupti_selftest(), called
through gdb while recording) sends one constructed kernel, copy and memset
record and one API call through the same code CUPTI's records take: every
field must arrive in the recording as the shim's source set it. Checked
from the shim's ELF notes: the probes and their argument counts that
gpu.bpf.c reads.

What needs a GPU (activity records, the clock pairing against real GPU
timestamps, the correlation join on real launches) is skipped here with its
reason; benchmarks/gpu_check.py runs it on a GPU machine (docs/gpu.md).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.support.kernel import needs_root
from tests.support.paths import REPO
from tests.support.processes import Recorder, inferprobe_cmd

pytest.importorskip(
    "nvidia.cuda_runtime",
    reason="the nvidia-cuda-runtime-cu12 wheel is not installed (pip install -e '.[test]')",
)

from inferprobe.collector.attach import cupti_attach  # noqa: E402
from inferprobe.collector.binaries import cupti_shim  # noqa: E402
from inferprobe.collector.errors import EnvironmentProblem  # noqa: E402
from inferprobe.collector.ingest import cupti_dump  # noqa: E402
from inferprobe.collector.model.events import (  # noqa: E402
    GpuActivityKind,
    GpuActivityRecord,
    GpuApiRecord,
    GpuClockRecord,
    GpuKernelNameRecord,
    GpuShimStatus,
    GpuShimStatusRecord,
    decode,
)
from inferprobe.collector.model.recording import Recording, read_recording  # noqa: E402

PROGRAM = REPO / "tests" / "programs" / "cuda_calls.py"
SHIM = cupti_shim.built_shim()
needs_shim = pytest.mark.skipif(SHIM is None, reason=f"the CUPTI shim is not built: {cupti_shim.BUILD_HINT}")


def gdb_cannot_call() -> str | None:
    """Why gdb cannot call a function in a process on this host, or None when it can."""
    if not os.path.exists(cupti_attach.GDB):
        return f"gdb is not installed ({cupti_attach.GDB})"
    try:
        cupti_attach.check_gdb_can_call()
    except EnvironmentProblem as err:
        return str(err)
    return None


GDB_CANNOT_CALL = gdb_cannot_call() if os.geteuid() == 0 else "needs root"
needs_gdb = pytest.mark.skipif(GDB_CANNOT_CALL is not None, reason=f"the shim is loaded through gdb: "
                               f"{GDB_CANNOT_CALL}")
NO_DEVICE = re.compile(
    r"^CUPTI found no CUDA device in pid (\d+)\b.*\(cuptiActivityEnable: CUPTI_ERROR_\w+\)$")


def host_has_gpu() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


class CudaProgram:
    """cuda_calls.py, idle after loading libcudart (it has made no call yet)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(PROGRAM), "--steps", "1", "--launches", "1"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("READY"), line
        self.pid = int(line.split()[1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=10)


def gpu_attach(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(inferprobe_cmd("gpu-attach", *args), capture_output=True, text=True, timeout=120)


def one_sentence(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("inferprobe: "), stderr
    return lines[0].removeprefix("inferprobe: ")


@pytest.fixture
def program():
    prog = CudaProgram()
    yield prog
    prog.close()


def test_the_shim_carries_the_probes_gpu_bpf_reads():
    if SHIM is None:
        pytest.skip(f"the CUPTI shim is not built: {cupti_shim.BUILD_HINT}")
    notes = subprocess.run(["readelf", "-n", str(SHIM)], capture_output=True, text=True, check=True).stdout
    found: dict[str, set[int]] = {}
    for provider, name, args in re.findall(r"Provider: (\S+)\n\s+Name: (\S+)\n.*?\n\s+Arguments: ([^\n]*)",
                                           notes, re.S):
        assert provider == cupti_shim.PROVIDER
        found.setdefault(name, set()).add(len(args.split()))
    # gpu.bpf.c's gpu_shim_<name> reads exactly these many arguments.
    assert found == {"api": {3}, "activity": {8}, "clock": {3}, "kernel_name": {2}, "status": {3}}
    # Semaphores: the untraced shim fires nothing.
    assert notes.count("Semaphore: 0x0000000000000000") == 0


@needs_shim
@needs_gdb
@needs_root
@pytest.mark.skipif(host_has_gpu(), reason="this host has a GPU: benchmarks/gpu_check.py is the check there")
def test_gpu_attach_loads_the_shim_and_cupti_says_there_is_no_device(program):
    done = gpu_attach("-p", str(program.pid))
    assert done.returncode == 4, (done.stdout, done.stderr)
    sentence = one_sentence(done.stderr)
    match = NO_DEVICE.match(sentence)
    assert match, sentence
    assert int(match.group(1)) == program.pid  # the process itself wrote it: its getpid()
    maps = Path(f"/proc/{program.pid}/maps").read_text()
    assert str(SHIM) in maps and "libcupti.so" in maps
    # The process still runs normally after the debugger left.
    program.proc.stdin.write("go\n")
    program.proc.stdin.flush()
    assert program.proc.stdout.readline().startswith("CALLS")
    # A second attach finds the shim loaded and gets the same verdict.
    again = gpu_attach("-p", str(program.pid))
    assert again.returncode == 4 and NO_DEVICE.match(one_sentence(again.stderr))
    # Detaching what never collected says so.
    off = gpu_attach("-p", str(program.pid), "--detach")
    assert off.returncode == 4
    assert one_sentence(off.stderr).startswith(f"CUPTI was not collecting in pid {program.pid}: ")


@needs_shim
@needs_root
@pytest.mark.skipif(GDB_CANNOT_CALL is None or not os.path.exists(cupti_attach.GDB),
                    reason="gdb can call into a process here: the refusal below is for hosts where it cannot")
def test_where_gdb_cannot_call_gpu_attach_refuses_before_touching_the_process(program):
    """On such a host (gdb 13 on an AMX CPU, as this VM) a failed call leaves the
    target's blocked read returning errno 512 to the program: the refusal must
    come from a throwaway process, before the real one is stopped."""
    done = gpu_attach("-p", str(program.pid))
    assert done.returncode != 0
    assert one_sentence(done.stderr).startswith("gdb cannot call a function in a process on this host: ")
    maps = Path(f"/proc/{program.pid}/maps").read_text()
    assert str(SHIM) not in maps
    # Untouched: its read of stdin still works.
    program.proc.stdin.write("go\n")
    program.proc.stdin.flush()
    assert program.proc.stdout.readline().startswith("CALLS")


class ShimRecording(NamedTuple):
    pid: int
    attach_stderr: str     # what gpu-attach said, before the recording started
    t_recording: int       # CLOCK_MONOTONIC just before the recorder started
    t_selftest: tuple[int, int]  # around the self-test call through gdb
    selftest_out: str      # gdb's output of that call
    mapped_shim: str | None  # cupti_shim.mapped_shim() while the program ran
    recording: Recording   # the recording, read back
    out_err: tuple[str, str]


@pytest.fixture(scope="module")
def shim_recording(tmp_path_factory) -> ShimRecording:
    """One recording of cuda_calls.py with the shim loaded, for the two tests that read one:
    started after gpu-attach reported (the status poller must send its sentence again) and,
    a second into it (five poll periods), the shim's self-test called through gdb."""
    program = CudaProgram()
    try:
        attach_stderr = gpu_attach("-p", str(program.pid)).stderr
        path = tmp_path_factory.mktemp("shim") / "shim.ipr"
        t_recording = time.monotonic_ns()
        rec = Recorder([program.pid], path, "--no-listen-check")
        time.sleep(1.0)
        t_before = time.monotonic_ns()
        shim = cupti_shim.mapped_shim(program.pid)
        out = cupti_attach._run_gdb(program.pid, cupti_attach._gdb_script(
            shim, cupti_attach.RTLD_NOW | cupti_attach.RTLD_NOLOAD, "inferprobe_cupti_selftest"), 60)
        t_after = time.monotonic_ns()
        time.sleep(0.3)
        out_err = rec.stop()
        return ShimRecording(program.pid, attach_stderr, t_recording, (t_before, t_after), out, shim,
                             read_recording(path), out_err)
    finally:
        program.close()


@needs_shim
@needs_gdb
@needs_root
@pytest.mark.bpf
@pytest.mark.skipif(host_has_gpu(), reason="this host has a GPU: benchmarks/gpu_check.py is the check there")
def test_the_no_device_sentence_reaches_a_recording_through_usdt_and_bpf(shim_recording):
    sentence, pid = one_sentence(shim_recording.attach_stderr), shim_recording.pid
    assert NO_DEVICE.match(sentence), sentence
    recording = shim_recording.recording
    statuses = [e for e in map(decode, recording.events) if isinstance(e, GpuShimStatusRecord)]
    assert statuses, shim_recording.out_err
    assert {s.text for s in statuses} == {sentence}
    assert all(s.status == GpuShimStatus.NO_DEVICE and s.pid == pid for s in statuses)
    assert all(s.cupti_result != 0 and s.ts_ns > shim_recording.t_recording for s in statuses)
    assert recording.snapshots["gpu"]["cupti_shim"] == {str(pid): shim_recording.mapped_shim}


@needs_shim
@needs_gdb
@needs_root
@pytest.mark.bpf
def test_every_field_of_the_shims_records_reaches_a_recording(shim_recording):
    pid, (t_before, t_after) = shim_recording.pid, shim_recording.t_selftest
    assert "inferprobe-status 4 " in shim_recording.selftest_out, shim_recording.selftest_out
    events = list(map(decode, shim_recording.recording.events))
    api = [e for e in events if isinstance(e, GpuApiRecord)]
    activity = sorted((e for e in events if isinstance(e, GpuActivityRecord)), key=lambda e: e.correlation_id)
    names = {e.name_id: e.name for e in events if isinstance(e, GpuKernelNameRecord)}
    # The API call fired on the thread gdb called into (the main thread), during the call.
    assert [(a.correlation_id, a.cbid, a.domain, a.tid) for a in api] == [(41, 211, 2, pid)]
    assert t_before < api[0].ts_ns < t_after
    kernel, copy, memset = activity
    assert (kernel.kind, kernel.gpu_start, kernel.gpu_end, kernel.correlation_id, kernel.device,
            kernel.stream, kernel.grid) == (GpuActivityKind.KERNEL, 1_000_000, 1_250_000, 41, 0, 7,
                                            (128, 2, 1))
    assert names[kernel.name_id] == "inferprobe_selftest_kernel"
    assert (copy.kind, copy.gpu_start, copy.gpu_end, copy.correlation_id, copy.shape, copy.name_id) == (
        GpuActivityKind.MEMCPY, 1_300_000, 1_310_000, 42, 4096, 2)  # 2: CUPTI_ACTIVITY_MEMCPY_KIND_DTOH
    assert (memset.kind, memset.gpu_start, memset.gpu_end, memset.correlation_id, memset.shape) == (
        GpuActivityKind.MEMSET, 1_320_000, 1_321_000, 43, 512)
    assert all(e.pid == pid and t_before < e.ts_ns < t_after for e in activity)


@needs_shim
def test_the_dump_file_carries_the_records_the_probes_carry(tmp_path):
    """INFERPROBE_CUPTI_DUMP (for GPU hosts without BPF, benchmarks/gpu_check.py): the shim's own
    self-test records, read back through collector/ingest/cupti_dump.py, equal what the probes carry."""
    dump = tmp_path / "shim.dump"
    code = (f"import ctypes, os, time; lib = ctypes.CDLL({str(SHIM)!r}); "
            "print(lib.inferprobe_cupti_start()); lib.inferprobe_cupti_selftest(); time.sleep(1.3); "
            "print(os.getpid())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "INFERPROBE_CUPTI_DUMP": str(dump)})
    status_code, pid = map(int, done.stdout.split())
    assert status_code == GpuShimStatus.NO_DEVICE
    records = cupti_dump.read_dump(dump, pid)
    (api,) = [r for r in records if isinstance(r, GpuApiRecord)]
    assert (api.correlation_id, api.cbid, api.domain, api.tid) == (41, 211, 2, pid)
    kinds = sorted((a.kind, a.gpu_start, a.gpu_end, a.correlation_id, a.shape)
                   for a in records if isinstance(a, GpuActivityRecord))
    assert kinds == [(GpuActivityKind.KERNEL, 1_000_000, 1_250_000, 41, 128 | 2 << 21 | 1 << 42),
                     (GpuActivityKind.MEMCPY, 1_300_000, 1_310_000, 42, 4096),
                     (GpuActivityKind.MEMSET, 1_320_000, 1_321_000, 43, 512)]
    assert {r.name for r in records if isinstance(r, GpuKernelNameRecord)} == {"inferprobe_selftest_kernel"}
    statuses = {r.text for r in records if isinstance(r, GpuShimStatusRecord)}
    assert len(statuses) == 1 and NO_DEVICE.match(statuses.pop())
    clocks = [r for r in records if isinstance(r, GpuClockRecord)]
    assert clocks and all(c.mono_before_ns <= c.mono_after_ns for c in clocks)


@needs_shim
@needs_gdb
@needs_root
def test_gpu_attach_refuses_a_process_without_cuda():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        done = gpu_attach("-p", str(sleeper.pid))
        assert done.returncode == 4
        assert one_sentence(done.stderr) == (
            f"pid {sleeper.pid} has no CUDA library mapped (libcudart, libcuda): it has not used CUDA, "
            "so there is nothing for CUPTI to trace")
        assert str(SHIM) not in Path(f"/proc/{sleeper.pid}/maps").read_text()
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()


def test_gpu_attach_refuses_a_dead_pid():
    dead = subprocess.Popen(["true"])
    dead.wait()
    done = gpu_attach("-p", str(dead.pid))
    assert done.returncode == 4
    assert one_sentence(done.stderr) == f"no process with pid {dead.pid} (has it exited?)"


def test_gpu_attach_refuses_when_the_shim_is_not_built(program, tmp_path):
    env = {**os.environ, "INFERPROBE_CUPTI_SHIM": str(tmp_path / "missing.so")}
    done = subprocess.run(inferprobe_cmd("gpu-attach", "-p", str(program.pid)), capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 3
    assert one_sentence(done.stderr) == f"the CUPTI shim is not built: {cupti_shim.BUILD_HINT}"


@pytest.mark.skipif(not host_has_gpu(), reason="needs an NVIDIA GPU: CUPTI records what a GPU ran, and this "
                    "host has none (benchmarks/gpu_check.py is the prepared check, docs/gpu.md)")
@needs_shim
@needs_root
def test_activity_records_of_a_real_gpu_agree_with_torch_profiler():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--shim"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
