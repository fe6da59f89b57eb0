"""The report's flame graph sections: on-CPU and off-CPU stacks (record
--profile / --offcpu): the capture facts, the heaviest frames by self weight,
and the folded stacks, which the HTML report draws (reports/flame_html.py).
Markdown and the terminal show the tables instead of the picture.
"""

from __future__ import annotations

from inferprobe.analyzers import stack_fold as fold
from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.python_naming import naming_notes, python_naming
from inferprobe.analyzers.stack_profile import KIND_TITLES, SETS, load, truncated_share
from inferprobe.reports.sections.model import AnalyzerSection, FlameGraph, Table, source_states

ANCHORS = {"cpu": "analyzer-flame-cpu", "offcpu": "analyzer-flame-offcpu"}
TOP_FRAMES = 10


def on_cpu(inp: AnalysisInput) -> AnalyzerSection | None:
    return _build(inp, "cpu")


def off_cpu(inp: AnalysisInput) -> AnalyzerSection | None:
    return _build(inp, "offcpu")


def _weight(kind: str, w: int) -> str:
    return f"{w:,}" if kind == "cpu" else f"{w / 1000:,.1f}"


def _facts(kind: str, snap: dict, stacks: fold.Stacks) -> Table:
    c = snap.get("counters", {})
    rows = []
    if kind == "cpu":
        rows.append(("sampling rate", f"{snap.get('hz', '?')} Hz (software cpu-clock)"))
        rows.append(("samples", f"{fold.total(stacks):,}"))
    else:
        rows.append(("shortest period recorded", f"{snap.get('min_us', '?')} µs"))
        rows.append(("time off the CPU", f"{fold.total(stacks) / 1e6:,.3f} s"))
        rows.append(("off-CPU periods", f"{sum(int(s.get('periods', 0)) for s in snap.get('stacks', [])):,}"))
    rows += [
        ("distinct stacks", str(len(snap.get("stacks", [])))),
        ("stack map collisions", str(c.get("collisions", 0))),
        ("user stacks not readable", str(c.get("lost", 0))),
        ("samples over the counts table", str(c.get("keys_full", 0))),
        ("stacks cut short ([truncated])", f"{truncated_share(stacks):.1%} of the weight"),
    ]
    for p in python_naming(snap):
        rows.append((f"Python frames, {p.comm} ({p.pid})", p.status))
    rows.append(("streamed per sample (for --phase graphs)", "yes" if snap.get("streamed") else "no"))
    return Table(caption="Capture", columns=("fact", "value"), rows=tuple(rows))


def _user_leaves(stacks: fold.Stacks) -> fold.Stacks:
    """Off-CPU stacks without their kernel frames: every off-CPU leaf is the
    scheduler, so self time is charged to the code that made the wait."""
    out: fold.Stacks = {}
    for frames, weight in stacks.items():
        keep = len(frames)
        while keep > 1 and frames[keep - 1].endswith("_[k]"):
            keep -= 1
        out[frames[:keep]] = out.get(frames[:keep], 0) + weight
    return out


def _top(kind: str, stacks: fold.Stacks, root_levels: int) -> Table:
    unit = "samples" if kind == "cpu" else "ms off-CPU"
    total = fold.total(stacks) or 1
    where = ""
    if kind == "offcpu":
        stacks = _user_leaves(stacks)
        where = " (kernel frames folded into the user-space frame that waited)"
    rows = tuple(
        (name, _weight(kind, self_w), f"{self_w / total:.1%}",
         _weight(kind, total_w), f"{total_w / total:.1%}")
        for name, self_w, total_w in fold.top_functions(stacks, TOP_FRAMES, skip_roots=root_levels)
    )
    return Table(caption=f"Top {TOP_FRAMES} frames by self {unit}{where}",
                 columns=("frame", f"self ({unit})", "self share", f"total ({unit})", "total share"),
                 rows=rows)


def _build(inp: AnalysisInput, kind: str) -> AnalyzerSection | None:
    snap = inp.recording.snapshots.get(SETS[kind])
    if snap is None:
        return None
    profile = load(inp.recording, kind)
    other = "offcpu" if kind == "cpu" else "cpu"
    if kind == "cpu":
        summary = ("Where the target threads ran on a CPU: each sample is a stack; a frame's width is "
                   "its share of all samples, the frames above it are what it called.")
    else:
        summary = ("Where the target threads waited off the CPU (blocked or preempted): a frame's width "
                   "is its share of the time off the CPU.")
    return AnalyzerSection(
        anchor=ANCHORS[kind],
        title=f"{KIND_TITLES[kind]} flame graph",
        summary=summary,
        sources=source_states(inp.recording.meta, [SETS[kind], SETS[other]]),
        tables=(_facts(kind, snap, profile.stacks), _top(kind, profile.stacks, profile.root_levels)),
        notes=(*profile.notes, *naming_notes(snap)),
        flame=FlameGraph(profile, str(inp.recording.path)) if profile.total else None,
    )
