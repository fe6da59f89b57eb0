"""Recording files: round trip, torn tails, corruption and newer versions."""

import struct

import pytest

from inferprobe.collector.errors import RecordingProblem
from inferprobe.collector.recording import (
    FILE_HEADER,
    FORMAT_VERSION,
    MAGIC,
    RecordingWriter,
    read_recording,
)

from factories import request, sse_chunk


def write(path, events, close=True):
    w = RecordingWriter(path, {"host": "test"})
    for i, e in enumerate(events):
        w.add_event(e)
        if i % 3 == 2:
            w.flush(stats={"lost_events": i})
    if close:
        w.close({"lost_events": 7})
    else:
        w.flush()
    return w


def test_round_trip(tmp_path):
    events = [request(1), sse_chunk(1), sse_chunk(1, done=True)] * 4
    write(tmp_path / "r.ipr", events)
    rec = read_recording(tmp_path / "r.ipr")
    assert rec.events == events
    assert rec.meta == {"host": "test"}
    assert rec.complete and rec.lost_events == 7
    assert [s["lost_events"] for s in rec.stats] == [2, 5, 8, 11]


def test_recorder_killed_before_close_keeps_flushed_events(tmp_path):
    events = [request(1), sse_chunk(1)] * 3
    write(tmp_path / "r.ipr", events, close=False)
    rec = read_recording(tmp_path / "r.ipr")
    assert rec.events == events
    assert not rec.complete and "did not stop cleanly" in rec.problem


def test_torn_tail_reports_what_is_readable(tmp_path):
    path = tmp_path / "r.ipr"
    write(path, [request(1), sse_chunk(1), sse_chunk(1)] * 3)
    data = path.read_bytes()
    path.write_bytes(data[:-25])  # inside the END record
    rec = read_recording(path)
    assert rec.problem.startswith("truncated at byte")
    assert 0 < len(rec.events) <= 9


def test_corrupt_record_stops_at_checksum(tmp_path):
    path = tmp_path / "r.ipr"
    write(path, [request(1)] * 6)
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # inside the END record's payload
    path.write_bytes(bytes(data))
    rec = read_recording(path)
    assert "checksum" in rec.problem and len(rec.events) == 6


def test_not_a_recording(tmp_path):
    path = tmp_path / "x.ipr"
    path.write_bytes(b"hello world, not a recording at all")
    with pytest.raises(RecordingProblem, match="not an inferprobe recording"):
        read_recording(path)


def test_newer_format_version_is_a_clear_error(tmp_path):
    path = tmp_path / "new.ipr"
    path.write_bytes(FILE_HEADER.pack(MAGIC, FORMAT_VERSION + 1, 0, 2) + b"{}")
    with pytest.raises(RecordingProblem, match="newer inferprobe"):
        read_recording(path)


def test_missing_file(tmp_path):
    with pytest.raises(RecordingProblem, match="no recording at"):
        read_recording(tmp_path / "nope.ipr")


def test_header_layout_is_stable():
    assert FILE_HEADER.size == 16 and MAGIC == b"INFPRB\r\n"
    assert struct.calcsize("<IHHI") == 12
