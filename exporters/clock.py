"""Kernel CLOCK_MONOTONIC times to wall-clock (CLOCK_REALTIME) times.

The kernel stamps events with bpf_ktime_get_ns(), i.e. CLOCK_MONOTONIC.
Tracing backends want Unix epoch nanoseconds. The recorder measures
offset = REALTIME - MONOTONIC at start (recording meta) and again at every
stats flush (about once a second); a time t is converted with the newest
sample taken at or before t (the first sample for earlier times).

Error bound of a converted time, relative to what CLOCK_REALTIME read at t:
- half the bracket of the sample's measurement (two monotonic reads around
  one realtime read; `uncertainty_ns`, typically well under 1 us), plus
- the change of the offset since that sample: NTP slewing moves it by at most
  500 ppm (the kernel's limit), so at most 0.5 ms per second elapsed since
  the sample, i.e. <= 0.5 ms with samples a second apart. A clock step
  (settimeofday, an NTP step) shows as a jump between samples larger than the
  slew limit; `steps` counts those, and spans between the step and the next
  sample are off by up to the step.
Durations inside one span come straight from the monotonic clock and carry
no conversion error.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferprobe.collector.model.recording_meta import RecordingMeta

MAX_SLEW_PPM = 500  # adjtimex limit on frequency correction


@dataclass(frozen=True, slots=True)
class OffsetSample:
    monotonic_ns: int
    offset_ns: int  # REALTIME - MONOTONIC
    uncertainty_ns: int = 0

    def as_dict(self) -> dict:
        return {"monotonic_ns": self.monotonic_ns, "offset_ns": self.offset_ns,
                "uncertainty_ns": self.uncertainty_ns}


def measure_offset(tries: int = 5) -> OffsetSample:
    """REALTIME - MONOTONIC, from the tightest of a few bracketed reads."""
    best: tuple[int, int, int] | None = None
    for _ in range(tries):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2, (before + after) // 2)
    assert best is not None, "measure_offset needs tries >= 1"
    bracket, offset, mono = best
    return OffsetSample(monotonic_ns=mono, offset_ns=offset, uncertainty_ns=(bracket + 1) // 2)


@dataclass
class WallClock:
    """Piecewise conversion from the samples seen so far (kept in time order)."""

    # bounded by `keep` where set (the live export: LIVE_CLOCK_SAMPLES); a recording's: all of its samples
    samples: list[OffsetSample] = field(default_factory=list)
    steps: int = 0
    _keys: list[int] = field(default_factory=list, repr=False)
    keep: int | None = None  # the most samples kept: beyond it the oldest go (times before use the oldest)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, sample: OffsetSample) -> None:
        with self._lock:
            self._add(sample)

    def _add(self, sample: OffsetSample) -> None:
        if self.samples:
            last = self.samples[-1]
            if sample.monotonic_ns <= last.monotonic_ns:
                return
            elapsed = sample.monotonic_ns - last.monotonic_ns
            slew_limit = elapsed * MAX_SLEW_PPM // 1_000_000
            tolerance = slew_limit + sample.uncertainty_ns + last.uncertainty_ns
            if abs(sample.offset_ns - last.offset_ns) > tolerance:
                self.steps += 1
        self.samples.append(sample)
        self._keys.append(sample.monotonic_ns)
        if self.keep is not None and len(self.samples) > self.keep:
            del self.samples[: len(self.samples) - self.keep]
            del self._keys[: len(self._keys) - self.keep]

    def to_wall_ns(self, monotonic_ns: int) -> int:
        with self._lock:  # the span shipper's thread converts while the recording thread adds
            if not self.samples:
                raise ValueError("no clock offset sample: cannot place kernel times on the wall clock")
            i = bisect.bisect_right(self._keys, monotonic_ns) - 1
            return monotonic_ns + self.samples[max(i, 0)].offset_ns

    @classmethod
    def from_recording(cls, meta: Mapping[str, Any], stats: list[dict]) -> WallClock:
        """The start offset from the meta, then every re-check stored with the stats."""
        typed = RecordingMeta.of(meta)
        clock = cls()
        if typed.realtime_offset_ns is not None:
            clock.add(OffsetSample(typed.started_monotonic_ns or 0, typed.realtime_offset_ns))
        for s in stats:
            c = s.get("clock")
            if isinstance(c, dict) and "offset_ns" in c:
                clock.add(OffsetSample(int(c["monotonic_ns"]), int(c["offset_ns"]),
                                       int(c.get("uncertainty_ns", 0))))
        return clock
