"""The agent's ring of recordings: rotation, pruning by age, and a window read back as one recording."""

from __future__ import annotations

import os
import time

import pytest

from inferprobe.collector.errors import RecordingProblem
from inferprobe.collector.model.segment_ring import SegmentRing, list_segments, parse_span, read_window


def _ring(tmp_path, keep_s=60.0, segment_s=10.0) -> SegmentRing:
    return SegmentRing(tmp_path, {"host": "h"}, keep_s, segment_s, lambda: {"lost_events": 0})


def test_spans_parse_and_bad_ones_are_refused():
    assert [parse_span(t) for t in ("90s", "15m", "2h", "1d", "30", "1.5m")] == [90, 900, 7200, 86400, 30, 90]
    for bad in ("", "5x", "-1m", "0s", "m"):
        with pytest.raises(ValueError):
            parse_span(bad)


def test_rotation_closes_each_segment_and_prunes_by_age(tmp_path):
    ring = _ring(tmp_path, keep_s=100)
    ring.writer.add_event(b"\x01" * 8)
    ring.rotate()
    ring.rotate()
    segments = list_segments(tmp_path)
    assert [s.seq for s in segments] == [1, 2, 3]
    old = time.time() - 200
    os.utime(segments[0].path, (old, old))
    ring.prune()
    assert [s.seq for s in list_segments(tmp_path)] == [2, 3] and ring.deleted == 1
    # The open segment is never deleted, however old it looks.
    os.utime(ring.writer.path, (old, old))
    ring.prune()
    assert ring.writer.path.exists()
    ring.close({"end_reason": "test"})


def test_a_window_reads_the_newest_run_as_one_recording(tmp_path):
    older = _ring(tmp_path)
    older.writer.add_event(b"\x07" * 4)
    older.close({"end_reason": "old run"})
    time.sleep(1.1)   # run names carry the second they started
    ring = _ring(tmp_path)
    ring.writer.add_event(b"\x01" * 4)
    ring.rotate()
    ring.writer.add_event(b"\x02" * 4)
    ring.writer.flush(stats={"t": 1.0, "sampling": {"conns_accepted": 4, "conns_followed": 2}})
    window = read_window(tmp_path, 60)
    assert window.events == [b"\x01" * 4, b"\x02" * 4]   # not the older run's
    assert window.meta["window"]["segments"] == [s.path.name for s in list_segments(tmp_path)
                                                 if s.run == ring.run]
    # the open segment has no end record yet: its last stats stand in
    assert window.final["sampling"] == {"conns_accepted": 4, "conns_followed": 2}
    ring.close({"end_reason": "test"})


def test_a_window_read_just_after_a_rotation_keeps_the_agents_counts(tmp_path):
    """The segment the agent opened a moment ago has flushed nothing yet: the sampling and
    tallies of the one it closed stand in, and the window is still a window."""
    state = {"sampling": {"conns_accepted": 40, "conns_followed": 9}}
    ring = SegmentRing(tmp_path, {"host": "h"}, 600, 10, lambda: {**state, "end_reason": "rotated"})
    ring.writer.add_event(b"\x01" * 4)
    ring.rotate()
    window = read_window(tmp_path, 60)
    assert window.final["sampling"] == {"conns_accepted": 40, "conns_followed": 9}
    assert window.final["end_reason"] == "window"
    ring.close({"end_reason": "test"})


def test_an_empty_or_stale_ring_is_one_sentence(tmp_path):
    with pytest.raises(RecordingProblem, match="no agent recordings"):
        read_window(tmp_path / "nowhere", 60)
    ring = _ring(tmp_path)
    ring.close({})
    old = time.time() - 3600
    for s in list_segments(tmp_path):
        os.utime(s.path, (old, old))
    with pytest.raises(RecordingProblem, match="within the last 60 s"):
        read_window(tmp_path, 60)


