"""On-CPU and off-CPU stacks from real BPF on real processes, compared with
what the traced programs measured themselves."""

from __future__ import annotations

import json
import math
import platform
import re
import subprocess
from pathlib import Path

import pytest

from inferprobe.analyzers import stack_fold as fold
from inferprobe.collector.model.events import OffcpuReason, OffcpuRecord, decode
from inferprobe.collector.model.recording import read_recording

from tests.programs.build import Program, build
from tests.support.kernel import needs_root
from tests.support.processes import Recorder, inferprobe_cmd
from tests.support.pythons import PY312

pytestmark = [needs_root, pytest.mark.bpf]


def _record(pid: int, out: Path, seconds: float, *flags: str, burner: Program | None = None) -> dict:
    rec = Recorder([pid], out, "--no-listen-check", "--no-usdt", "-d", str(seconds), *flags)
    if burner is not None:
        burner.go()  # held until now: its four threads would slow the recorder's compile three-fold
    rec.proc.wait(timeout=seconds + 60)
    assert rec.proc.returncode == 0, rec.proc.stderr.read()
    return read_recording(out).snapshots


def test_on_cpu_shares_match_the_programs_own_cpu_clock(tmp_path):
    prog = Program(build("burn", tmp_path), "--hold")
    try:
        snaps = _record(prog.pid, tmp_path / "burn.ipr", 5, "--profile", "--profile-hz", "299", burner=prog)
    finally:
        out = prog.stop()
    truth = {k: float(v) for k, v in re.findall(r"(burn_[abc])=([\d.]+)", out)}
    snap = snaps["profile"]
    assert snap["hz"] == 299
    stacks = fold.from_snapshot(snap)
    sampled = {name: sum(w for frames, w in stacks.items() if name in frames) for name in truth}
    n = sum(sampled.values())
    assert n >= 150, f"only {n} samples in the three functions in 5 s at 299 Hz"
    for name in truth:
        want = 100 * truth[name] / sum(truth.values())
        got = 100 * sampled[name] / n
        # Sampling is counting: with n samples a share p wobbles by sqrt(p(1-p)/n),
        # 4 points at n=150. Allow 5 points or four of those, whichever is wider.
        sigma = 100 * math.sqrt(want / 100 * (1 - want / 100) / n)
        tolerance = max(5.0, 4 * sigma)
        assert abs(got - want) <= tolerance, (
            f"{name}: sampled {got:.1f} % of {n}, program measured {want:.1f} % (tolerance {tolerance:.1f})")
    # names resolved from the ELF symbol table, whole frame-pointer stacks
    burn_stacks = [f for f in stacks if "burn_a" in f]
    assert burn_stacks and all("start_thread" in f and "[truncated]" not in f for f in burn_stacks)
    # Stack ids are hashed into 16384 slots: with a few hundred distinct stacks
    # (kernel stacks vary per interrupted instruction) a collision or two is
    # the birthday paradox, not a bug. They are counted and shown; keep them rare.
    counters = snap["counters"]
    assert counters["collisions"] <= 0.01 * counters["samples"], counters


def _sleeper_mean_us(out: str) -> float:
    """What sleeper.c measured itself: the mean of its sleeps, in microseconds."""
    return float(re.search(r"periods=\d+ mean_us=([\d.]+)", out).group(1))


def _sleep_waits(snap: dict) -> list[dict]:
    """The off-CPU stacks blocked in the sleep itself (not preempted somewhere inside the function)."""
    return [s for s in snap["stacks"] if "wait_for_batch" in s["frames"] and not s["flags"]]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="sleeper.c makes its syscall in x86-64 assembly")
def test_off_cpu_sleep_shows_with_its_weight(tmp_path):
    prog = Program(build("sleeper", tmp_path))
    try:
        snaps = _record(prog.pid, tmp_path / "sleep.ipr", 3, "--offcpu")
    finally:
        out = prog.stop()
    mean_us = _sleeper_mean_us(out)
    snap = snaps["offcpu"]
    assert snap["unit"] == "us"
    waits = _sleep_waits(snap)
    assert waits, f"no off-CPU stack through wait_for_batch: {[s['frames'] for s in snap['stacks']][:5]}"
    periods = sum(s["periods"] for s in waits)
    weight_us = sum(s["weight"] for s in waits)
    # 3 s of 200 ms sleeps plus ~a few ms of work each: 13 to 15 whole periods
    assert 12 <= periods <= 15, periods
    # a 200 ms nanosleep blocks at least 200 ms; run-queue delay after the wake-up is
    # off-CPU time too, small unless the machine is very busy
    assert 200_000 <= weight_us / periods <= 200_000 * 1.03
    # the program's own clock also counts syscall entry/exit and preemptions after the
    # wake-up (kept apart as [preempted] periods): the same within 5 %
    assert weight_us / periods == pytest.approx(mean_us, rel=0.05)
    leafward = waits[0]["frames"]
    assert any(f.endswith("_[k]") for f in leafward), "no kernel frames under the sleep"
    assert leafward.index("wait_for_batch") < leafward.index("do_nanosleep_[k]") if (
        "do_nanosleep_[k]" in leafward) else True


