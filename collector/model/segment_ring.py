"""A ring of recent recordings on disk, for the always-on agent.

The agent writes ordinary recording files (collector/model/recording.py), one
segment at a time, into a directory: `<run>-<seq>.ipr`, where <run> names
one agent run (connection ids restart with each run, so segments of two runs
never merge) and <seq> counts its segments. A segment is closed (its END
record written) when it has covered `segment_s`, on SIGHUP, and at the stop;
segments older than `keep_s` are deleted. So the directory holds at most
keep_s / segment_s + 1 segments of the current run, plus older runs' last
segments until they too age out.

`inferprobe report --last 5m` reads the segments of the newest run that
overlap the last five minutes and hands them to the report as one recording
(read_window).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferprobe.collector.errors import RecordingProblem
from inferprobe.collector.model.connection_tallies import ConnectionTallies
from inferprobe.collector.model.recording import NO_END_RECORD, Recording, RecordingWriter, read_recording

SEGMENT_NAME = re.compile(r"^(?P<run>\d{8}T\d{6}-\d+)-(?P<seq>\d{6})\.ipr$")


@dataclass(frozen=True)
class Segment:
    path: Path
    run: str
    seq: int

    @property
    def mtime(self) -> float:
        return self.path.stat().st_mtime


def list_segments(directory: Path) -> list[Segment]:
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        m = SEGMENT_NAME.match(name)
        if m:
            found.append(Segment(directory / name, m["run"], int(m["seq"])))
    return sorted(found, key=lambda s: (s.run, s.seq))


class SegmentRing:
    """Writes segments; rotate() when due; prune() deletes the old ones."""

    def __init__(self, directory: Path, meta: dict, keep_s: float, segment_s: float,
                 final_stats: Callable[[], dict]):
        self.directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RecordingProblem(f"cannot create the ring directory {directory}: {err.strerror}") from None
        self.meta = meta
        self.keep_s = keep_s
        self.segment_s = segment_s
        self._final_stats = final_stats
        self.run = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}"
        self.seq = 0
        self.deleted = 0
        self.writer: RecordingWriter = self._open()

    def _open(self) -> RecordingWriter:
        self.seq += 1
        self.opened = time.monotonic()
        meta = {**self.meta, "segment": {"run": self.run, "seq": self.seq, "started_wall_s": time.time()}}
        return RecordingWriter(self.directory / f"{self.run}-{self.seq:06d}.ipr", meta)

    def due(self) -> bool:
        return time.monotonic() - self.opened >= self.segment_s

    def rotate(self, snapshots: dict[str, dict] | None = None) -> None:
        """Closes the current segment and opens the next (also the SIGHUP reopen)."""
        self._close_current(snapshots)
        self.writer = self._open()
        self.prune()

    def _close_current(self, snapshots: dict[str, dict] | None) -> None:
        for name, data in (snapshots or {}).items():
            self.writer.add_snapshot(name, data)
        self.writer.close({**self._final_stats(), "end_reason": "segment"})

    def prune(self, now: float | None = None) -> None:
        """Deletes segments last written more than keep_s ago (never the open one)."""
        now = time.time() if now is None else now
        for segment in list_segments(self.directory):
            if segment.path == self.writer.path:
                continue
            try:
                if now - segment.mtime > self.keep_s:
                    segment.path.unlink()
                    self.deleted += 1
            except FileNotFoundError:
                continue

    def bytes_on_disk(self) -> int:
        total = 0
        for segment in list_segments(self.directory):
            try:
                total += segment.path.stat().st_size
            except FileNotFoundError:
                continue
        return total

    def close(self, final: dict, snapshots: dict[str, dict] | None = None) -> None:
        for name, data in (snapshots or {}).items():
            self.writer.add_snapshot(name, data)
        self.writer.close(final)
        self.prune()


def read_window(directory: Path, last_s: float, now: float | None = None) -> Recording:
    """The newest run's segments written within the last last_s seconds, as one recording."""
    now = time.time() if now is None else now
    segments = list_segments(directory)
    if not segments:
        raise RecordingProblem(f"no agent recordings in {directory} (is the agent writing there? see --ring)")
    run = segments[-1].run
    chosen = []
    before: Segment | None = None   # the run's newest segment older than the window
    for segment in (s for s in segments if s.run == run):
        try:
            if now - segment.mtime <= last_s:
                chosen.append(segment)
            elif not chosen:
                before = segment
        except FileNotFoundError:
            continue   # pruned meanwhile
    if not chosen:
        raise RecordingProblem(f"the agent wrote nothing in {directory} within the last {last_s:g} s")
    parts, unread = _read_segments(chosen)
    chosen = chosen[:len(parts)]
    first, last = parts[0], parts[-1]
    window: dict = {"last_s": last_s, "segments": [s.path.name for s in chosen], "run": run}
    merged = Recording(path=directory, meta=first.meta)
    for part in parts:
        merged.events.extend(part.events)
        merged.stats.extend(part.stats)
        merged.engine_scrapes.extend(part.engine_scrapes)
        merged.snapshots.update(part.snapshots)
    # The open segment has no END yet: the window is complete up to its last flush. One the
    # agent opened moments ago has flushed nothing, and the agent's counts (sampling and
    # tallies, since it started) are then the newest segment's that has them: without them
    # a report right after a rotation said nothing of the sampling (CI, test_agent).
    newest = next((p.final or p.stats[-1] for p in reversed(parts) if p.final or p.stats), {})
    ended = last.final.get("end_reason", "window") if last.final else "window"
    merged.final = {**newest, "end_reason": ended}
    merged.final = _window_tallies(merged.final, before)
    problems = [f"{s.path.name}: {p.problem}"
                for s, p in zip(chosen[:-1], parts[:-1], strict=True) if p.problem]
    problems += unread
    # The newest segment lacks its END while the agent writes it, and after a kill -9 too:
    # all it holds up to the last flush is read. A record torn by a crash (or a full disk)
    # is said: what came before it is in the window, nothing after.
    if last.problem is not None and last.problem != NO_END_RECORD:
        problems.append(f"{chosen[-1].path.name}: {last.problem}; read up to there")
    window["complete"] = not problems
    merged.problem = "; ".join(problems) or None
    earlier = sorted({s.run for s in segments if s.run != run and _written_within(s, now, last_s)})
    if earlier:   # an agent restarted within the window: connection ids restart, runs are not merged
        window["earlier_runs"] = earlier
    merged.meta = merged.meta.with_fields(window=window)
    return merged


