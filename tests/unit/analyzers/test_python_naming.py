"""Per-process Python frame naming in the report (analyzers/python_naming.py): every process
of a stack snapshot says whether its Python frames were named, from when, its share of samples
with them, and why not wherever they were not, in the terminal report and in the JSON report's
`stacks` (reports/json_stacks.py). Recordings built in memory: no root, no kernel."""

from __future__ import annotations

import io

from rich.console import Console

from inferprobe.analyzers.python_naming import naming_notes, python_naming
from inferprobe.analyzers.report_data import build
from inferprobe.reports.json_report import to_json
from inferprobe.reports.terminal import render_text

from tests.factories import recording

NOT_FOUND = "its interpreter list holds no thread state at the expected offsets"
PY = "/usr/bin/python3.11"
BEFORE = "it ran no CPython yet (its executable was /usr/bin/bash)"


def _stack(pid: int, frames: list[str], weight: int) -> dict:
    return {"pid": pid, "tid": pid, "thread": "t", "user_stack_id": 1, "kernel_stack_id": -1, "flags": 0,
            "python_stack_id": 0, "frames": frames, "weight": weight, "periods": weight}


def _snapshot() -> dict:
    return {
        "kind": "cpu", "unit": "samples", "hz": 49, "counters": {}, "streamed": False,
        "stacks": [
            _stack(11, ["_start", "py::main:/a.py:3", "py::spin:/a.py:9"], 90),
            _stack(11, ["_start", "_PyEval_EvalFrameDefault"], 10),
            _stack(22, ["_start", "_PyEval_EvalFrameDefault"], 50),
            _stack(33, ["_start", "py::run:/b.py:1"], 30),
            _stack(33, ["_start", "bash_main"], 30),
            _stack(44, ["_start", "_PyEval_EvalFrameDefault"], 40),
        ],
        "processes": {  # pid -> as collector/attach/probe_sets/stacks.py writes it
            "11": {"comm": "worker", "exe": PY, "python": "frames", "python_version": "3.11"},
            "22": {"comm": "loaded", "exe": PY, "python": "unresolved", "python_version": None,
                   "python_unsupported": NOT_FOUND},
            "33": {"comm": "late", "exe": PY, "python": "frames", "python_version": "3.11",
                   "python_walked_from_s": 2.5, "python_unwalked_before": BEFORE},
            "44": {"comm": "empty", "exe": PY, "python": "frames", "python_version": "3.11"},
        },
        "notes": [f"pid 22 (loaded): Python frames are not shown: {NOT_FOUND}"],
    }


def test_each_process_has_its_share_and_reason():
    by_pid = {p.pid: p for p in python_naming(_snapshot())}
    assert by_pid[11].share == 0.9 and by_pid[11].status.startswith("named: walked")
    assert by_pid[22].share == 0.0 and by_pid[22].status == f"not walked: {NOT_FOUND}: 0.0% of its samples " \
        "with Python frames"
    assert by_pid[33].share == 0.5
    assert by_pid[33].status.startswith("named from 2.5 s on (CPython 3.11): 50.0% of its samples")
    assert BEFORE in by_pid[33].status
    # walked, yet nothing named: a note says so rather than a bare 0 %
    assert by_pid[44].silent_zero and not by_pid[11].silent_zero
    (note,) = naming_notes(_snapshot())
    assert note.startswith("pid 44 (empty): its Python thread states were walked, but none of its 40 samples")


def test_the_reason_reaches_the_json_report():
    data = build(recording([], active={"profile": "on-CPU stacks"}, snapshots={"profile": _snapshot()}))
    stacks = to_json(data)["stacks"]
    assert set(stacks) == {"cpu"}
    procs = {p["pid"]: p for p in stacks["cpu"]["processes"]}
    assert procs[22]["not_walked"] == NOT_FOUND
    assert procs[22]["python_named_share"] == 0.0
    assert procs[33]["walked_from_s"] == 2.5 and procs[33]["unwalked_before"] == BEFORE
    assert procs[11]["python_named_share"] == 0.9 and procs[11]["not_walked"] is None
    assert stacks["cpu"]["weight"] == 250
    assert any(n.startswith("pid 22 (loaded): Python frames are not shown") for n in stacks["cpu"]["notes"])
    assert any(n.startswith("pid 44 (empty)") for n in stacks["cpu"]["notes"])


def test_no_stack_sets_no_stacks_object():
    assert to_json(build(recording([])))["stacks"] is None


def test_the_reason_reaches_the_terminal_report():
    data = build(recording([], active={"profile": "on-CPU stacks"}, snapshots={"profile": _snapshot()}))
    out = io.StringIO()
    render_text(data, Console(file=out, width=400))
    text = out.getvalue()
    assert "Python frames, loaded (22)" in text and f"not walked: {NOT_FOUND}" in text
    assert "named from 2.5 s on (CPython 3.11): 50.0% of its samples with Python frames; before then not " \
           f"walked: {BEFORE}" in text
    assert f"note: pid 22 (loaded): Python frames are not shown: {NOT_FOUND}" in text
    assert "note: pid 44 (empty): its Python thread states were walked, but none" in text