def _programs_on_tracepoints(pid: int) -> list[str]:
    """The tracepoints of the BPF programs process pid has attached, one entry per
    program, as the kernel lists them (bpftool perf: each perf event's program)."""
    listed = subprocess.run(["bpftool", "-j", "perf", "show"], capture_output=True, text=True, check=True)
    return [e["tracepoint"] for e in json.loads(listed.stdout or "[]")
            if e.get("pid") == pid and e.get("fd_type") == "tracepoint"]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="sleeper.c makes its syscall in x86-64 assembly")
def test_the_profile_and_the_lock_set_share_one_off_cpu_tracker(tmp_path):
    """--offcpu --locks: one sched_switch program (bpf/offcpu.bpf.c) gives both the
    profile's weights and the lock set's off-CPU events, and each agrees with the
    program's own clock."""
    prog = Program(build("sleeper", tmp_path))
    out_path = tmp_path / "both.ipr"
    try:
        rec = Recorder([prog.pid], out_path, "--no-listen-check", "--no-usdt", "-d", "3",
                       "--offcpu", "--locks")
        attached = _programs_on_tracepoints(rec.proc.pid)
        rec.proc.wait(timeout=60)
        assert rec.proc.returncode == 0, rec.proc.stderr.read()
    finally:
        out = prog.stop()
    assert attached.count("sched_switch") == 1, attached
    assert attached.count("sched_waking") == 1, attached
    mean_us = _sleeper_mean_us(out)
    recording = read_recording(out_path)
    waits = _sleep_waits(recording.snapshots["offcpu"])
    profiled = sum(s["periods"] for s in waits)
    assert 12 <= profiled <= 15, profiled
    assert sum(s["weight"] for s in waits) / profiled == pytest.approx(mean_us, rel=0.05)
    # The lock set's events of the same sleeps: a nanosleep is an interruptible sleep, not a futex
    # wait, and each blocks its 200 ms (less the microseconds between arming the timer and the
    # switch-out, which the timer's slack may not make up: 100 us allowed); the program's own
    # mean, within 5 %.
    sleeps = [e for e in map(decode, recording.events)
              if isinstance(e, OffcpuRecord) and e.pid == prog.pid and e.blocked_ns >= 150_000_000]
    assert 12 <= len(sleeps) <= 15, len(sleeps)
    assert {e.reason for e in sleeps} == {OffcpuReason.SLEEP}
    blocked = [e.blocked_ns for e in sleeps]
    assert all(199_900_000 <= ns <= 200_000_000 * 1.03 for ns in blocked), blocked
    mean_event_us = sum(e.blocked_ns + e.runq_ns for e in sleeps) / len(sleeps) / 1000
    assert mean_event_us == pytest.approx(mean_us, rel=0.05)


def _has_frame_pointers(python: str) -> bool:
    cflags = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('CFLAGS'))"],
                            capture_output=True, text=True).stdout
    return "-fno-omit-frame-pointer" in cflags


@pytest.mark.skipif(PY312 is not None and not _has_frame_pointers(PY312),
                    reason=f"{PY312} was built without -fno-omit-frame-pointer: its frame-pointer stacks "
                    "stop inside the interpreter loop before reaching any perf-trampoline frame, so "
                    "no Python name can appear (CPython docs: build with CFLAGS=-fno-omit-frame-pointer)")
@pytest.mark.skipif(PY312 is None, reason="no CPython 3.12+ on this host (Debian 12 ships 3.11 and "
                    "this machine reaches no python.org or GitHub builds): the perf trampoline "
                    "cannot be exercised; the perf map reader is covered by "
                    "tests/unit/collector/binaries/test_symbolizer.py")
def test_python_perf_trampoline_names_python_functions(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text(
        "import os, sys, time\n"
        "def inner_python_spin(n):\n    s = 0\n    for i in range(n):\n        s += i * i\n    return s\n"
        "def outer_python_loop():\n    while True:\n        inner_python_spin(100000)\n"
        "print('READY', os.getpid(), flush=True)\nouter_python_loop()\n"
    )
    proc = subprocess.Popen([PY312, "-X", "perf", str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("READY")
        snaps = _record(proc.pid, tmp_path / "py.ipr", 3, "--profile", "--profile-hz", "299")
    finally:
        proc.kill()
        proc.wait()
    frames = {f for s in snaps["profile"]["stacks"] for f in s["frames"]}
    assert any(f.startswith("py::") and "inner_python_spin" in f for f in frames), sorted(frames)[:20]
    # a 3.12 is walked from its thread states too (tests/integration/bpf/test_python_frames.py),
    # which then stand in for the perf map's names
    assert snaps["profile"]["processes"][str(proc.pid)]["python"] in ("perf-map", "frames")


def test_record_help_says_what_stack_capture_costs():
    out = subprocess.run(inferprobe_cmd("record", "--help"), capture_output=True, text=True).stdout
    flat = " ".join(out.split())
    assert "--profile" in flat and "--offcpu" in flat and "Cost:" in flat
