"""Python frames walked in BPF on stock CPython builds (no -X perf, no frame pointers),
compared with what the Python program measured itself (time.thread_time per function)."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferprobe.analyzers import stack_fold as fold
from inferprobe.collector.model.recording import read_recording

from tests.support.cli import json_report
from tests.support.kernel import needs_root
from tests.support.paths import SERVERS
from tests.support.processes import ListeningProgram, Recorder

pytestmark = [needs_root, pytest.mark.bpf]

BURNER = Path(__file__).resolve().parents[2] / "programs" / "python_burn.py"
PYENV = Path("/root/.pyenv/versions")


def _pyenv(minor: str) -> str | None:
    found = sorted(PYENV.glob(f"3.{minor}.*/bin/python3.{minor}"))
    return str(found[-1]) if found else None


INTERPRETERS = {
    "debian-3.11": "/usr/bin/python3" if Path("/usr/bin/python3").exists() else None,
    "pyenv-3.10": _pyenv("10"),
    "pyenv-3.11": _pyenv("11"),
    "pyenv-3.12": _pyenv("12"),
    "pyenv-3.13": _pyenv("13"),
}


def _python_function(frames: tuple[str, ...]) -> str | None:
    """The innermost Python frame's function name (py::NAME:FILE:LINE)."""
    for frame in reversed(frames):
        if frame.startswith("py::"):
            return frame[4:].split(":")[0]
    return None


