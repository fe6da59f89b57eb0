"""Charts for the HTML report, as inline SVG strings.

matplotlib, through its SVG backend and the object API (no pyplot, no GUI
backend): it is the best-kept Python plotting library, draws legible axes,
ticks and units without hand-written tick logic, and writes SVG with no
script and no network reference. Text stays text (svg.fonttype "none") so
the charts are small, searchable and printable; a fixed hash salt and no
date make the same data give the same bytes.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

from inferprobe.analyzers.breakdown import Breakdown
from inferprobe.analyzers.cadence import Distribution
from inferprobe.analyzers.timeseries import TimeSeries
from inferprobe.analyzers.units import ms
from inferprobe.collector.errors import InferprobeError
from inferprobe.reports.sections.model import BarChart, ScatterChart

WIDTH_IN = 8.0
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
PERCENTILE_COLOURS = {"p50": "#59a14f", "p90": "#edc948", "p99": "#e15759"}


def _figure(height_in: float, rows: int = 1, sharex: bool = False):
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise InferprobeError(
            "the HTML report draws its charts with matplotlib, which is not installed: "
            "pip install 'inferprobe[html]' (or use --format md)"
        ) from None
    matplotlib.rcParams.update({
        "svg.fonttype": "none",
        "svg.hashsalt": "inferprobe",
        "font.size": 9,
        "font.family": "sans-serif",
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
    })
    fig = Figure(figsize=(WIDTH_IN, height_in), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=sharex, squeeze=False)[:, 0]
    return fig, list(axes)


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    # inline in HTML: no XML prolog, no RDF metadata, no namespace URIs (the
    # HTML parser puts <svg> in the SVG namespace by itself)
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", text)
    return text


def phase_colours(names: Sequence[str]) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def ttft_breakdown(decomp: Breakdown) -> str:
    fig, (ax,) = _figure(0.9 + 0.45 * len(decomp.ttft))
    colours = phase_colours(decomp.phase_names)
    labels = [f"{b.label}  ({ms(b.ttft_ns, places=1, unit=True)})" for b in decomp.ttft]
    seen = set()
    for y, b in enumerate(decomp.ttft):
        left = 0.0
        for name, ns in b.phases:
            width = ns / 1e6
            ax.barh(y, width, left=left, color=colours[name], height=0.6,
                    label=None if name in seen else name)
            seen.add(name)
            left += width
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time to first token (ms), split by phase")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3, frameon=False)
    return _svg(fig)


def itl_breakdown(decomp: Breakdown) -> str:
    fig, (ax,) = _figure(0.9 + 0.45 * len(decomp.itl))
    colours = phase_colours([n for n, _ in decomp.itl[0].phases])
    seen = set()
    for y, b in enumerate(decomp.itl):
        left = 0.0
        for name, ns in b.phases:
            ax.barh(y, ns / 1e6, left=left, color=colours[name], height=0.6,
                    label=None if name in seen else name)
            seen.add(name)
            left += ns / 1e6
    ax.set_yticks(range(len(decomp.itl)), [f"{b.label}  ({ms(b.itl_ns, unit=True)})" for b in decomp.itl])
    ax.invert_yaxis()
    ax.set_xlabel("inter-token gap (ms), split by phase")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=4, frameon=False)
    return _svg(fig)


def waterfall(decomp: Breakdown) -> str:
    rows = decomp.waterfall
    fig, (ax,) = _figure(1.0 + 0.3 * len(rows))
    colours = phase_colours(decomp.phase_names)
    seen = set()
    for y, row in enumerate(rows):
        left = 0.0
        for name, ns in row.phases:
            ax.barh(y, ns / 1e6, left=left, color=colours.get(name, "#999"), height=0.6,
                    label=None if name in seen else name)
            seen.add(name)
            left += ns / 1e6
        ticks = [t / 1e6 for t in row.token_offsets_ns]
        ax.scatter(ticks, [y] * len(ticks), marker="|", color="black", s=60, linewidths=1,
                   label=None if "token" in seen else "token chunk written", zorder=3)
        seen.add("token")
    ax.set_yticks(range(len(rows)),
                  [f"conn {r.request.conn}, TTFT {ms(r.ttft_ns, places=1, unit=True)}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time since the request was read (ms)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
    return _svg(fig)


def histogram(values_ns: Sequence[int], marks: Distribution, what: str, count_label: str) -> str:
    """Histogram in ms with the model's p50/p90/p99 of those values marked; log-spaced bins for
    wide ranges."""
    import numpy as np

    fig, (ax,) = _figure(2.4)
    values = np.asarray(values_ns, dtype=float) / 1e6
    lo, hi = float(values.min()), float(values.max())
    bins: int | np.ndarray
    if lo > 0 and hi / lo > 50:
        bins = np.geomspace(lo, hi, 40)
        ax.set_xscale("log")
    else:
        bins = 40
    ax.hist(values, bins=bins, color="#4e79a7")
    for label, at in (("p50", marks.p50), ("p90", marks.p90), ("p99", marks.p99)):
        if at is None:  # the marks are of these values: only an empty list has none
            continue
        ax.axvline(at / 1e6, color=PERCENTILE_COLOURS[label], linewidth=1.5,
                   label=f"{label} {ms(at, unit=True)}")
    ax.set_xlabel(f"{what} (ms)")
    ax.set_ylabel(count_label)
    ax.legend(frameon=False)
    return _svg(fig)


def over_time(series: TimeSeries) -> str:
    panels = ["ttft", "itl", "rate"]
    if series.queue_waiting:
        panels.append("queue")
    if series.kv_occupancy:
        panels.append("kv")
    fig, axes = _figure(1.5 * len(panels) + 0.5, rows=len(panels), sharex=True)
    mids = [b.t_s + series.bin_s / 2 for b in series.bins]
    for ax, panel in zip(axes, panels, strict=True):
        if panel == "ttft":
            ax.scatter([t for t, _ in series.ttft_points], [v / 1e6 for _, v in series.ttft_points],
                       s=6, color="#4e79a7")
            ax.set_ylabel("TTFT (ms)")
        elif panel == "itl":
            for key, colour, label in (("itl_p50_ns", "#59a14f", "p50"), ("itl_p99_ns", "#e15759", "p99")):
                pts = [(m, getattr(b, key) / 1e6) for m, b in zip(mids, series.bins, strict=True)
                       if getattr(b, key) is not None]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", color=colour, label=label)
            ax.set_ylabel("inter-token (ms)")
            ax.legend(frameon=False, loc="upper right")
        elif panel == "rate":
            ax.bar([b.t_s for b in series.bins], [b.requests / series.bin_s for b in series.bins],
                   width=series.bin_s, align="edge", color="#bab0ac")
            ax.set_ylabel("requests/s")
        elif panel == "queue":
            ax.step([t for t, _ in series.queue_waiting], [v for _, v in series.queue_waiting],
                    where="post", color="#f28e2b", label="waiting")
            ax.step([t for t, _ in series.queue_running], [v for _, v in series.queue_running],
                    where="post", color="#4e79a7", label="running")
            ax.set_ylabel("queue (requests)")
            ax.legend(frameon=False, loc="upper right")
        elif panel == "kv":
            ax.step([t for t, _ in series.kv_occupancy], [v * 100 for _, v in series.kv_occupancy],
                    where="post", color="#b07aa1")
            ax.set_ylabel("token occupancy (%)")
            ax.set_ylim(0, 100)
    axes[-1].set_xlabel(f"time since recording start (s); bins of {series.bin_s:g} s")
    return _svg(fig)


def bar_chart(chart: BarChart) -> str:
    fig, (ax,) = _figure(0.8 + 0.3 * len(chart.bars))
    ax.barh(range(len(chart.bars)), [v for _, v in chart.bars], color="#4e79a7", height=0.6)
    ax.set_yticks(range(len(chart.bars)), [label for label, _ in chart.bars])
    ax.invert_yaxis()
    ax.set_xlabel(chart.value_label)
    ax.set_title(chart.title, loc="left")
    return _svg(fig)


def scatter_chart(chart: ScatterChart) -> str:
    fig, (ax,) = _figure(3.2)
    ax.scatter([x for x, _ in chart.points], [y for _, y in chart.points], s=9, alpha=0.35, color="#4e79a7",
               label="recorded steps")
    if chart.line:
        ax.plot([x for x, _ in chart.line], [y for _, y in chart.line], color="#e15759", linewidth=1.5,
                label=chart.line_label)
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", frameon=False)
    ax.set_title(chart.title, loc="left")
    return _svg(fig)
