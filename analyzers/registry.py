"""Every analyzer whose findings join the verdict beside the core ones
(analyzers/verdict.py), in the order they are added before ranking.

To add one: write a function of AnalysisInput that returns its findings
(none where the recording holds nothing for it) and list it here; the
report section that shows its evidence is reports/sections/registry.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inferprobe.analyzers import client_calls, diagnostic_findings, engine_metrics_ttft
from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.batching import finding as batching_finding
from inferprobe.analyzers.batching import shown as batching_shown
from inferprobe.analyzers.findings import Finding

Finder = Callable[[AnalysisInput], Sequence[Finding]]


def _one(found: Finding | None) -> tuple[Finding, ...]:
    return (found,) if found is not None else ()


def _client_calls(inp: AnalysisInput) -> Sequence[Finding]:
    return _one(client_calls.retries_finding(inp.client_calls))


def _proxy_hops(inp: AnalysisInput) -> Sequence[Finding]:
    return inp.proxy_hops.findings if inp.proxy_hops is not None else ()


def _batching(inp: AnalysisInput) -> Sequence[Finding]:
    return _one(batching_finding(inp.batching)) if batching_shown(inp.batching) else ()


def _engine_metrics(inp: AnalysisInput) -> Sequence[Finding]:
    summary = inp.engine_metrics
    if summary is None or summary.ttft is None or summary.ttft.count <= 0:
        return ()
    return _one(engine_metrics_ttft.ttft_disagreement(summary, list(inp.requests)))


def _locks(inp: AnalysisInput) -> Sequence[Finding]:
    if not inp.recording.meta.probe_sets.present("locks") or inp.locks is None:
        return ()
    return _one(diagnostic_findings.lock_finding(inp.locks, inp.requests))


def _network(inp: AnalysisInput) -> Sequence[Finding]:
    if not inp.recording.meta.probe_sets.present("network") or inp.network is None:
        return ()
    return diagnostic_findings.network_findings(inp.network, inp.network_findings, inp.requests)


def _gpu(inp: AnalysisInput) -> Sequence[Finding]:
    if not inp.recording.meta.probe_sets.present("gpu") or inp.gpu is None:
        return ()
    return diagnostic_findings.gpu_findings(inp.gpu)


FINDERS: tuple[Finder, ...] = (_client_calls, _proxy_hops, _batching, _engine_metrics, _locks, _network,
                               _gpu)
