"""The report as Markdown: the same sections and numbers as the HTML, as text.

Meant to be pasted into an issue and diffed: the same recording always gives
the same bytes (no render time, fixed ordering, fixed number formats).
"""

from __future__ import annotations

from collections.abc import Sequence

from inferprobe.analyzers.report_data import ReportData
from inferprobe.analyzers.units import ms
from inferprobe.reports import tables
from inferprobe.reports.sections.model import AnalyzerSection, Table
from inferprobe.reports.sections.registry import sections_of


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_table(t: Table) -> list[str]:
    lines = [f"*{_cell(t.caption)}*", "", "| " + " | ".join(_cell(c) for c in t.columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(t.columns))) + "|"]
    lines.extend("| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows)
    lines.append("")
    return lines


def _section(sec: AnalyzerSection) -> list[str]:
    lines = [f"## {sec.title}", "", sec.summary, ""]
    for src in sec.sources:
        lines.append(f"- probe set `{src.name}`: {'active' if src.active else 'off'} — {src.detail}")
    lines.append("")
    if sec.flame is not None:
        lines += ["The HTML report (`--format html`) draws this as an interactive flame graph; "
                  "the heaviest frames are below.", ""]
    for t in sec.tables:
        lines.extend(render_table(t))
    for chart in sec.charts:
        lines.extend(render_table(Table(caption=chart.title, columns=("", chart.value_label),
                                        rows=tuple((label, f"{v:g}") for label, v in chart.bars))))
    lines.extend(f"> {n}" for n in sec.notes)
    if sec.notes:
        lines.append("")
    return lines


def section_markdown(data: ReportData, anchor: str) -> str:
    """One analyzer section alone (`inferprobe advise --format md`)."""
    return "\n".join(line for sec in sections_of(data) if sec.anchor == anchor for line in _section(sec))


def render_markdown(data: ReportData, sections: Sequence[AnalyzerSection] | None = None) -> str:
    """The report as Markdown; `sections`, the analyzer sections, are built from data unless given."""
    sections = sections_of(data) if sections is None else sections
    meta = data.recording.meta
    targets = ", ".join(f"{t.comm} ({t.pid})" for t in meta.targets)
    out = ["# Why is latency high?", "",
           f"inferprobe report · host {meta.host or '?'} · targets {targets or '?'} · "
           f"{data.overall.requests} requests", ""]
    out.extend(f"> **Warning:** {w}" for w in tables.warnings(data))
    out.extend(f"> Note: {n}" for n in tables.notes(data))
    out += ["## Verdict", ""]
    if data.findings:
        for i, f in enumerate(data.findings, 1):
            out.append(f"{i}. {f.headline}")
            out.append(f"   → {f.recommendation} (evidence: section `{f.evidence}`)")
        out.append("")
    else:
        out += ["No finding: nothing in this recording explains a notable share of latency.", ""]
    out.extend(render_table(tables.headline_table(data)))

    out += ["## Latency decomposition", "",
            tables.decomposition_source_text(data.breakdown.source if data.breakdown else None), ""]
    for t in (tables.ttft_phase_table(data), tables.itl_phase_table(data), tables.waterfall_table(data)):
        if t is not None:
            out.extend(render_table(t))
    if data.breakdown is not None and data.breakdown.ttft and not data.breakdown.itl:
        out += ["Inter-token latency cannot be split by phase (socket only: no token/decode-step probes).",
                ""]

    out += ["## Distributions", ""]
    out.extend(render_table(tables.latency_table(data.overall, "Percentiles, all requests")))
    out.extend(render_table(tables.endpoint_table(data)))
    if (models := tables.model_table(data)) is not None:
        out.extend(render_table(models))
    if (cgroups := tables.cgroup_table(data)) is not None:
        out.extend(render_table(cgroups))

    s = data.series
    if s is not None and data.requests:
        out += ["## Over time", ""]
        rows = tuple(
            (f"{b.t_s:g}", f"{b.requests / s.bin_s:.1f}", ms(b.itl_p50_ns),
             ms(b.itl_p99_ns))
            for b in s.bins
        )
        out.extend(render_table(Table(caption=f"Per {s.bin_s:g} s bin",
                                      columns=("t (s)", "requests/s", "ITL p50 (ms)", "ITL p99 (ms)"),
                                      rows=rows)))
        if s.queue_peak is not None:
            out += [f"Waiting queue peak: {s.queue_peak}; running peak: {s.running_peak}.", ""]
        if s.kv_peak is not None:
            out += [f"Token (KV) occupancy peak: {s.kv_peak * 100:.0f} %.", ""]

    for sec in sections:
        out.extend(_section(sec))
    out += ["## Recording facts", ""]
    out.extend(render_table(tables.facts_table(data)))
    return "\n".join(out).rstrip() + "\n"
