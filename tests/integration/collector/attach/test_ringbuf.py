"""The bulk ring buffer reader against the real kernel.

A C program fires a USDT probe a known number of times; every firing is one
event that the kernel either hands over or counts as lost. The reader must
account for each one, in order, and a recording must give them back.
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from inferprobe.collector.attach.loader import load_tracer
from inferprobe.collector.attach.ringbuf import RingBufferReader
from inferprobe.collector.model.events import UsdtProbe, decode
from inferprobe.collector.model.recording import RecordingWriter, read_recording
from inferprobe.collector.model.ringbuf_format import iter_ring_records

from tests.support.kernel import needs_root
from tests.support.paths import REPO

pytestmark = [pytest.mark.bpf, needs_root]


@pytest.fixture(scope="module")
def flood_binary(tmp_path_factory):
    out = tmp_path_factory.mktemp("flood") / "usdt_flood"
    subprocess.run(["cc", "-O2", "-o", str(out), str(REPO / "tests/programs/usdt_flood.c")], check=True)
    return out


class Flood:
    """usdt_flood N as a traced process; .done is set when it has fired all N."""

    def __init__(self, binary, n: int):
        self.proc = subprocess.Popen([str(binary), str(n)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.done = threading.Event()
        threading.Thread(target=self._wait_fired, daemon=True).start()

    def go(self) -> None:
        """Starts firing: call once the tracer is attached."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def _wait_fired(self) -> None:
        if self.proc.stdout.readline().startswith("fired"):
            self.done.set()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _run(binary, n: int, pages: int, poll_while_firing: bool):
    flood = Flood(binary, n)
    chunks: list[bytes] = []
    tracer = load_tracer([flood.proc.pid], sets=("usdt",), ringbuf_pages=pages, require_listener=False)
    reader = RingBufferReader(tracer, chunks.append)
    flood.go()
    try:
        deadline = time.monotonic() + 60
        while not flood.done.is_set() and time.monotonic() < deadline:
            if poll_while_firing:
                reader.poll(50)
            else:
                time.sleep(0.05)
        assert flood.done.is_set(), "the flood program never finished firing"
        reader.drain()
        counters = tracer.counters()
    finally:
        reader.close()
        tracer.close()
        flood.stop()
    events = [decode(raw) for chunk in chunks for raw in iter_ring_records(chunk)]
    return events, counters, reader


KEPT_UP_EVENTS = 100_000


@pytest.fixture(scope="module")
def kept_up(flood_binary):
    """One flood read by a consumer that keeps up: its events, counters and reader."""
    return _run(flood_binary, KEPT_UP_EVENTS, pages=2048, poll_while_firing=True)


def test_a_consumer_that_keeps_up_gets_every_event_in_order(kept_up):
    n = KEPT_UP_EVENTS
    events, counters, reader = kept_up
    assert counters["events_lost"] == 0
    assert counters["events_sent"] == reader.events == len(events) == n
    assert all(e.probe == UsdtProbe.TOKEN_EMIT for e in events)
    assert [e.args[1] for e in events] == list(range(n))
    assert {e.args[0] for e in events} == {7}


def test_a_full_ring_loses_events_and_counts_each_one(flood_binary):
    n = 20_000
    # One page holds 64 events and nobody reads until the flood is over.
    events, counters, reader = _run(flood_binary, n, pages=1, poll_while_firing=False)
    assert 0 < len(events) < n
    assert counters["events_lost"] == n - len(events)
    assert counters["events_sent"] == len(events) == reader.events
    # What did arrive is the oldest events, in order: the kernel drops new ones.
    indexes = [e.args[1] for e in events]
    assert indexes == list(range(len(events)))


def test_ring_chunks_round_trip_through_a_recording(kept_up, tmp_path):
    events, _, _ = kept_up  # what the kernel sent, reused: a tracer load costs ~10 s here
    path = tmp_path / "r.ipr"
    writer = RecordingWriter(path, {"test": True}, flush_bytes=4096)
    # Re-frame the decoded events' bytes as ring records, in chunks of odd sizes.
    raws = [bytes(e_raw) for e_raw in _raw_events(events)]
    for i in range(0, len(raws), 333):
        writer.add_ring_chunk(b"".join(_frame(r) for r in raws[i : i + 333]))
    writer.close({"lost_events": 0})
    rec = read_recording(path)
    assert rec.complete and rec.events == raws


def _frame(raw: bytes) -> bytes:
    padded = raw + bytes(-len(raw) % 8)
    return len(raw).to_bytes(4, "little") + bytes(4) + padded


def _raw_events(events):
    from inferprobe.collector.model import events as ev

    for e in events:
        u = ev.UsdtEvent()
        u.hdr.type, u.hdr.pid, u.hdr.tid, u.hdr.ts_ns = e.type, e.pid, e.tid, e.ts_ns
        u.probe, u.nargs = e.probe, len(e.args)
        for i, a in enumerate(e.args):
            u.args[i] = a
        yield bytes(u)
