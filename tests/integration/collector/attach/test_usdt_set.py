"""The recorder's own USDT probe set against the probe library's contract.

tests/*/probes check the library with a tracer of its own; this checks that
what `record` loads (bpf/usdt.bpf.c, built ahead) and decodes
(collector/model/events.py) gives back every firing exactly, from the Python
library and from the C header, and that probes mapped after the load are
found while recording. That it follows the same table is
tests/unit/collector/attach/test_usdt_set.py.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from inferprobe.collector.attach.loader import load_tracer
from inferprobe.collector.attach.ringbuf import RingBufferReader
from inferprobe.collector.model.events import UsdtRecord, decode
from inferprobe.collector.model.ringbuf_format import iter_ring_records
from inferprobe.probes import PROBES, usdt

from tests.programs.usdt_trace import HERE, Child, build_c_child, expected_events
from tests.support.kernel import needs_root


def _child_argv(kind: str, tmp_path) -> list[str]:
    if kind == "python":
        assert usdt.available, usdt.reason
        return [sys.executable, str(HERE / "probe_child.py")]
    return [str(build_c_child(tmp_path, "c"))]


@pytest.mark.bpf
@needs_root
@pytest.mark.parametrize("kind", ["python", "c"])
def test_record_side_gets_every_probe_with_its_arguments(kind, tmp_path):
    child = Child(_child_argv(kind, tmp_path))
    chunks: list[bytes] = []
    tracer = load_tracer([child.pid], sets=("usdt",), ringbuf_pages=64, require_listener=False)
    try:
        assert "usdt" in tracer.active, tracer.inactive
        assert tracer.active["usdt"].probe_names() == {p.name for p in PROBES}
        reader = RingBufferReader(tracer, chunks.append)
        child.fire()
        reader.drain()
        counters = tracer.counters()
        reader.close()
    finally:
        tracer.close()
    events = [decode(raw) for chunk in chunks for raw in iter_ring_records(chunk)]
    got = [(e.probe.name.lower(), e.args) for e in events if isinstance(e, UsdtRecord)]
    assert got == expected_events()
    assert all(e.pid == child.pid for e in events)
    assert counters["usdt_bad_args"] == 0 and counters["events_lost"] == 0
    # Detaching lowered the semaphores again: the server is back to near-free calls.
    assert child.enabled() is False
    child.close()


@pytest.mark.bpf
@needs_root
def test_a_target_without_probes_leaves_the_set_off(tmp_path):
    import subprocess

    proc = subprocess.Popen(["sleep", "30"])
    try:
        tracer = load_tracer([proc.pid], sets=("usdt",), ringbuf_pages=64, require_listener=False)
        try:
            assert "usdt" not in tracer.active
            assert "no target maps a file with inferprobe USDT probes" in tracer.inactive["usdt"]
        finally:
            tracer.close()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.bpf
@needs_root
def test_probes_mapped_after_the_load_are_attached_while_recording(tmp_path):
    """A target that becomes a probe-carrying program after the load (here a Python
    process, whose probe library made the set active, execs the C child) gets its
    probes from refresh(): the handler is built ahead, so libbpf attaches it to
    probes it never saw at start-up, reading their arguments from the notes."""
    assert usdt.available, usdt.reason
    c_child = build_c_child(tmp_path, "c")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from inferprobe.probes import usdt; import os, sys; "
         "print('loaded', flush=True); sys.stdin.readline(); os.execv(sys.argv[1], sys.argv[1:])",
         str(c_child)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "loaded"
    chunks: list[bytes] = []
    tracer = load_tracer([proc.pid], sets=("usdt",), ringbuf_pages=64, require_listener=False)
    try:
        reader = RingBufferReader(tracer, chunks.append)
        proc.stdin.write("exec\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("ready")
        deadline = time.monotonic() + 10
        notes: list[str] = []
        while not any(str(proc.pid) in note for note in notes) and time.monotonic() < deadline:
            notes += tracer.refresh()
            time.sleep(0.2)
        assert notes == [f"usdt: attached {len(expected_events()) - 1} probe(s) in pid {proc.pid}"], notes
        proc.stdin.write("fire\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("fired")
        reader.drain()
        counters = tracer.counters()
        reader.close()
    finally:
        tracer.close()
        proc.stdin.close()
        proc.wait(timeout=10)
    events = [decode(raw) for chunk in chunks for raw in iter_ring_records(chunk)]
    got = [(e.probe.name.lower(), e.args) for e in events if isinstance(e, UsdtRecord)]
    assert got == expected_events()
    assert counters["usdt_bad_args"] == 0 and counters["events_lost"] == 0
