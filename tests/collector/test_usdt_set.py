"""The recorder's own USDT probe set against the probe library's contract.

tests/probes checks the library with a tracer of its own; this checks that
what `record` compiles (bpf/usdt.bpf.c) and decodes (collector/events.py)
agrees with the same table, and gives back every firing exactly.
"""

from __future__ import annotations

import re
import sys

import pytest

from inferprobe.collector.events import UsdtProbe, UsdtRecord, decode
from inferprobe.collector.loader import BPF_DIR, load_tracer
from inferprobe.collector.ringbuf import RingBufferReader
from inferprobe.collector.ringbuf_format import iter_ring_records
from inferprobe.probes import PROBES, usdt

from conftest import REPO, needs_root

sys.path.insert(0, str(REPO / "tests" / "probes"))
from usdt_trace import Child, expected_events  # noqa: E402


def test_collector_probe_ids_follow_the_library_table():
    assert [p.name.upper() for p in PROBES] == [m.name for m in UsdtProbe]
    assert [m.value for m in UsdtProbe] == list(range(1, len(PROBES) + 1))


def test_each_bpf_handler_reads_exactly_the_documented_arguments():
    source = (BPF_DIR / "usdt.bpf.c").read_text()
    for p in PROBES:
        body = re.search(rf"int usdt_{p.name}\(struct pt_regs \*ctx\)\n\{{(.*?)\n\}}", source, re.S)
        assert body, f"no handler for {p.name}"
        reads = re.findall(r"bpf_usdt_readarg\((\d), ctx, &ev\.args\[(\d)\]\)", body.group(1))
        assert [(int(a), int(b)) for a, b in reads] == [(i + 1, i) for i in range(len(p.args))], p.name
        assert f"usdt_begin(&ev, USDT_{p.name.upper()}, {len(p.args)})" in body.group(1)


@pytest.mark.bpf
@needs_root
def test_record_side_gets_every_probe_with_its_arguments():
    assert usdt.available, usdt.reason
    child = Child([sys.executable, str(REPO / "tests/probes/probe_child.py")])
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
