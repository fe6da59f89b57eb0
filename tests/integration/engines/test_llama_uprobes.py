"""bpf/llama.bpf.c against programs exporting llama.cpp's C API with known
batches: llama_decode by value (fake_llama.c), and llama_process with its
batch read through llama_batch_allocr (fake_llama_process.c). What the
kernel read (runs, positions, sampled flags, the step's entry and return
times, llama_synchronize's wait) against what the program passed and timed
itself on the same CLOCK_MONOTONIC."""

from __future__ import annotations

import subprocess

import pytest

from inferprobe.collector.ingest.llama_view import SYNC_WAITED_NS, pair_steps
from inferprobe.collector.model.events import LlamaRunRecord, LlamaStepPhase, LlamaStepRecord

from tests.programs.build import build
from tests.support.kernel import KernelCapture, needs_root

pytestmark = needs_root


@pytest.fixture(scope="module")
def both_apis(tmp_path_factory) -> dict:
    """fake_llama (llama_decode) and fake_llama_process (llama_process) under one capture, run
    one after the other: one BPF compile for both (~10 s each on 2 cores); each test reads its
    own program's events by pid."""
    tmp = tmp_path_factory.mktemp("llama")
    procs = {name: subprocess.Popen([str(build(name, tmp))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True) for name in ("fake_llama", "fake_llama_process")}
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
        with KernelCapture([proc.pid for proc in procs.values()], sets=("llama",)) as cap:
            llama_active, inactive = "llama" in cap.tracer.active, cap.tracer.inactive
            outputs = {}
            for name, proc in procs.items():
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                outputs[name] = proc.communicate(timeout=20)[0]
            events, counters = cap.finish()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return {"pids": {name: proc.pid for name, proc in procs.items()}, "outputs": outputs,
            "events": events, "counters": counters, "llama_active": llama_active, "inactive": inactive}


def _steps_of(both_apis: dict, name: str) -> tuple[list[LlamaStepRecord], str]:
    """(the step events of that program, what it printed)"""
    assert both_apis["llama_active"], both_apis["inactive"]
    pid = both_apis["pids"][name]
    steps = [e for e in both_apis["events"] if isinstance(e, LlamaStepRecord) and e.pid == pid]
    return steps, both_apis["outputs"][name]


def test_each_decode_call_is_one_step_with_its_batch_as_runs(both_apis):
    steps, out = _steps_of(both_apis, "fake_llama")
    calls = [line.split() for line in out.splitlines() if line.startswith("call ")]
    assert len(calls) == 3
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
    assert both_apis["counters"]["events_lost"] == 0


def test_llama_process_steps_are_read_where_llama_batch_allocr_built_the_batch(both_apis):
    steps, out = _steps_of(both_apis, "fake_llama_process")
    lines = [line.split() for line in out.splitlines()]
    calls = [line for line in lines if line[0] == "call"]
    syncs = [line for line in lines if line[0] == "sync"]
    assert [c[1] for c in calls] == ["process", "process", "decode", "process"]
    assert calls[-1][5] == "-1"  # the empty batch: init refused it
    enters = [e for e in steps if e.phase == LlamaStepPhase.ENTER]
    returns = [e for e in steps if e.phase == LlamaStepPhase.RETURN]
    synced = [e for e in steps if e.phase == LlamaStepPhase.SYNC]
    # three steps: the failed call sends nothing; the llama_decode caller is one step, not two
    assert len(enters) == len(returns) == 3, steps
    expected = [
        (LlamaRunRecord(0, 0, 37, True),),
        (LlamaRunRecord(0, 37, 1, True), LlamaRunRecord(1, 0, 1500, False)),
        (LlamaRunRecord(0, 38, 1, True), LlamaRunRecord(1, 1500, 12, True), LlamaRunRecord(2, 5, 3, True)),
    ]
    for enter, ret, call, runs in zip(enters, returns, calls[:3], expected, strict=True):
        n_tokens, t_call, t_back = int(call[2]), int(call[3]), int(call[4])
        assert enter.n_tokens == n_tokens and enter.runs == runs and not enter.truncated
        assert enter.ctx == 0x1234
        # the entry event carries the public call's entry time, though sent from inside it
        assert t_call <= enter.ts_ns <= ret.ts_ns <= t_back
        assert ret.ret == 0
        assert ret.ts_ns - enter.ts_ns >= 2_000_000
    assert len(synced) == len(syncs) == 2
    for ev, (_, t0, t1) in zip(synced, syncs, strict=True):
        assert ev.ctx == 0x1234 and int(t0) <= ev.ts_ns - ev.ret and ev.ts_ns <= int(t1)
    assert synced[0].ret < 1_000_000 and synced[1].ret >= 5_000_000
    # the view: the sync that waited ends the second step at its return. The one with nothing to wait
    # for is judged by what the kernel measured of it: uprobe, uretprobe and a preemption on a loaded
    # host can stretch an empty call past SYNC_WAITED_NS (seen at ~30 us in CI), and then the view
    # rightly ends the first step there too.
    paired = pair_steps(steps)
    first_waited = synced[0].ret >= SYNC_WAITED_NS
    assert [s.synced for s in paired] == [first_waited, True, False]
    assert paired[0].t_end_ns == (synced[0].ts_ns if first_waited else returns[0].ts_ns)
    assert paired[1].t_end_ns == synced[1].ts_ns
    assert both_apis["counters"]["events_lost"] == 0


def test_a_process_without_llama_decode_leaves_the_set_off(tmp_path):
    # Any C program with a full symbol table and no llama.cpp export; an idle one,
    # since a CPU burner's threads would slow the BPF compile three-fold on 2 cores.
    exe = build("sleeper", tmp_path)
    proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
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


def test_doctor_names_the_llama_process_api(tmp_path):
    from tests.support.cli import run_doctor

    exe = build("fake_llama_process", tmp_path)
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
        out = run_doctor("-p", str(proc.pid)).stdout
    finally:
        proc.kill()
        proc.wait()
    assert f"llama.cpp: llama_process in {exe}: hooks it" in " ".join(out.split())
