"""Monotonic -> wall-clock conversion from the recorder's offset samples."""

from __future__ import annotations

import time

from inferprobe.exporters.clock import OffsetSample, WallClock, measure_offset

S = 1_000_000_000


def test_measured_offset_places_now_on_the_wall_clock():
    sample = measure_offset()
    clock = WallClock([])
    clock.add(sample)
    wall_before = time.time_ns()
    converted = clock.to_wall_ns(time.monotonic_ns())
    wall_after = time.time_ns()
    assert sample.uncertainty_ns < 1_000_000
    assert wall_before - 1_000_000 <= converted <= wall_after + 1_000_000


def test_newest_sample_at_or_before_a_time_is_used_and_steps_are_counted():
    meta = {"started_monotonic_ns": 100 * S, "realtime_offset_ns": 1_000 * S}
    stats = [{"clock": OffsetSample(101 * S, 1_000 * S + 200_000).as_dict()},  # 0.2 ms slew: fine
             {"clock": OffsetSample(102 * S, 1_005 * S).as_dict()}]  # a 5 s step
    clock = WallClock.from_recording(meta, stats)
    assert clock.steps == 1
    assert clock.to_wall_ns(99 * S) == 1_099 * S  # before the first sample: the first one
    assert clock.to_wall_ns(101 * S + 5) == 1_101 * S + 200_005
    assert clock.to_wall_ns(103 * S) == 1_108 * S