def _tallies(turns: int, bucket: int, sum_ns: int) -> dict:
    from inferprobe.collector.model.connection_tallies import COUNTERS, HISTOGRAMS

    return {**{k: 0 for k in COUNTERS}, "turns": turns, "connections": turns,
            "histograms": {k: {"buckets": {str(bucket): turns} if k == "turn" else {}, "sum_ns": sum_ns}
                           for k in HISTOGRAMS}}


def test_a_windows_kernel_tallies_are_its_own_not_since_the_agent_started(tmp_path):
    state = {"tallies": _tallies(3, 20, 3_000_000)}
    ring = SegmentRing(tmp_path, {"host": "h"}, 600, 10, lambda: dict(state))
    ring.rotate()                                  # segment 1 ends with 3 turns since the start
    old = time.time() - 300
    first = list_segments(tmp_path)[0]
    os.utime(first.path, (old, old))               # ... and is older than the window
    state["tallies"] = _tallies(6, 20, 6_000_000)
    ring.rotate()                                  # segment 2 ends with 6 since the start
    ring.writer.flush(stats={"t": 1.0, "tallies": _tallies(8, 20, 8_000_000)})   # the open one, at 8
    window = read_window(tmp_path, 60)
    assert window.final["tallies"]["since"] == "window"
    assert window.final["tallies"]["turns"] == 5 and window.final["tallies"]["connections"] == 5
    assert window.final["tallies"]["histograms"]["turn"] == {"buckets": {"20": 5}, "sum_ns": 5_000_000}
    # With the segment before the window gone, they can only be since the start, and say so.
    first.path.unlink()
    assert read_window(tmp_path, 60).final["tallies"]["since"] == "agent start"
    ring.close({"end_reason": "test"})


def test_a_segment_cut_short_by_a_kill_is_read_up_to_its_tear(tmp_path):
    """kill -9 while the agent writes: the newest segment has no end record and may end in a torn
    record; the window holds every whole record before it and says where it stopped."""
    ring = _ring(tmp_path)
    ring.writer.add_event(b"\x01" * 4)
    ring.rotate()
    ring.writer.add_event(b"\x02" * 4)
    ring.writer.flush()
    newest = ring.writer.path
    whole = newest.stat().st_size
    ring.writer.add_event(b"\x03" * 300)
    ring.writer.flush()
    with open(newest, "r+b") as f:   # the last record cut short, as a kill between two writes leaves it
        f.truncate(newest.stat().st_size - 100)
    window = read_window(tmp_path, 60)
    assert window.events == [b"\x01" * 4, b"\x02" * 4]
    assert window.problem == (f"{newest.name}: truncated at byte {whole} (last record cut short); "
                              "read up to there")
    assert window.meta["window"]["complete"] is False


def test_an_open_segment_without_its_end_record_is_no_problem(tmp_path):
    ring = _ring(tmp_path)
    ring.writer.add_event(b"\x01" * 4)
    ring.writer.flush()
    window = read_window(tmp_path, 60)
    assert window.events == [b"\x01" * 4] and window.problem is None and window.meta["window"]["complete"]


def test_a_newest_segment_killed_as_it_was_opened_is_left_out(tmp_path):
    ring = _ring(tmp_path)
    ring.writer.add_event(b"\x01" * 4)
    ring.rotate()
    with open(ring.writer.path, "r+b") as f:   # its header cut short
        f.truncate(10)
    window = read_window(tmp_path, 60)
    assert window.events == [b"\x01" * 4]
    assert window.problem.startswith(f"{ring.writer.path.name} left out: ")


def test_a_window_names_the_runs_of_an_agent_restarted_within_it(tmp_path):
    killed = _ring(tmp_path)
    killed.writer.add_event(b"\x07" * 4)
    killed.writer.flush()   # no end record: killed
    time.sleep(1.1)
    ring = _ring(tmp_path)
    ring.writer.add_event(b"\x01" * 4)
    ring.writer.flush()
    window = read_window(tmp_path, 60)
    assert window.events == [b"\x01" * 4] and window.meta["window"]["earlier_runs"] == [killed.run]
