"""One section of evidence in the report: what the section builders of
reports/sections/ make from the analyzers' results.

The HTML, Markdown and terminal outputs render any AnalyzerSection the same
way (a summary, the probe sources it read and whether they were active,
tables, charts), so a section added later needs no change in the
renderers: write `build(AnalysisInput) -> AnalyzerSection | None` and list
it in reports/sections/registry.py (its findings, if any, are the
analyzer's: analyzers/registry.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferprobe.collector.model.recording_meta import RecordingMeta

if TYPE_CHECKING:
    from inferprobe.analyzers.stack_profile import Profile


@dataclass(frozen=True)
class SourceState:
    """A probe set as the recording saw it: active, or off and why."""

    name: str
    active: bool
    detail: str  # what it captures when active, why it was off otherwise


@dataclass(frozen=True)
class Table:
    caption: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class BarChart:
    title: str
    value_label: str  # axis label with its unit, e.g. "wait time (ms)"
    bars: tuple[tuple[str, float], ...]  # (label, value), drawn top to bottom


@dataclass(frozen=True)
class ScatterChart:
    """Measured points and a fitted line on the same axes (the HTML draws it; the other
    outputs show the section's tables, which hold the same model)."""

    title: str
    x_label: str
    y_label: str  # with its unit
    points: tuple[tuple[float, float], ...]
    line: tuple[tuple[float, float], ...]
    line_label: str


@dataclass(frozen=True)
class FlameGraph:
    """A flame graph for the HTML report to draw (reports/flame_html.py): the
    folded stacks and their titles. Analysis keeps the stacks; drawing is the
    renderer's, so the analyzers never make markup."""

    profile: Profile
    recording_path: str  # for the caption's `inferprobe flamegraph PATH` command


@dataclass(frozen=True)
class AnalyzerSection:
    anchor: str  # id in the HTML, target of Finding.evidence
    title: str
    summary: str  # one or two sentences: what this section shows
    sources: tuple[SourceState, ...]
    tables: tuple[Table, ...] = ()
    charts: tuple[BarChart, ...] = ()
    notes: tuple[str, ...] = ()  # caveats: what this data cannot tell
    # The HTML draws it (flamegraphs/svg.py via reports/flame_html.py); Markdown
    # and the terminal show the tables instead. None: no stacks to draw.
    flame: FlameGraph | None = None
    scatters: tuple[ScatterChart, ...] = ()


NOT_RECORDED = "not in this recording (not requested, or an older inferprobe)"


def source_states(meta: Mapping[str, Any], names: Sequence[str]) -> tuple[SourceState, ...]:
    """The named probe sets' state from the recording's metadata."""
    sets = RecordingMeta.of(meta).probe_sets
    out = []
    for name in names:
        if name in sets.active:
            out.append(SourceState(name, True, str(sets.active[name])))
        elif name in sets.inactive:
            out.append(SourceState(name, False, str(sets.inactive[name])))
        else:
            out.append(SourceState(name, False, NOT_RECORDED))
    return tuple(out)


def probe_set_present(meta: Mapping[str, Any], name: str) -> bool:
    return RecordingMeta.of(meta).probe_sets.present(name)
