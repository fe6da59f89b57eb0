"""bpf/llama.bpf.c against a program exporting llama.cpp's llama_decode with
known batches: what the kernel read (runs, positions, sampled flags, the
step's entry and return times) against what the program passed and timed
itself on the same CLOCK_MONOTONIC."""

from __future__ import annotations

import subprocess

from inferprobe.collector.events import LlamaRunRecord, LlamaStepPhase, LlamaStepRecord

from tests.programs.build import build
from tests.support.kernel import KernelCapture, needs_root

pytestmark = needs_root


def test_each_decode_call_is_one_step_with_its_batch_as_runs(tmp_path):
    exe = build("fake_llama", tmp_path)
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().startswith("READY")
        with KernelCapture(proc.pid, sets=("llama",)) as cap:
            assert "llama" in cap.tracer.active, cap.tracer.inactive
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out, _ = proc.communicate(timeout=20)
            events, counters = cap.finish()
    finally:
        if proc.poll() is None:
            proc.kill()
    calls = [line.split() for line in out.splitlines() if line.startswith("call ")]
    assert len(calls) == 3
    steps = [e for e in events if isinstance(e, LlamaStepRecord)]
    enters = [e for e in steps if e.phase == LlamaStepPhase.ENTER]
    returns = [e for e in steps if e.phase == LlamaStepPhase.RETURN]
    assert len(enters) == len(returns) == 3, steps
    expected = [
        (LlamaRunRecord(0, 0, 37, True),),
        (LlamaRunRecord(0, 37, 1, True), LlamaRunRecord(1, 0, 1500, False)),
        (LlamaRunRecord(0, 38, 1, True), LlamaRunRecord(1, 1500, 12, True), LlamaRunRecord(2, 5, 3, True)),
    ]
    for enter, ret, call, runs in zip(enters, returns, calls, expected, strict=True):
        n_tokens, t_call, t_back, rc = int(call[1]), int(call[2]), int(call[3]), int(call[4])
        assert enter.n_tokens == n_tokens and enter.runs == runs and not enter.truncated
        assert enter.ctx == 0x1234
        # the program's own clock brackets the kernel's, both CLOCK_MONOTONIC
        assert t_call <= enter.ts_ns <= ret.ts_ns <= t_back
        assert ret.ret == rc == 0
        assert ret.ts_ns - enter.ts_ns >= 2_000_000  # the 2 ms the call sleeps
    assert counters["events_lost"] == 0


def test_a_process_without_llama_decode_leaves_the_set_off(tmp_path):
    exe = build("burn", tmp_path)
    proc = subprocess.Popen([str(exe), "1"], stdout=subprocess.PIPE, text=True)
    try:
        with KernelCapture(proc.pid, sets=("llama",)) as cap:
            assert "llama" not in cap.tracer.active
            assert "llama_decode" in cap.tracer.inactive["llama"]
    finally:
        proc.kill()
        proc.wait()


def test_doctor_says_llama_cpp_was_found_and_is_hooked(tmp_path):
    from tests.support.cli import run_doctor

    exe = build("fake_llama", tmp_path)
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
        out = run_doctor("-p", str(proc.pid)).stdout
    finally:
        proc.kill()
        proc.wait()
    assert f"llama.cpp: llama_decode in {exe}: hooks it" in " ".join(out.split())
