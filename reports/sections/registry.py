"""Every section of the report that an analyzer's results make, in the order
the report shows them.

To add one: write `build(AnalysisInput) -> AnalyzerSection | None` in its own
module here (None when the recording holds nothing for it) and list it below;
a finding it should rank in the verdict is the analyzer's (analyzers/registry.py).
"""

from __future__ import annotations

from collections.abc import Callable

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.report_data import ReportData
from inferprobe.reports.sections import (
    batching,
    client_calls,
    diagnostics,
    engine_metrics,
    http,
    phase_sources,
    proxy_hops,
    stacks,
    usdt,
)
from inferprobe.reports.sections.model import AnalyzerSection

Builder = Callable[[AnalysisInput], AnalyzerSection | None]

BUILDERS: tuple[Builder, ...] = (
    http.build,
    client_calls.build,
    proxy_hops.build,
    usdt.build,
    phase_sources.build,
    batching.build,
    engine_metrics.build,
    diagnostics.locks,
    diagnostics.network,
    diagnostics.gpu,
    stacks.on_cpu,
    stacks.off_cpu,
)


def sections_of(data: ReportData) -> list[AnalyzerSection]:
    """The report's analyzer sections, built from what report_data.build computed."""
    inp = data.analysis_input
    return [section for build in BUILDERS if (section := build(inp)) is not None]
