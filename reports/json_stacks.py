"""The `stacks` object of the JSON report (recordings made with --profile / --offcpu): per
process, how its Python frames were named, with the reason wherever they were not
(analyzers/python_naming.py; docs/report-json.md)."""

from __future__ import annotations

from inferprobe.analyzers.python_naming import naming_notes, python_naming
from inferprobe.analyzers.stack_profile import SETS
from inferprobe.collector.model.recording import Recording


def stacks_json(recording: Recording) -> dict | None:
    """{cpu|offcpu: {unit, weight, processes[], notes[]}} for the stack sets recorded; null without any."""
    out = {}
    for kind, name in SETS.items():
        snap = recording.snapshots.get(name)
        if snap is None:
            continue
        processes = python_naming(snap)
        out[kind] = {
            "unit": snap.get("unit", "samples"),
            "weight": sum(int(s["weight"]) for s in snap.get("stacks", [])),
            "processes": [p.as_dict() for p in processes],
            "notes": [*snap.get("notes", []), *naming_notes(snap)],
        }
    return out or None
