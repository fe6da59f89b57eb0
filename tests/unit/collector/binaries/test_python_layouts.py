"""The per-version offset table against each interpreter's own headers, and 3.13's debug offsets
read from a live 3.13 the way the tracer reads them."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from inferprobe.collector.binaries import cpython_runtime
from inferprobe.collector.binaries.python_layouts import (
    DEBUG_OFFSETS_BYTES,
    TABLE,
    LayoutProblem,
    from_debug_offsets,
    table_layout,
)
from inferprobe.collector.binaries.python_threads import ProcessMemory

SOURCE = Path(__file__).resolve().parents[3] / "programs" / "python_offsets.c"
PYENV = Path("/root/.pyenv/versions")
HEADERS = {
    (3, 10): sorted(PYENV.glob("3.10.*/include/python3.10")),
    (3, 11): [Path("/usr/include/python3.11"), *sorted(PYENV.glob("3.11.*/include/python3.11"))],
    (3, 12): sorted(PYENV.glob("3.12.*/include/python3.12")),
    (3, 13): sorted(PYENV.glob("3.13.*/include/python3.13")),
}
CASES = [(v, d) for v, dirs in HEADERS.items() for d in dirs if (d / "internal").is_dir()]
RENAMED = {"tstate_current_frame": "tstate_frame", "tstate_cframe": "tstate_frame",
           "cframe_current_frame": "cframe_frame", "frame_is_entry": "frame_entry",
           "frame_owner": "frame_entry",
           "ascii_state": "unicode_state", "ascii_length": "unicode_length",
           "ascii_size": "unicode_ascii_size", "compact_size": "unicode_compact_size"}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to read the headers' offsets")
@pytest.mark.parametrize(("version", "include"), CASES, ids=[str(d) for _, d in CASES])
def test_table_matches_the_headers(tmp_path, version, include):
    exe = tmp_path / "offsets"
    subprocess.run(["cc", f"-I{include}", str(SOURCE), "-o", str(exe)], check=True, capture_output=True)
    measured = json.loads(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    measured.pop("end")
    measured.pop("object_type")  # not walked
    if "frame_is_entry" in measured:
        measured.pop("frame_owner")  # 3.11 walks by is_entry
    row = dataclasses.asdict(TABLE[version])
    for name, value in measured.items():
        assert row[RENAMED.get(name, name)] == value, (include, name)


def test_unknown_versions_are_refused_with_a_reason():
    with pytest.raises(LayoutProblem, match="3.14 is not supported"):
        table_layout((3, 14))
    with pytest.raises(LayoutProblem, match="cookie"):
        from_debug_offsets(b"\0" * DEBUG_OFFSETS_BYTES)


PY313 = sorted(PYENV.glob("3.13.*/bin/python3.13"))


@pytest.mark.skipif(not PY313, reason="no CPython 3.13 in pyenv")
def test_debug_offsets_of_a_live_313_match_its_headers():
    proc = subprocess.Popen([str(PY313[-1]), "-c", "import time; print('up', flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        interp = cpython_runtime.find_interpreter(proc.pid)
        assert interp is not None
        try:
            mem = ProcessMemory(proc.pid)
        except PermissionError:
            pytest.skip("reading another process's memory needs ptrace rights here")
        layout = from_debug_offsets(mem.read(interp.runtime, DEBUG_OFFSETS_BYTES))
        mem.close()
    finally:
        proc.kill()
        proc.wait()
    assert layout == TABLE[(3, 13)]
