"""speedscope JSON export (https://www.speedscope.app/file-format-schema.json).

One "sampled" profile: every distinct stack once, with its weight, frames
shared through the file's frame table. speedscope opens it with
File > Open, or drop it on the page.
"""

from __future__ import annotations

import json

from inferprobe.analyzers.stack_fold import Stacks

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def export(stacks: Stacks, name: str, unit: str = "samples") -> dict:
    frame_index: dict[str, int] = {}
    samples, weights = [], []
    for frames, weight in sorted(stacks.items()):
        if weight <= 0:
            continue
        samples.append([frame_index.setdefault(f, len(frame_index)) for f in frames])
        weights.append(weight)
    speedscope_unit = "microseconds" if unit == "us" else "none"
    total = sum(weights)
    return {
        "$schema": SCHEMA,
        "name": name,
        "exporter": "inferprobe",
        "activeProfileIndex": 0,
        "shared": {"frames": [{"name": f} for f in frame_index]},
        "profiles": [{
            "type": "sampled",
            "name": name,
            "unit": speedscope_unit,
            "startValue": 0,
            "endValue": total,
            "samples": samples,
            "weights": weights,
        }],
    }


def dumps(stacks: Stacks, name: str, unit: str = "samples") -> str:
    return json.dumps(export(stacks, name, unit), separators=(",", ":")) + "\n"


def read_back(doc: dict) -> Stacks:
    """The folded profile of an exported document (for tests and diffs)."""
    names = [f["name"] for f in doc["shared"]["frames"]]
    profile = doc["profiles"][0]
    out: Stacks = {}
    for sample, weight in zip(profile["samples"], profile["weights"], strict=True):
        key = tuple(names[i] for i in sample)
        out[key] = out.get(key, 0) + weight
    return out
