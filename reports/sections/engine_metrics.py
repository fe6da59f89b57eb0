"""The engine-metrics section: the engine's own gauges beside the wire's
numbers (the finding when its TTFT histogram disagrees with the wire's is
analyzers/engine_metrics_ttft.py's)."""

from __future__ import annotations

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.engine_metrics import GAUGES, OCCUPANCY
from inferprobe.analyzers.engine_metrics_ttft import ANCHOR, wire_ttft_median_ns
from inferprobe.analyzers.units import ms
from inferprobe.reports.sections.model import AnalyzerSection, SourceState, Table


def _value(gauge: str, v: float) -> str:
    return f"{v * 100:.0f} %" if gauge == OCCUPANCY else f"{v:g}"


def build(inp: AnalysisInput) -> AnalyzerSection | None:
    summary = inp.engine_metrics
    if summary is None:
        return None
    rows = [(gauge, summary.series[gauge].metric, _value(gauge, summary.series[gauge].peak),
             _value(gauge, summary.series[gauge].last))
            for gauge in GAUGES if gauge in summary.series]
    rows.append(("batch_stall_duration_seconds", "(no engine publishes it)", "-", "-"))
    tables = [Table(caption=f"Engine gauges ({summary.engine or 'unknown engine'}, {summary.url})",
                    columns=("gauge", "engine metric", "peak", "last"), rows=tuple(rows))]
    notes = []
    if summary.ttft is not None and summary.ttft.count > 0:
        wire = wire_ttft_median_ns(list(inp.requests), summary)
        engine_p50 = summary.ttft.quantile(0.5)
        tables.append(Table(caption="TTFT: the engine's histogram and the wire",
                            columns=("source", "p50 (ms)", "requests"),
                            rows=((summary.ttft.metric, ms(None if engine_p50 is None else engine_p50 * 1e9),
                                   f"{summary.ttft.count:.0f}"),
                                  ("wire (read -> first token chunk)", ms(wire), "-"))))
    stats = summary.stats
    for key, what in (("series_dropped", "series past the per-scrape cap"),
                      ("scrapes_dropped", "scrapes past the recording's sample cap"),
                      ("failures", "failed scrapes")):
        if stats.get(key):
            notes.append(f"{stats[key]} {what} were not recorded")
    notes.append("Engine gauges are sampled every 250 ms: a queue that fills and drains between two "
                 "scrapes is not seen; they carry no per-request phase.")
    section = AnalyzerSection(
        anchor=ANCHOR, title="Engine metrics",
        summary=(f"The engine's own Prometheus endpoint, scraped {summary.scrapes} times while recording, "
                 "mapped onto the design card's gauges (docs/engines.md)."),
        sources=(SourceState("engine_metrics", True, summary.url),),
        tables=tuple(tables), notes=tuple(notes))
    return section
