"""Every analyzer that contributes a report section and findings.

To add one: write `analyze(AnalysisInput) -> AnalyzerResult | None` in its
own module (None when the recording holds nothing for it) and list it here.
The order here is the order of the sections in the report.
"""

from __future__ import annotations

from collections.abc import Callable

from inferprobe.analyzers import (
    batching_section,
    client_section,
    diagnostics_sections,
    engine_metrics_section,
    http_section,
    phase_sources,
    proxy_section,
    stacks_section,
    usdt_section,
)
from inferprobe.analyzers.sections import AnalysisInput, AnalyzerResult

Analyzer = Callable[[AnalysisInput], AnalyzerResult | None]

ANALYZERS: tuple[Analyzer, ...] = (
    http_section.analyze,
    client_section.analyze,
    proxy_section.analyze,
    usdt_section.analyze,
    phase_sources.analyze,
    batching_section.analyze,
    engine_metrics_section.analyze,
    diagnostics_sections.locks,
    diagnostics_sections.network,
    diagnostics_sections.gpu,
    stacks_section.on_cpu,
    stacks_section.off_cpu,
)
