"""A recording's stack profile, ready to draw: which stacks, titles, notes.

Used by `inferprobe flamegraph` and by the report; reads only the recording
(the stack snapshot and, for per-phase graphs, the streamed samples).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from inferprobe.analyzers import stack_fold as fold
from inferprobe.analyzers.stack_fold import Stacks
from inferprobe.collector.errors import RecordingProblem
from inferprobe.collector.model.recording import Recording
from inferprobe.collector.model.stack_markers import NATIVE_GAP, TRUNCATED

SETS = {"cpu": "profile", "offcpu": "offcpu"}
KIND_TITLES = {"cpu": "On-CPU", "offcpu": "Off-CPU"}
RECORD_FLAGS = {"cpu": "--profile", "offcpu": "--offcpu"}


@dataclass
class Profile:
    kind: str
    stacks: Stacks
    unit: str
    title: str
    subtitle: str
    notes: list[str] = field(default_factory=list)
    root_levels: int = 1

    @property
    def total(self) -> int:
        return fold.total(self.stacks)


def snapshot_of(recording: Recording, kind: str) -> dict:
    name = SETS[kind]
    snap = recording.snapshots.get(name)
    if snap is None:
        raise RecordingProblem(
            f"{recording.path} has no {KIND_TITLES[kind].lower()} stacks: record with "
            f"`inferprobe record {RECORD_FLAGS[kind]} ...`"
        )
    return snap


def _when(recording: Recording) -> str:
    try:
        wall_ns = recording.meta.started_wall_ns
    except (TypeError, ValueError):   # a header whose clock fields are not numbers
        return "time unknown"
    if wall_ns is None:
        return "time unknown"
    return dt.datetime.fromtimestamp(wall_ns / 1e9, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# A native walk cut short, or the gap between the Python frames and the native ones where
# Python frames stand in for the lost root (collector/model/stack_markers.py).
CUT_MARKERS = (TRUNCATED, NATIVE_GAP)


def truncated_share(stacks: Stacks) -> float:
    total = fold.total(stacks)
    cut = sum(w for frames, w in stacks.items() if any(m in frames for m in CUT_MARKERS))
    return cut / total if total else 0.0


def load(recording: Recording, kind: str, phase: str | None = None, group: str = "process") -> Profile:
    snap = snapshot_of(recording, kind)
    if phase is None:
        stacks = fold.from_snapshot(snap, group)
    else:
        from inferprobe.analyzers.stack_phases import stacks_for_phase

        stacks = stacks_for_phase(recording, snap, kind, phase, group)
    unit = snap.get("unit", "samples")
    targets = ", ".join(f"{p['comm']} ({pid})" for pid, p in sorted(snap.get("processes", {}).items()))
    duration = (recording.final or {}).get("duration_s")
    total = fold.total(stacks)
    if kind == "cpu":
        amount = f"{total:,} samples at {snap.get('hz', '?')} Hz"
    else:
        amount = f"{total / 1e6:,.3f} s off-CPU in periods of {snap.get('min_us', '?')} µs or more"
    over = f" over {duration:.1f} s" if isinstance(duration, int | float) else ""
    c = snap.get("counters", {})
    lost = c.get("collisions", 0) + c.get("lost", 0) + c.get("keys_full", 0)
    subtitle = (
        f"{_when(recording)}, {amount}{over}; {lost} stacks lost or incomplete in the kernel "
        f"({c.get('collisions', 0)} collisions); {truncated_share(stacks):.0%} truncated"
    )
    title = f"{KIND_TITLES[kind]} flame graph: {targets or 'no samples'}"
    if phase:
        title += f", phase {phase}"
    notes = list(snap.get("notes", []))
    if total == 0:
        notes.append("no samples: the targets did not run (or wait) while recording" +
                     (f" in phase {phase}" if phase else ""))
    return Profile(kind, stacks, unit, title, subtitle, notes,
                   root_levels={"process": 1, "thread": 2, "none": 0}[group])
