"""The recorder's own USDT probe set against the probe library's contract.

tests/*/probes check the library with a tracer of its own; this checks that
what `record` compiles (bpf/usdt.bpf.c) and decodes (collector/model/events.py)
gives back every firing exactly. That it follows the same table is
tests/unit/collector/attach/test_usdt_set.py.
"""

from __future__ import annotations

import sys

import pytest

from inferprobe.collector.attach.loader import load_tracer
from inferprobe.collector.attach.ringbuf import RingBufferReader
from inferprobe.collector.model.events import UsdtRecord, decode
from inferprobe.collector.model.ringbuf_format import iter_ring_records
from inferprobe.probes import PROBES, usdt

from tests.programs.usdt_trace import HERE, Child, expected_events
from tests.support.kernel import needs_root


@pytest.mark.bpf
@needs_root
def test_record_side_gets_every_probe_with_its_arguments():
    assert usdt.available, usdt.reason
    child = Child([sys.executable, str(HERE / "probe_child.py")])
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
