"""Whether the engine's own TTFT histogram agrees with the wire's: a finding
where it does not.

The wire's TTFT runs from the request's read to its first token chunk's
write. An engine's own TTFT starts where the engine first sees the request:
vLLM took arrival after tokenisation (vLLM PR #37498), so its histogram
leaves out tokenisation and the HTTP front-end, and undercounts. A
histogram only says which bucket its median lies in, so the two disagree
only when the wire's median lies outside that bucket (widened by
AGREEMENT_MARGIN for the clocks' different start and end points).
"""

from __future__ import annotations

import statistics

from inferprobe.analyzers.engine_metrics import EngineMetricsSummary, summarize
from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.units import ms
from inferprobe.collector.model.recording import Recording
from inferprobe.collector.model.timeline import Request

ANCHOR = "analyzer-engine-metrics"  # the report section (reports/sections/engine_metrics.py)
AGREEMENT_MARGIN = 0.10
MIN_OBSERVATIONS = 5  # fewer requests in the engine's histogram say too little


def summary_of(recording: Recording) -> EngineMetricsSummary | None:
    return summarize(recording.engine_scrapes, (recording.final or {}).get("engine_metrics"))


def wire_ttft_median_ns(requests: list[Request], summary: EngineMetricsSummary) -> float | None:
    """The wire's median TTFT over the requests that began while the engine was scraped."""
    ttfts = [r.ttft_ns for r in requests
             if r.ttft_ns is not None and summary.t_first_ns <= r.t_ingress_ns <= summary.t_last_ns]
    return statistics.median(ttfts) if ttfts else None


def ttft_disagreement(summary: EngineMetricsSummary, requests: list[Request]) -> Finding | None:
    hist = summary.ttft
    if hist is None or hist.count < MIN_OBSERVATIONS:
        return None
    bounds = hist.quantile_bounds(0.5)
    wire = wire_ttft_median_ns(requests, summary)
    if bounds is None or wire is None or wire <= 0:
        return None
    lo_ns, hi_ns = bounds[0] * 1e9, bounds[1] * 1e9
    if lo_ns * (1 - AGREEMENT_MARGIN) <= wire <= hi_ns * (1 + AGREEMENT_MARGIN):
        return None
    engine = hist.quantile(0.5)
    engine_ns = (engine or 0.0) * 1e9
    gap = abs(wire - engine_ns)
    side = "below" if engine_ns < wire else "above"
    return Finding(
        kind="engine_metrics.ttft_disagrees",
        sentence=(f"the engine's own TTFT ({hist.metric}) puts the median at {ms(engine_ns)} ms, {side} "
                  f"the {ms(wire)} ms measured on the wire, over {hist.count:.0f} requests"),
        source="engine_metrics",
        recommendation=("alert on the wire's TTFT (gen_ai_server_time_to_first_token_seconds): an engine "
                        "starts its clock where it first sees a request, after the HTTP front-end and "
                        "tokenisation (vLLM PR #37498)" if side == "below" else
                        "check the engine's clock against the wire's: its TTFT includes time the wire "
                        "does not see (a first chunk written before the engine counts its first token)"),
        share=min(1.0, gap / wire), of="p50 TTFT", evidence=ANCHOR,
        value=gap / 1e9, figures={"engine_p50_s": engine, "wire_p50_s": wire / 1e9,
                                  "engine_bucket_s": [bounds[0], bounds[1]], "observations": hist.count})
