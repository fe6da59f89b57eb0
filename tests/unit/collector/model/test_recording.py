"""Recording files: round trip, torn tails, corruption and newer versions."""

import struct
import subprocess

import pytest

from inferprobe.collector.errors import RecordingProblem
from inferprobe.collector.model.events import LAYOUT_VERSION
from inferprobe.collector.model.recording import (
    FILE_HEADER,
    FORMAT_VERSION,
    MAGIC,
    RecordingWriter,
    read_recording,
)

from tests.factories import request, sse_chunk
from tests.support.processes import inferprobe_cmd


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


ONE_REQUEST = request(1)


def _recording_of_layout(path, layout):
    w = RecordingWriter(path, {"host": "test", "layout_version": layout})
    w.add_event(ONE_REQUEST)
    w.close({})
    return path


def test_a_newer_event_layout_is_refused_naming_both_layouts(tmp_path):
    path = _recording_of_layout(tmp_path / "new.ipr", LAYOUT_VERSION + 1)
    with pytest.raises(RecordingProblem) as err:
        read_recording(path)
    message = str(err.value)
    assert f"layout {LAYOUT_VERSION + 1}, newer than the layout {LAYOUT_VERSION}" in message
    assert "upgrade inferprobe" in message and "\n" not in message


@pytest.mark.parametrize("layout", [LAYOUT_VERSION, LAYOUT_VERSION - 1, None])
def test_the_current_and_older_layouts_are_read_as_today(tmp_path, layout):
    rec = read_recording(_recording_of_layout(tmp_path / "r.ipr", layout))
    assert rec.events == [ONE_REQUEST] and rec.complete


def test_a_layout_version_that_is_not_a_number_is_a_corrupt_header(tmp_path):
    with pytest.raises(RecordingProblem, match="corrupt header"):
        read_recording(_recording_of_layout(tmp_path / "r.ipr", "2"))


def test_report_on_a_newer_layout_exits_non_zero_with_one_sentence(tmp_path):
    path = _recording_of_layout(tmp_path / "new.ipr", LAYOUT_VERSION + 1)
    done = subprocess.run(inferprobe_cmd("report", str(path)), capture_output=True, text=True, timeout=60)
    assert done.returncode == RecordingProblem.exit_code
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"newer than the layout {LAYOUT_VERSION}" in lines[0], done.stderr
