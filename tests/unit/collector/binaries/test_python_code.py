"""The line-table readers against each interpreter's own co_lines(), and the stack merge."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from inferprobe.collector.binaries.python_code import line_of_310, line_of_311
from inferprobe.collector.binaries.python_layouts import TABLE
from inferprobe.collector.binaries.python_stacks import segments, splice
from inferprobe.collector.model.stack_markers import NATIVE_GAP, TRUNCATED

PYTHONS = sorted(str(p) for minor in ("10", "11", "12", "13")
                 for p in Path("/root/.pyenv/versions").glob(f"3.{minor}.*/bin/python3.{minor}"))
if Path("/usr/bin/python3").exists():
    PYTHONS.append("/usr/bin/python3")

# Prints, for code objects of the standard library, the line table and what
# co_lines() says of every code unit.
DUMP = r"""
import json, sys, threading, json as j2, asyncio.base_events as m
out = []
def walk(code):
    yield code
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            yield from walk(c)
for mod in (threading, j2.decoder, m):
    src = open(mod.__file__).read()
    for code in walk(compile(src, mod.__file__, "exec")):
        lines = {}
        for start, end, line in code.co_lines():
            for off in range(start, end, 2):
                lines[off] = line
        out.append({"table": code.co_linetable.hex(), "first": code.co_firstlineno, "lines": lines,
                    "size": len(code.co_code)})
print(json.dumps({"version": list(sys.version_info[:2]), "codes": out}))
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_line_of_matches_co_lines(python):
    dump = json.loads(subprocess.run([python, "-c", DUMP], capture_output=True, text=True, check=True).stdout)
    version = tuple(dump["version"])
    checked = 0
    for code in dump["codes"]:
        table = bytes.fromhex(code["table"])
        for off in range(0, code["size"], 2):
            want = code["lines"].get(str(off))
            got = line_of_310(table, code["first"], off) if version == (3, 10) \
                else line_of_311(table, code["first"], off // 2)
            assert got == want, (version, code["first"], off)
            checked += 1
    assert checked > 10000


def test_segments_follow_each_versions_marker():
    frames = [(0x1000 | (1 << 56), 1), (0x2000, 2)]
    # 3.11: is_entry on the first frame closes its C call
    assert segments(TABLE[(3, 11)], frames) == [[(0x1000, 1)], [(0x2000, 2)]]
    # 3.12: a CSTACK shim (owner 3) splits the calls and is dropped; owner 1 (generator) is a frame
    shim = [(0x1000 | (1 << 56), 1), (0x9000 | (3 << 56), 0), (0x2000, 2)]
    assert segments(TABLE[(3, 12)], shim) == [[(0x1000, 1)], [(0x2000, 2)]]
    # 3.10: every frame is its own C call
    assert segments(TABLE[(3, 10)], [(0x1000, 1), (0x2000, 2)]) == [[(0x1000, 1)], [(0x2000, 2)]]


def test_splice_replaces_eval_frames_from_the_leaf():
    native = ["_start", "main", "_PyEval_EvalFrameDefault", "call_c", "_PyEval_EvalFrameDefault", "matmul"]
    groups = [["py::inner", "py::mid"], ["py::outer"]]  # innermost group first, innermost frame first
    assert splice(native, groups) == [
        "_start", "main", "py::outer", "call_c", "py::mid", "py::inner", "matmul"]


def test_splice_drops_perf_trampoline_names_the_walk_replaces():
    native = ["_start", "_PyEval_EvalFrameDefault", "py::outer:/app.py", "_PyEval_EvalFrameDefault"]
    groups = [["py::inner:/app.py:3"], ["py::outer:/app.py:9"]]
    assert splice(native, groups) == ["_start", "py::outer:/app.py:9", "py::inner:/app.py:3"]


def test_splice_puts_unwalked_python_frames_first_and_marks_the_gap():
    native = [TRUNCATED, "_PyEval_EvalFrameDefault", "PyObject_Free"]
    groups = [["py::leaf"], ["py::caller", "py::main"]]
    assert splice(native, groups) == ["py::main", "py::caller", NATIVE_GAP, "py::leaf", "PyObject_Free"]
    assert splice(["memcpy"], []) == ["memcpy"]


def test_lock_symbols_put_the_python_frames_after_the_native_ones():
    from inferprobe.collector.model.lock_symbols import Symbols

    snap = {"symbols": {"7": {"16": {"function": "futex_wait", "after_call": True},
                              "32": {"function": "PyThread_acquire_lock_timed", "after_call": True}}},
            "python_stacks": {"7": {"5": ["py::Handler.do_GET:/srv/s.py:42", "py::serve:/srv/s.py:9"]}}}
    sym = Symbols(snap)
    assert sym.frames(7, 16, [32], -1, 5) == (
        "futex_wait", "PyThread_acquire_lock_timed",
        "py::Handler.do_GET:/srv/s.py:42", "py::serve:/srv/s.py:9")
    assert sym.frames(7, 16, [32], -1, 0) == ("futex_wait", "PyThread_acquire_lock_timed")
    assert sym.frames(7, 16, [32], -1, -17) == ("futex_wait", "PyThread_acquire_lock_timed")
