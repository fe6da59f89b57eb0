"""The report's flame graph sections: on-CPU and off-CPU stacks (record
--profile / --offcpu): the capture facts, the heaviest frames by self weight,
and the folded stacks, which the HTML report draws (reports/flame_html.py).
Markdown and the terminal show the tables instead of the picture.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferprobe.analyzers import stack_fold as fold
from inferprobe.analyzers.sections import (
    AnalysisInput,
    AnalyzerResult,
    AnalyzerSection,
    FlameGraph,
    Table,
    source_states,
)
from inferprobe.analyzers.stack_profile import KIND_TITLES, SETS, load, truncated_share

ANCHORS = {"cpu": "analyzer-flame-cpu", "offcpu": "analyzer-flame-offcpu"}
TOP_FRAMES = 10
PYTHON_STATUS = {
    "perf-map": "named (the interpreter writes a perf map)",
    "unresolved": "unnamed: Python frames show as the interpreter's C functions",
    None: "not a Python process",
}


def on_cpu(inp: AnalysisInput) -> AnalyzerResult | None:
    return _analyze(inp, "cpu")


def off_cpu(inp: AnalysisInput) -> AnalyzerResult | None:
    return _analyze(inp, "offcpu")


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


@dataclass(frozen=True)
class PythonNaming:
    """How one process's Python frames were named in a stack snapshot (collector/attach/
    probe_sets/stacks.py keeps the facts, collector/binaries/python_stacks.py finds them)."""

    pid: int
    comm: str
    unit: str  # the snapshot's: samples (on-CPU) or us (off-CPU)
    python: str | None  # frames | perf-map | unresolved | None (not a Python process)
    version: str | None
    weight: int  # its samples (on-CPU) or µs off the CPU
    named: int  # of that weight, stacks with a Python frame (py::)
    not_walked: str | None  # why its frames were not walked at all
    walked_from_s: float | None  # walked only from this far into the recording
    unwalked_before: str | None  # and why not before then

    @property
    def share(self) -> float | None:
        return self.named / self.weight if self.weight else None

    @property
    def silent_zero(self) -> bool:
        """Walked, yet none of its samples has a Python frame: said in a note, never left at 0 % alone."""
        return self.python == "frames" and self.weight > 0 and self.named == 0

    @property
    def status(self) -> str:
        whose = "of its samples" if self.unit == "samples" else "of its time off the CPU"
        share = f": {self.share:.1%} {whose} with Python frames" if self.share is not None else ""
        if self.python == "frames":
            if self.walked_from_s is not None:
                return (f"named from {self.walked_from_s:.1f} s on (CPython {self.version}){share}; "
                        f"before then not walked: {self.unwalked_before}")
            return f"named: walked from its thread states (CPython {self.version}){share}"
        if self.not_walked:
            return f"not walked: {self.not_walked}{share}"
        return PYTHON_STATUS.get(self.python, str(self.python)) + (share if self.python else "")

    def as_dict(self) -> dict:
        return {"pid": self.pid, "comm": self.comm, "python": self.python, "python_version": self.version,
                "unit": self.unit, "weight": self.weight, "python_named_weight": self.named,
                "python_named_share": round(self.share, 4) if self.share is not None else None,
                "not_walked": self.not_walked, "walked_from_s": self.walked_from_s,
                "unwalked_before": self.unwalked_before, "status": self.status}


def python_naming(snap: dict) -> list[PythonNaming]:
    """Every process of a stack snapshot, with how its Python frames were named."""
    weight: dict[int, int] = {}
    named: dict[int, int] = {}
    for stack in snap.get("stacks", []):
        pid, w = int(stack["pid"]), int(stack["weight"])
        weight[pid] = weight.get(pid, 0) + w
        if any(f.startswith("py::") for f in stack.get("frames", [])):
            named[pid] = named.get(pid, 0) + w
    out = []
    for pid_text, proc in snap.get("processes", {}).items():
        pid = int(pid_text)
        out.append(PythonNaming(pid, proc.get("comm", "?"), snap.get("unit", "samples"), proc.get("python"),
                                proc.get("python_version"), weight.get(pid, 0), named.get(pid, 0),
                                proc.get("python_unsupported"), proc.get("python_walked_from_s"),
                                proc.get("python_unwalked_before")))
    return sorted(out, key=lambda p: p.pid)


def naming_notes(snap: dict) -> list[str]:
    """Notes the recording itself did not make: a walked process none of whose samples was named."""
    return [f"pid {p.pid} ({p.comm}): its Python thread states were walked, but none of its "
            f"{p.weight:,} {'samples' if p.unit == 'samples' else 'µs off the CPU'} has a Python frame "
            "(its threads ran no Python code, or the walk read nothing: docs/python-frames.md)"
            for p in python_naming(snap) if p.silent_zero]


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


def _analyze(inp: AnalysisInput, kind: str) -> AnalyzerResult | None:
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
    return AnalyzerResult(section=AnalyzerSection(
        anchor=ANCHORS[kind],
        title=f"{KIND_TITLES[kind]} flame graph",
        summary=summary,
        sources=source_states(inp.recording.meta, [SETS[kind], SETS[other]]),
        tables=(_facts(kind, snap, profile.stacks), _top(kind, profile.stacks, profile.root_levels)),
        notes=(*profile.notes, *naming_notes(snap)),
        flame=FlameGraph(profile, str(inp.recording.path)) if profile.total else None,
    ))
