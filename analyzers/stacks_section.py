"""The report's flame graph sections: on-CPU and off-CPU stacks (record
--profile / --offcpu), drawn by flamegraphs/svg.py and embedded in the HTML.

The picture is capped: frames narrower than MIN_SHARE of the total are cut
(fold.prune) before drawing, and the cut is raised while the SVG stays above
MAX_SVG_BYTES, so a long deep profile cannot make the report unwieldy.
`inferprobe flamegraph` draws the uncut graph. Markdown and the terminal show
the capture facts and the heaviest frames by self weight instead.
"""

from __future__ import annotations

from inferprobe.analyzers.sections import AnalysisInput, AnalyzerResult, AnalyzerSection, Table, source_states
from inferprobe.flamegraphs import fold, svg
from inferprobe.flamegraphs.profile import KIND_TITLES, SETS, load, truncated_share

ANCHORS = {"cpu": "analyzer-flame-cpu", "offcpu": "analyzer-flame-offcpu"}
MIN_SHARES = (0.001, 0.005, 0.01, 0.05)  # tried in order until the SVG fits
MAX_SVG_BYTES = 3_000_000
TOP_FRAMES = 10
SVG_WIDTH = 1200
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
    for pid, proc in sorted(snap.get("processes", {}).items()):
        status = PYTHON_STATUS.get(proc.get("python"), str(proc.get("python")))
        rows.append((f"Python frames, {proc.get('comm', '?')} ({pid})", status))
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


def _draw(profile, path: str) -> tuple[str, str]:
    """The SVG for the HTML and a sentence saying what was cut to fit."""
    for share in MIN_SHARES:
        stacks, dropped = fold.prune(profile.stacks, share)
        text = svg.render(stacks, profile.title, profile.subtitle, profile.unit, width=SVG_WIDTH,
                          root_levels=profile.root_levels)
        if len(text) <= MAX_SVG_BYTES or share == MIN_SHARES[-1]:
            break
    cut = (f"{dropped:,} frames narrower than {share:.1%} of the total are left out (their weight stays "
           "in the frame below them)" if dropped else "every frame drawn")
    caption = (f"{cut}. Hover for weights, click to zoom, Search to highlight; "
               f"`inferprobe flamegraph {path} --kind {profile.kind}` draws the whole graph.")
    return svg.for_html(text), caption


def _analyze(inp: AnalysisInput, kind: str) -> AnalyzerResult | None:
    snap = inp.recording.snapshots.get(SETS[kind])
    if snap is None:
        return None
    profile = load(inp.recording, kind)
    other = "offcpu" if kind == "cpu" else "cpu"
    picture, caption = _draw(profile, str(inp.recording.path)) if profile.total else (None, "")
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
        notes=tuple(profile.notes),
        svg=picture,
        svg_caption=caption,
    ))
