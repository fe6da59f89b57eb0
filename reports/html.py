"""The one-file HTML report: verdict first, then the evidence for it.

Self-contained by construction: CSS from templates/report.css is inlined,
charts are inline SVG (reports/charts.py), and nothing refers to any other
resource, so the file opens the same offline, attached to an incident, or
printed.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from importlib import resources
from string import Template

from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.report_data import ReportData
from inferprobe.analyzers.verdict import (
    ANCHOR_DECOMPOSITION,
    ANCHOR_DISTRIBUTIONS,
    ANCHOR_FACTS,
    ANCHOR_OVER_TIME,
    ANCHOR_VERDICT,
)
from inferprobe.reports import charts, flame_html, tables
from inferprobe.reports.sections.model import AnalyzerSection, Table
from inferprobe.reports.sections.registry import sections_of

Progress = Callable[[str], None]


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def render_table(t: Table, css_class: str = "") -> str:
    cls = f' class="{css_class}"' if css_class else ""
    head = "".join(f"<th>{_e(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    return (f"<table{cls}><caption>{_e(t.caption)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


def _finding(f: Finding, titles: dict[str, str]) -> str:
    where = titles.get(f.evidence, f.evidence)
    return (
        f'<li data-kind="{_e(f.kind)}" data-share="{f.share:.6f}"><span class="share">{f.percent} %</span>'
        f"{_e(f.sentence)}<span class=\"rec\">{_e(f.recommendation)}</span>"
        f'<span class="ev">Evidence: <a href="#{_e(f.evidence)}">{_e(where)}</a> · share of {_e(f.of)} · '
        f"from {_e(f.source)}</span></li>"
    )


def _verdict(data: ReportData, titles: dict[str, str]) -> str:
    parts = [f'<section id="{ANCHOR_VERDICT}"><h2>Verdict</h2>']
    if data.findings:
        parts.append('<ol class="findings">')
        parts.extend(_finding(f, titles) for f in data.findings)
        parts.append("</ol>")
    else:
        parts.append("<p>No finding: nothing in this recording explains a notable share of latency. "
                     "The numbers below are the evidence.</p>")
    parts.append(render_table(tables.headline_table(data)))
    parts.append("</section>")
    return "".join(parts)


def _decomposition(data: ReportData, progress: Progress) -> str:
    d = data.breakdown
    parts = [f'<section id="{ANCHOR_DECOMPOSITION}"><h2>Latency decomposition</h2>',
             f"<p>{_e(tables.decomposition_source_text(d.source if d else None))}</p>"]
    if d is not None and d.ttft:
        progress("drawing the TTFT decomposition")
        parts.append(_figure(charts.ttft_breakdown(d),
                             "Time to first token of the requests at p50, p90 and p99, split by phase."))
        if (ttft_phases := tables.ttft_phase_table(data)) is not None:
            parts.append(render_table(ttft_phases))
        if d.itl:
            parts.append(_figure(charts.itl_breakdown(d),
                                 "The inter-token gaps at p50, p90 and p99 of all token gaps, split by "
                                 "phase: decode steps, stalls between them, token_emit to socket write "
                                 "(flush), other."))
            if (itl_phases := tables.itl_phase_table(data)) is not None:
                parts.append(render_table(itl_phases))
        else:
            parts.append("<p class=\"note\">Inter-token latency cannot be split by phase from the socket "
                         "alone: it needs the server's token and decode-step probes. See the inter-token "
                         "distribution below.</p>")
        parts.append("<h3>Slowest requests</h3>")
        parts.append(_figure(charts.waterfall(d), "The slowest requests by TTFT: each phase from the "
                             "request read, and a tick for every token chunk written."))
        if (slowest := tables.waterfall_table(data)) is not None:
            parts.append(render_table(slowest))
    parts.append("</section>")
    return "".join(parts)


def _distributions(data: ReportData, progress: Progress) -> str:
    parts = [f'<section id="{ANCHOR_DISTRIBUTIONS}"><h2>Distributions</h2>']
    reqs = data.headline_requests  # the requests data.overall's percentiles are of
    ttft = [r.ttft_ns for r in reqs if r.ttft_ns is not None]
    itl = [g for r in reqs for g in r.itl_ns]
    e2e = [r.e2e_ns for r in reqs if r.e2e_ns is not None]
    progress("drawing the distributions")
    s = data.overall  # the same values' percentiles, as the model has them
    for values, marks, what, unit, anchor in (
            (ttft, s.ttft_ns, "time to first token", "requests", "dist-ttft"),
            (itl, s.itl_ns, "inter-token latency", "token gaps", "dist-itl"),
            (e2e, s.e2e_ns, "end-to-end latency", "requests", "dist-e2e")):
        parts.append(f'<h3 id="{anchor}">{_e(what[0].upper() + what[1:])}</h3>')
        if values:
            parts.append(_figure(charts.histogram(values, marks, what, unit),
                                 f"{len(values)} {unit}; vertical lines mark p50, p90 and p99."))
        else:
            parts.append(f"<p>No {_e(what)} in this recording.</p>")
    parts.append(render_table(tables.latency_table(data.overall, "Percentiles, all requests")))
    parts.append(render_table(tables.endpoint_table(data)))
    if (models := tables.model_table(data)) is not None:
        parts.append(render_table(models))
    if (cgroups := tables.cgroup_table(data)) is not None:
        parts.append(render_table(cgroups))
    parts.append("</section>")
    return "".join(parts)


def _over_time(data: ReportData, progress: Progress) -> str:
    s = data.series
    parts = [f'<section id="{ANCHOR_OVER_TIME}"><h2>Over time</h2>']
    if s is None or not data.requests:
        parts.append("<p>No requests in this recording.</p>")
    else:
        progress("drawing latency over time")
        gauges = ("the server's queue length" if s.queue_waiting else "") + (
            " and token occupancy" if s.kv_occupancy else "")
        extra = f", with {gauges} from its probes" if gauges else (
            "; queue length and token occupancy appear here when the server's USDT probes are attached")
        parts.append(f"<p>TTFT per request, inter-token latency and request rate per {s.bin_s:g} s "
                     f"on one time axis{_e(extra)}.</p>")
        parts.append(_figure(charts.over_time(s), "Bursts show as TTFT spikes lined up with rate or "
                             "queue peaks."))
    parts.append("</section>")
    return "".join(parts)


def _analyzer_section(sec: AnalyzerSection) -> str:
    parts = [f'<section id="{_e(sec.anchor)}"><h2>{_e(sec.title)}</h2><p>{_e(sec.summary)}</p>',
             '<ul class="sources">']
    for src in sec.sources:
        cls = "on" if src.active else "off"
        parts.append(f'<li class="{cls}"><b>{_e(src.name)}</b>: {_e(src.detail)}</li>')
    parts.append("</ul>")
    if sec.flame is not None:
        # trusted markup: inferprobe's own flame graph renderer escapes every frame name
        picture, caption = flame_html.draw(sec.flame)
        parts.append(f'<figure class="flame">{picture}'
                     f'<figcaption>{_e(caption)}</figcaption></figure>')
    parts.extend(render_table(t) for t in sec.tables)
    parts.extend(_figure(charts.bar_chart(c), c.title) for c in sec.charts)
    parts.extend(_figure(charts.scatter_chart(c), f"{c.title}: measured points and the {c.line_label}")
                 for c in sec.scatters)
    parts.extend(f'<p class="note">{_e(n)}</p>' for n in sec.notes)
    parts.append("</section>")
    return "".join(parts)


def render_html(data: ReportData, progress: Progress | None = None,
                sections: Sequence[AnalyzerSection] | None = None) -> str:
    """The report as one HTML page; `sections`, the analyzer sections, are built from data
    unless given."""
    progress = progress or (lambda _msg: None)
    sections = sections_of(data) if sections is None else sections
    rec = data.recording
    meta = rec.meta
    targets = ", ".join(f"{t.comm} ({t.pid})" for t in meta.targets)
    titles = {ANCHOR_VERDICT: "Verdict", ANCHOR_DECOMPOSITION: "Latency decomposition",
              ANCHOR_DISTRIBUTIONS: "Distributions", ANCHOR_OVER_TIME: "Over time",
              ANCHOR_FACTS: "Recording facts"}
    titles.update({s.anchor: s.title for s in sections})
    nav_order = [ANCHOR_VERDICT, ANCHOR_DECOMPOSITION, ANCHOR_DISTRIBUTIONS, ANCHOR_OVER_TIME,
                 *[s.anchor for s in sections], ANCHOR_FACTS]
    body = [
        "<header><h1>Why is latency high?</h1>",
        f'<p class="sub">inferprobe report · host {_e(meta.host or "?")} · targets {_e(targets or "?")}'
        f" · {data.overall.requests} requests</p></header>",
        "<nav>" + "".join(f'<a href="#{a}">{_e(titles[a])}</a>' for a in nav_order) + "</nav>",
    ]
    body.extend(f'<p class="warning">{_e(w)}</p>' for w in tables.warnings(data))
    body.extend(f'<p class="note">{_e(n)}</p>' for n in tables.notes(data))
    body.append(_verdict(data, titles))
    body.append(_decomposition(data, progress))
    body.append(_distributions(data, progress))
    body.append(_over_time(data, progress))
    progress("rendering analyzer sections")
    body.extend(_analyzer_section(s) for s in sections)
    body.append(f'<section id="{ANCHOR_FACTS}"><h2>Recording facts</h2>'
                f"{render_table(tables.facts_table(data), 'facts')}</section>")
    body.append("<footer>Times are from the kernel's monotonic clock, taken at syscall entry and exit "
                "on the server's sockets; request and response bodies never left the kernel.</footer>")
    templates = resources.files("inferprobe.reports") / "templates"
    page = Template((templates / "report.html").read_text())
    return page.substitute(
        title=_e(f"inferprobe report: {meta.host or '?'}"),
        version=_e(meta.inferprobe_version or "?"),
        css=(templates / "report.css").read_text(),
        body="\n".join(body),
    )
