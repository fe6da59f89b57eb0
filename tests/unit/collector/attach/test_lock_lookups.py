"""What the locks set looks up in a live process: its glibc's semaphore functions
(collector/attach/probe_sets/semaphores.py) and CPython's _PyRuntime
(collector/binaries/cpython_runtime.py)."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys

import pytest

from inferprobe.collector.attach.probe_sets import semaphores
from inferprobe.collector.binaries import cpython_runtime, uprobe_points

from tests.support.pythons import PY312

RUNTIME_ADDRESS = ("import ctypes; "
                   "print(ctypes.addressof(ctypes.c_byte.in_dll(ctypes.pythonapi, '_PyRuntime')))")


def test_runtime_range_is_where_the_interpreter_has_pyruntime():
    start, end = cpython_runtime.runtime_range(os.getpid())
    assert start == ctypes.addressof(ctypes.c_byte.in_dll(ctypes.pythonapi, "_PyRuntime"))
    assert end > start


@pytest.mark.skipif(PY312 is None, reason="no CPython 3.12+ on this host (a relocated _PyRuntime)")
def test_runtime_range_of_a_position_independent_interpreter():
    proc = subprocess.Popen([PY312, "-c", f"{RUNTIME_ADDRESS}; import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = int(proc.stdout.readline())
        start, end = cpython_runtime.runtime_range(proc.pid)
    finally:
        proc.communicate("")
    assert start == address and end > start


def test_no_runtime_range_outside_cpython():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert cpython_runtime.runtime_range(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()


def test_semaphore_functions_of_the_process_libc():
    libc = semaphores.mapped_libc(os.getpid())
    assert libc is not None and os.path.basename(libc.path) == "libc.so.6"
    found = semaphores.semaphore_functions(libc.host_path)
    points = semaphores.probe_points(libc.host_path)
    assert set(points) == set(found)
    assert all(points[n].symbol == found[n] and 0 <= points[n].offset < 32 for n in found)
    assert set(found) == {*semaphores.RELEASE_FUNCTIONS, semaphores.TAKE_FUNCTION}
    assert all(found.values())


def test_no_libc_for_a_process_that_is_gone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert semaphores.mapped_libc(proc.pid) is None


# glibc 2.36 (Debian 12), x86-64: the starts of the probed functions
SEM_TRYWAIT = bytes.fromhex("488b07 85c0 7411 488d50ff f0480fb117 75f1 31c0 c3")
SEM_POST = bytes.fromhex("8b7708 488b07 3dffffff7f 7433 488d5001")
SEM_INIT = bytes.fromhex("85d2 781c 89d0 488907 31c0")
SEM_DESTROY = bytes.fromhex("31c0 c3")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the instruction walk is for x86-64")
def test_probe_offset_is_the_first_jump_after_plain_instructions():
    assert uprobe_points.probe_offset(SEM_TRYWAIT) == 5
    assert uprobe_points.probe_offset(SEM_POST) == 0xB
    assert uprobe_points.probe_offset(SEM_INIT) == 2
    assert uprobe_points.probe_offset(uprobe_points.ENDBR64 + SEM_INIT) == 6
    assert uprobe_points.probe_offset(SEM_DESTROY) == 0  # a ret before any jump: the entry


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the instruction walk is for x86-64")
def test_probe_offset_stays_at_the_entry_when_rdi_or_the_stack_changes():
    jump = bytes.fromhex("7405")
    assert uprobe_points.probe_offset(bytes.fromhex("55") + jump) == 0  # push rbp
    assert uprobe_points.probe_offset(bytes.fromhex("4883ec08") + jump) == 0  # sub rsp, 8
    assert uprobe_points.probe_offset(bytes.fromhex("488b3e") + jump) == 0  # mov rdi, [rsi]
    assert uprobe_points.probe_offset(bytes.fromhex("31ff") + jump) == 0  # xor edi, edi
    assert uprobe_points.probe_offset(bytes.fromhex("48890424") + jump) == 0  # mov [rsp], rax
    assert uprobe_points.probe_offset(bytes.fromhex("4883ff00") + jump) == 4  # cmp rdi, 0: kept
    assert uprobe_points.probe_offset(bytes.fromhex("488b")) == 0  # cut inside an instruction