def _read_segments(chosen: list[Segment]) -> tuple[list[Recording], list[str]]:
    """Each segment read, but for a newest one whose header is unreadable (the agent killed
    as it opened it, or it was pruned meanwhile): left out, and said."""
    parts = [read_recording(s.path) for s in chosen[:-1]]
    try:
        parts.append(read_recording(chosen[-1].path))
    except RecordingProblem as err:
        if not parts:
            raise
        return parts, [f"{chosen[-1].path.name} left out: {err}"]
    return parts, []


def _written_within(segment: Segment, now: float, last_s: float) -> bool:
    try:
        return now - segment.mtime <= last_s
    except FileNotFoundError:
        return False


def _window_tallies(final: dict, before: Segment | None) -> dict:
    """The kernel tallies in an end record count since the agent started: the
    window's own are those minus the ones the segment before the window ended
    with. With that segment pruned, they stay since the start, and say so."""
    if "tallies" not in final:
        return final
    earlier = None
    if before is not None:
        try:
            earlier = (read_recording(before.path).final or {}).get("tallies")
        except (OSError, RecordingProblem):
            earlier = None
    if earlier is None:
        return {**final, "tallies": {**final["tallies"], "since": "agent start"}}
    window = ConnectionTallies.from_dict(final["tallies"]).minus(ConnectionTallies.from_dict(earlier))
    return {**final, "tallies": {**window.as_dict(), "since": "window"}}


def parse_span(text: str) -> float:
    """'15m', '90s', '2h', '1d' or plain seconds -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m or float(m[1]) <= 0:
        raise ValueError(f"{text!r} is not a duration like 90s, 15m, 2h or 1d")
    return float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]

