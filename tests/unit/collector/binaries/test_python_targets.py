"""PythonTargets' answers about a process (collector/binaries/python_stacks.py): none is final
until the process is walked. A process not yet a CPython when first seen (caught between fork
and exec, before libpython is mapped, before its interpreter has a thread state: on a loaded
host, for seconds) is walked once it is one, and the recording says from when and why not
before; one that never is says why. No process, no BPF: the lookups are stubbed."""

from __future__ import annotations

import pytest

from inferprobe.collector.binaries import cpython_runtime, python_stacks, python_threads
from inferprobe.collector.binaries.python_layouts import TABLE, LayoutProblem

PID = 4242
INTERP = cpython_runtime.Interpreter("/usr/lib/libpython3.11.so.1.0", 0x1000, 0x100, None, (3, 11))
BASH = ("/usr/bin/bash", "2000 kB")
PYTHON_BEFORE_LIBPYTHON = ("/usr/bin/python3.11", "2000 kB")
PYTHON = ("/usr/bin/python3.11", "9000 kB")


class _Memory:
    def close(self) -> None:
        pass


class _Process:
    """What PythonTargets keeps of an attached process."""

    def __init__(self, pid: int):
        self.pid = pid
        self.layout = TABLE[(3, 11)]
        self.memory = _Memory()
        self.version = (3, 11)


class _World:
    """The process as /proc shows it, step by step; counts the costly symbol scans."""

    def __init__(self, monkeypatch, image, interp, files=(), problem=None):
        self.image, self.interp, self.files, self.problem = image, interp, list(files), problem
        self.scans = 0
        self.attaches = 0
        monkeypatch.setattr(cpython_runtime, "image_of", lambda pid: self.image)
        monkeypatch.setattr(cpython_runtime, "candidate_files", lambda pid: self.files)
        monkeypatch.setattr(cpython_runtime, "find_interpreter", self._find)
        monkeypatch.setattr(python_threads, "attach", self._attach)

    def _find(self, pid):
        self.scans += 1
        return self.interp

    def _attach(self, pid, interp=None):
        self.attaches += 1
        assert interp is self.interp, "attach is handed the interpreter already found"
        if self.problem is not None:
            raise LayoutProblem(self.problem)
        return _Process(pid)


def test_a_process_that_execs_python_later_is_walked_and_says_since_when(monkeypatch):
    world = _World(monkeypatch, BASH, None)
    targets = python_stacks.PythonTargets()
    assert targets._attach(PID) is None
    assert targets._attach(PID) is None
    assert world.scans == 1, "an unchanged image is not scanned again"
    assert targets.naming(PID, started_ns=0) == ({}, None)  # not a Python process (yet): nothing to say
    # the exec: the executable is python3.11, libpython not mapped yet
    world.image, world.files = PYTHON_BEFORE_LIBPYTHON, ["/usr/bin/python3.11"]
    assert targets._attach(PID) is None
    fields, note = targets.naming(PID, started_ns=0)
    assert "no _PyRuntime symbol in python3.11" in fields["python_unsupported"], fields
    # the dynamic loader mapped libpython
    world.image, world.interp = PYTHON, INTERP
    assert targets._attach(PID) is not None
    assert targets.version_of(PID) == "3.11"
    assert PID not in targets.problems
    fields, note = targets.naming(PID, started_ns=targets.walked_since_ns[PID] - 2_500_000_000)
    assert fields["python_walked_from_s"] == pytest.approx(2.5)
    assert "libpython not loaded yet" in fields["python_unwalked_before"]
    assert "only from 2.5 s into the recording" in note and "libpython not loaded yet" in note


def test_the_first_answer_names_the_executable_it_saw(monkeypatch):
    world = _World(monkeypatch, BASH, None)
    targets = python_stacks.PythonTargets()
    targets._attach(PID)
    world.image, world.interp = PYTHON, INTERP
    targets._attach(PID)
    fields, _ = targets.naming(PID, started_ns=0)
    assert fields["python_unwalked_before"] == "it ran no CPython yet (its executable was /usr/bin/bash)"


def test_an_interpreter_without_a_thread_state_yet_is_asked_again(monkeypatch):
    """Between libpython mapped and Py_Initialize's first thread state the check fails: that
    answer is kept for the report, not for the rest of the recording."""
    world = _World(monkeypatch, PYTHON, INTERP, problem="its interpreter list holds no thread state")
    targets = python_stacks.PythonTargets()
    assert targets._attach(PID) is None
    fields, note = targets.naming(PID, started_ns=0)
    assert fields == {"python_unsupported": "its interpreter list holds no thread state"}
    assert note == "Python frames are not shown: its interpreter list holds no thread state"
    world.problem = None
    assert targets._attach(PID) is not None
    assert world.scans == 1 and world.attaches == 2, "the retry reuses the interpreter found"
    # walked before the set began sampling (at its attach): nothing to add
    assert targets.naming(PID, started_ns=targets.walked_since_ns[PID] + 1) == ({}, None)
    assert "python_walked_from_s" in targets.naming(PID, started_ns=0)[0]


def test_an_interpreter_that_never_checks_out_keeps_its_reason(monkeypatch):
    world = _World(monkeypatch, PYTHON, INTERP, problem="CPython 3.9 is not supported")
    targets = python_stacks.PythonTargets()
    for _ in range(3):
        assert targets._attach(PID) is None
    assert world.scans == 1
    assert targets.naming(PID, started_ns=0)[0] == {"python_unsupported": "CPython 3.9 is not supported"}
    assert targets.unsupported() == {PID: "CPython 3.9 is not supported"}


def test_a_process_gone_is_neither_walked_nor_given_a_reason(monkeypatch):
    _World(monkeypatch, None, None)
    targets = python_stacks.PythonTargets()
    assert targets._attach(PID) is None
    assert targets.naming(PID, started_ns=0) == ({}, None)


def test_image_of_reads_the_executable_and_library_code_size():
    """The cheap key: this process's own image, stable between two reads; None for no process."""
    import os

    me = cpython_runtime.image_of(os.getpid())
    assert me is not None and me == cpython_runtime.image_of(os.getpid())
    assert me[0] == os.readlink("/proc/self/exe")
    assert me[1].endswith("kB")
    assert cpython_runtime.image_of(2 ** 22 + 1) is None