def _start(python: str, *args: str) -> subprocess.Popen:
    """The burner, held (--hold) until _record() has the recorder attached: a burner
    running meanwhile takes a core from the recorder's BPF compile."""
    proc = subprocess.Popen([python, str(BURNER), "--hold", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY"), line
    return proc


def _go(burner: subprocess.Popen) -> None:
    burner.stdin.write("go\n")
    burner.stdin.flush()


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return out


def _record(pid: int, out: Path, seconds: float, during=None, flags=("--profile", "--profile-hz", "299"),
            snapshot="profile", burner: subprocess.Popen | None = None) -> dict:
    rec = Recorder([pid], out, "--no-listen-check", "--no-usdt", "-d", str(seconds), *flags)
    if burner is not None:
        _go(burner)
    if during is not None:
        during()
    rec.proc.wait(timeout=seconds + 60)
    assert rec.proc.returncode == 0, rec.proc.stderr.read()
    return read_recording(out).snapshots[snapshot]


BURN_S = 5


@pytest.fixture(scope="module")
def burned(tmp_path_factory) -> dict:
    """Every interpreter's burner under one recorder (its compile and attach is most of a case's
    time), each burning BURN_S alone in turn, then stopped (SIGSTOP: it stays alive, so that its
    stacks are resolved at the end like any target's): name -> (pid, what it measured itself);
    "snapshot": the recording's profile."""
    found = {name: python for name, python in INTERPRETERS.items() if python is not None}
    burners: dict[str, subprocess.Popen] = {}
    out = tmp_path_factory.mktemp("python-shares") / "py.ipr"
    try:
        for name, python in found.items():
            burners[name] = _start(python)
        rec = Recorder([b.pid for b in burners.values()], out, "--no-listen-check", "--no-usdt", "-d", "300",
                       "--profile", "--profile-hz", "299")
        try:
            for burner in burners.values():
                _go(burner)
                time.sleep(BURN_S)
                burner.send_signal(signal.SIGSTOP)
        finally:
            _, err = rec.stop()
        assert rec.proc.returncode == 0, err
        measured = {}
        for name, burner in burners.items():
            burner.send_signal(signal.SIGTERM)   # taken as it continues: it burns no further
            burner.send_signal(signal.SIGCONT)
            measured[name] = (burner.pid, burner.communicate(timeout=30)[0])
    finally:
        for burner in burners.values():
            if burner.poll() is None:
                burner.kill()
    return {"burners": measured, "snapshot": read_recording(out).snapshots["profile"]}


@pytest.mark.parametrize("name", list(INTERPRETERS))
def test_python_function_shares_match_the_programs_thread_time(burned, name):
    if name not in burned["burners"]:
        pytest.skip(f"no {name} interpreter on this host")
    pid, out = burned["burners"][name]
    whole = burned["snapshot"]
    snap = {**whole, "stacks": [s for s in whole["stacks"] if s["pid"] == pid]}
    truth = {k: float(v) for k, v in re.findall(r"(burn_[abc])=([\d.]+)", out)}
    assert set(truth) == {"burn_a", "burn_b", "burn_c"}, out
    info = snap["processes"][str(pid)]
    assert info["python"] == "frames", info
    stacks = fold.from_snapshot(snap)
    total = sum(stacks.values())
    with_python = sum(w for frames, w in stacks.items() if any(f.startswith("py::") for f in frames))
    # a busy 2-core host gives the burner less than a CPU: the tolerance below widens with fewer samples
    assert total >= 200, f"only {total} samples in {BURN_S} s at 299 Hz"
    assert with_python >= 0.8 * total, f"{with_python} of {total} samples carry a Python frame"
    sampled = {k: 0 for k in truth}
    for frames, w in stacks.items():
        fn = _python_function(frames)
        if fn in sampled:
            sampled[fn] += w
    n = sum(sampled.values())
    for fn in truth:
        want = 100 * truth[fn] / sum(truth.values())
        got = 100 * sampled[fn] / n
        sigma = 100 * math.sqrt(want / 100 * (1 - want / 100) / n)
        assert abs(got - want) <= max(5.0, 4 * sigma), (
            f"{name} {fn}: {got:.1f} % of {n} samples, the program measured {want:.1f} %")
    # the caller is there too, whole: the module frame under each burner
    burn_c = [frames for frames in stacks if _python_function(frames) == "burn_c"]
    assert all(any(f.startswith("py::<module>:") for f in frames) for frames in burn_c)
    assert snap["counters"]["python_lost"] <= 0.01 * snap["counters"]["samples"], snap["counters"]


def test_a_thread_started_after_attach_gets_python_frames(tmp_path):
    python = INTERPRETERS["debian-3.11"] or INTERPRETERS["pyenv-3.11"]
    if python is None:
        pytest.skip("no CPython 3.11 on this host")
    proc = _start(python, "--late-thread")
    seconds = 5.0

    def start_thread_now():
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGUSR1)

    try:
        snap = _record(proc.pid, tmp_path / "late.ipr", seconds, start_thread_now, burner=proc)
    finally:
        out = _stop(proc)
    late_tid = int(re.search(r"late_tid=(\d+)", out).group(1))
    late = [s for s in snap["stacks"] if s["tid"] == late_tid]
    total = sum(s["weight"] for s in late)
    def names_its_code(sample: dict) -> bool:
        return any(f.startswith(("py::_spin:", "py::burn_late:")) for f in sample["frames"])

    named = sum(s["weight"] for s in late if names_its_code(s))
    assert total > 50, f"only {total} samples of the late thread"
    # BPF finds a new thread's state in the interpreter's thread list at its first sample
    # (bpf/python_stacks.bpf.c): every sample names the thread's own Python code, _spin or, while
    # it takes the GIL back after sleep(0) (on CPU for longer on a loaded host), burn_late; only
    # the thread's start in threading's bootstrap may precede them
    unnamed = [s["frames"] for s in late if not names_its_code(s)]
    assert named >= 0.9 * total, f"{named} of {total} samples of the late thread name its code: {unnamed[:5]}"


def test_an_interpreter_started_after_attach_gets_python_frames(tmp_path):
    python = INTERPRETERS["pyenv-3.12"] or INTERPRETERS["debian-3.11"]
    if python is None:
        pytest.skip("no CPython 3.11/3.12 on this host")
    # a parent that starts a burner interpreter when told to (SIGUSR1), after the tracer attached
    parent_src = (
        "import os, signal, subprocess, sys, time\n"
        f"burner = {str(BURNER)!r}\n"
        "def spawn(*_):\n"
        "    child = subprocess.Popen([sys.executable, burner], stdout=subprocess.DEVNULL)\n"
        "    print(f'child={child.pid}', flush=True)\n"
        "signal.signal(signal.SIGUSR1, spawn)\n"
        "print('READY', os.getpid(), flush=True)\n"
        "while True:\n    time.sleep(1)\n"
    )
    proc = subprocess.Popen([python, "-c", parent_src], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("READY")
    child = []

    def spawn_now():
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGUSR1)
        child.append(int(proc.stdout.readline().split("=")[1]))

    try:
        snap = _record(proc.pid, tmp_path / "child.ipr", 5, spawn_now)
    finally:
        for pid in child:
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    stacks = [s for s in snap["stacks"] if s["pid"] == child[0]]
    total = sum(s["weight"] for s in stacks)
    named = sum(s["weight"] for s in stacks if _python_function(tuple(s["frames"])) in ("burn_a", "burn_b",
                                                                                         "burn_c"))
    assert total > 200, f"only {total} samples of the child interpreter"
    # the new process is found by the once-a-second refresh (and its start-up runs no burner)
    assert named >= 0.6 * total, f"{named} of {total} samples of the child name a burner"
    assert snap["processes"][str(child[0])]["python"] == "frames"


def test_a_process_that_execs_python_after_attach_gets_python_frames_and_says_since_when(tmp_path):
    """The recorder attached to a pid that was not a CPython yet: a launcher between fork and
    exec (pyenv's shim, a wrapper script; on a loaded host for seconds). It was taken as no
    Python for the whole recording, 0 % of its samples named, with a note blaming the version.
    Now it is walked once it is one, and the recording and the report say from when and why
    not before."""
    python = INTERPRETERS["pyenv-3.11"] or INTERPRETERS["debian-3.11"]  # pyenv's maps libpython late
    if python is None:
        pytest.skip("no CPython 3.11 on this host")
    launcher = subprocess.Popen(["bash", "-c", f"read go; exec {python} {BURNER}"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, text=True)
    out = tmp_path / "exec.ipr"
    try:
        rec = Recorder([launcher.pid], out, "--no-listen-check", "--no-usdt", "-d", "5",
                       "--profile", "--profile-hz", "299")
        launcher.stdin.write("go\n")   # exec the interpreter now, after attach
        launcher.stdin.flush()
        rec.proc.wait(timeout=65)
        assert rec.proc.returncode == 0, rec.proc.stderr.read()
    finally:
        launcher.kill()
        launcher.wait()
    snap = read_recording(out).snapshots["profile"]
    info = snap["processes"][str(launcher.pid)]
    assert info["python"] == "frames", info
    assert "its executable was /usr/bin/bash" in info["python_unwalked_before"], info
    assert 0 < info["python_walked_from_s"] < 4, info
    stacks = [s for s in snap["stacks"] if s["pid"] == launcher.pid]
    total = sum(s["weight"] for s in stacks)
    named = sum(s["weight"] for s in stacks if _python_function(tuple(s["frames"])) in ("burn_a", "burn_b",
                                                                                        "burn_c"))
    # walked from the first refresh after the exec (about a second): most of the 5 s
    assert total > 200 and named >= 0.5 * total, (named, total)
    (proc,) = [p for p in json_report(out)["stacks"]["cpu"]["processes"] if p["pid"] == launcher.pid]
    assert proc["walked_from_s"] == info["python_walked_from_s"] and "bash" in proc["unwalked_before"], proc
    # the report's share counts every stack with a Python frame, the burner's start-up
    # (imports, <module>) as well as its burn_* functions: the same count here
    with_python = sum(s["weight"] for s in stacks if _python_function(tuple(s["frames"])) is not None)
    assert proc["python_named_share"] == pytest.approx(with_python / total, abs=1e-4)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1) to make a pid namespace")
def test_a_process_in_its_own_pid_namespace_gets_python_frames(tmp_path):
    """As in a container: the thread states hold the namespace's tids, BPF sees the host's."""
    python = INTERPRETERS["debian-3.11"] or INTERPRETERS["pyenv-3.11"]
    if python is None:
        pytest.skip("no CPython 3.11 on this host")
    outer = subprocess.Popen(["unshare", "--pid", "--fork", python, str(BURNER), "--hold", "--late-thread"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        assert outer.stdout.readline().startswith("READY 1")  # pid 1 of its namespace
        pid = int(Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()[0])
        snap = _record(pid, tmp_path / "ns.ipr", 4, lambda: (time.sleep(0.5), os.kill(pid, signal.SIGUSR1)),
                       burner=outer)  # its stdin is the burner's
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        outer.communicate(timeout=30)
    main = [s for s in snap["stacks"] if s["tid"] == pid]
    total = sum(s["weight"] for s in main)
    named = sum(s["weight"] for s in main if _python_function(tuple(s["frames"])) in ("burn_a", "burn_b",
                                                                                      "burn_c"))
    assert total > 100 and named >= 0.8 * total, (named, total)
    # the thread started after attach: BPF finds it at its first sample, in its namespace's tids
    late = [s for s in snap["stacks"] if s["tid"] != pid]
    late_total = sum(s["weight"] for s in late)
    late_named = sum(s["weight"] for s in late
                     if _python_function(tuple(s["frames"])) in ("_spin", "burn_late"))
    assert late_total > 30 and late_named >= 0.9 * late_total, (late_named, late_total)


def test_unsupported_interpreter_is_named_not_walked(tmp_path):
    old = sorted(PYENV.glob("3.9.*/bin/python3.9"))
    if not old:
        pytest.skip("no CPython 3.9 in pyenv to stand for an unsupported version")
    proc = _start(str(old[-1]))
    try:
        snap = _record(proc.pid, tmp_path / "old.ipr", 2, burner=proc)
    finally:
        _stop(proc)
    info = snap["processes"][str(proc.pid)]
    assert "not supported" in info.get("python_unsupported", ""), info
    assert any("Python frames are not shown" in n for n in snap["notes"]), snap["notes"]
    assert not any(f.startswith("py::") for s in snap["stacks"] for f in s["frames"])
    # and the JSON report says so for that process (reports/json_stacks.py)
    processes = json_report(tmp_path / "old.ipr")["stacks"]["cpu"]["processes"]
    (entry,) = [p for p in processes if p["pid"] == proc.pid]
    assert "not supported" in entry["not_walked"] and entry["python_named_share"] == 0.0, entry


def test_off_cpu_sleep_is_under_the_python_function_that_slept(tmp_path):
    python = INTERPRETERS["pyenv-3.12"] or INTERPRETERS["debian-3.11"]
    if python is None:
        pytest.skip("no CPython 3.11/3.12 on this host")
    proc = _start(python, "--sleeper")
    try:
        snap = _record(proc.pid, tmp_path / "off.ipr", 3, flags=("--offcpu",), snapshot="offcpu", burner=proc)
    finally:
        out = _stop(proc)
    mean_us = float(re.search(r"mean_sleep_us=([\d.]+)", out).group(1))
    waits = [s for s in snap["stacks"] if _python_function(tuple(s["frames"])) == "wait_in_sleep"
             and not s["flags"]]
    assert waits, [s["frames"] for s in snap["stacks"]][:5]
    periods = sum(s["periods"] for s in waits)
    # 3 s of 50 ms sleeps: ~60 periods, a few lost at the edges of the window
    assert 50 <= periods <= 61, periods
    # the program's own clock around time.sleep() and the kernel's off-CPU period agree
    assert sum(s["weight"] for s in waits) / periods == pytest.approx(mean_us, rel=0.05)
    assert all(any(f.startswith("py::<module>:") for f in s["frames"]) for s in waits)


def test_per_phase_graph_keeps_the_python_frames(tmp_path):
    from inferprobe.analyzers import stack_profile as profile
    from inferprobe.collector.model.recording import read_recording as read

    python = INTERPRETERS["debian-3.11"] or INTERPRETERS["pyenv-3.11"]
    if python is None:
        pytest.skip("no CPython 3.11 on this host")
    proc = _start(python)
    try:
        _record(proc.pid, tmp_path / "ph.ipr", 3, flags=("--profile", "--profile-hz", "299", "--phases"),
                burner=proc)
    finally:
        _stop(proc)
    idle = profile.load(read(tmp_path / "ph.ipr"), "cpu", phase="idle")
    total = idle.total
    named = sum(w for frames, w in idle.stacks.items() if _python_function(frames) in ("burn_a", "burn_b",
                                                                                         "burn_c"))
    assert total >= 300, total
    assert named >= 0.8 * total, f"{named} of {total} idle-phase samples name a burner"


def test_lock_waiter_and_releaser_name_their_python_functions(tmp_path):
    """tests/servers/lock_server.py: a thread per connection (each started after attach, and
    living a fraction of a second) waits on a threading.Lock a holder thread keeps 9 ms of 10."""
    python = INTERPRETERS["debian-3.11"] or INTERPRETERS["pyenv-3.11"]
    if python is None:
        pytest.skip("no CPython 3.11 on this host")
    server = ListeningProgram([python, str(SERVERS / "lock_server.py")])
    try:
        recording = tmp_path / "locks.ipr"
        rec = Recorder([server.pid], recording, "--locks", "--duration", "60")
        for _ in range(3):
            status, _body = server.get("/contend?cycles=20&sleep_us=5000")
            assert status == 200
        rec.stop()
    finally:
        server.stop()
    report = json_report(recording)
    top = report["locks"][0]
    assert top["kind"] == "lock", top
    # innermost first: the native lock functions, then the Python function that waited
    assert "PyThread_acquire_lock_timed" in top["waiter_frames"], top["waiter_frames"]
    assert any(f.startswith("py::Handler.do_GET:") for f in top["waiter_frames"]), top["waiter_frames"]
    assert any(f.startswith("py::holder:") for f in top["waker_frames"]), top["waker_frames"]


def test_doctor_names_supported_and_unsupported_interpreters():
    from inferprobe.cli.doctor_target import python_lines

    cases = [(INTERPRETERS["debian-3.11"], True, "CPython 3.11"), (INTERPRETERS["pyenv-3.13"], True, "3.13"),
             (next(iter(sorted(str(p) for p in PYENV.glob("3.9.*/bin/python3.9"))), None), False,
              "3.9 is not supported")]
    cases = [c for c in cases if c[0]]
    if not cases:
        pytest.skip("no interpreters to look at")
    for python, walked, text in cases:
        proc = subprocess.Popen([python, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                                stdout=subprocess.PIPE, text=True)
        try:
            proc.stdout.readline()
            (line,) = python_lines(proc.pid)
        finally:
            proc.kill()
            proc.wait()
        assert line.hooked is walked and text in line.detail, (python, line)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
