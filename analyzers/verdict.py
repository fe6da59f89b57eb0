"""Findings from the request timelines themselves: which TTFT phase dominates
the tail, and how much streaming time is lost in decode stalls.

Each finding points at the report section that shows its evidence; the
anchors below are the report's fixed sections.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from inferprobe.analyzers.breakdown import (
    SOCKET_PHASE_WORDS,
    SOURCE_ENGINE_IPC,
    SOURCE_SOCKETS,
    Breakdown,
)
from inferprobe.analyzers.cadence import percentile
from inferprobe.analyzers.engine_metrics import EngineMetricsSummary
from inferprobe.analyzers.engine_ttft import (
    ENGINE_KNOBS,
    ENGINE_NAMES,
    engine_advice,
    engine_ttft_view,
)
from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.timeseries import TimeSeries
from inferprobe.analyzers.units import ms_text
from inferprobe.collector.model.timeline import Request
from inferprobe.collector.shared_constants import OPT_IN_FLAGS

ANCHOR_VERDICT = "verdict"
ANCHOR_DECOMPOSITION = "decomposition"
ANCHOR_DISTRIBUTIONS = "distributions"
ANCHOR_OVER_TIME = "over-time"
ANCHOR_FACTS = "recording"

STALL_FACTOR = 2.0  # a gap this many times the median ITL is a stall
STALL_MIN_NS = 1_000_000  # ...and at least this long: sub-ms jitter is not worth a finding
STALL_MIN_SHARE = 0.05

# Recommendation per USDT phase, matched on a word in the phase's name.
PHASE_ADVICE = (
    ("queue", "requests wait for a batch slot: raise the maximum batch size (or tokens per batch) "
              "if the GPU has headroom, otherwise add capacity or shed load"),
    ("sched", "admitted requests wait for their own prefill to start: prefills run one after "
              "another, or scheduler work sits in between; batch prefills (chunked prefill, a "
              "larger token budget per step) and profile the scheduling step before adding hardware"),
    ("prefill", "prefill dominates: enable prefix caching or chunked prefill, or cap prompt length"),
    ("launch", "the first GPU launch is late: the GPU is busy with other work or the launch "
               "path blocks; look at the GPU section"),
    ("flush", "the first token waits between the engine and the socket (API layer, detokenizer, "
              "Nagle): set TCP_NODELAY and flush each SSE event as it is produced"),
    ("first_token", "sampling and handing the first token to the API layer is slow: look at the "
                    "detokenizer and the queue between engine and API server"),
    ("ingress", "reading the request is slow: large bodies or a slow client upload"),
    ("handoff", "requests wait for the engine loop to take them in: it admits new requests only "
                "between steps, so each waits for the step under way; shorter steps (a smaller token "
                "budget per step, chunked prefill) shorten the wait"),
)


def record_again_with(active: Collection[str], wanted: Sequence[str]) -> str | None:
    """The record flags that turn on the wanted probe sets this recording lacked,
    e.g. "--locks --offcpu"; None when it had them all."""
    missing = [OPT_IN_FLAGS[name] for name in wanted if name not in active and name in OPT_IN_FLAGS]
    return " ".join(missing) or None


# What the USDT phases measure, said in the verdict with the phase's name
# (docs/report-json.md, "Phases"): a name alone ("queue") reads as the
# engine's waiting queue, which it is only when that queue is non-empty.
PHASE_MEANING = {
    "queue": "from request_queued to request_scheduled",
    "schedule": "from request_scheduled to its prefill_start",
}
# The same phases measured inside llama.cpp through its engine steps (llama_decode, llama_process)
# (collector/ingest/llama_view.py), where there is no request_queued probe.
ENGINE_UPROBE_PHASE_MEANING = {
    "queue": "from the request's read to its sequence's first llama.cpp engine step",
}
# ... and read from the messages between an engine's processes (vLLM: collector/ingest/engine_ipc_view.py).
ENGINE_IPC_PHASE_MEANING = {
    "handoff": "from the API server's hand-off to the engine loop taking the request in",
    "queue": "from the engine's QUEUED event to its SCHEDULED, vLLM's own time_in_queue",
    "prefill": "from the engine scheduling the request to the end of the step that gave its first token",
    "network_flush": "from that step's end to the first token's socket write: the API server's "
                     "detokenisation and SSE",
}
# The queue phase while the engine's waiting-queue gauge stays at 0: the
# request waited to be taken in, not for room in the batch.
ADMISSION_ADVICE = (
    "requests wait for the engine loop to take them in, not for a batch slot: the engine admits new "
    "requests only between its steps, so admit on arrival (wake the loop) or shorten each step (fewer "
    "or smaller prefills per iteration) rather than raising the batch size"
)


def _no_slot_waits(series: TimeSeries | None) -> bool:
    """The engine's own gauge says no request ever waited for a batch slot."""
    return series is not None and series.queue_peak == 0


def _queue_context(series: TimeSeries | None) -> str:
    if series is None or series.queue_peak is None:
        return ""
    running = f", at most {series.running_peak} running" if series.running_peak is not None else ""
    if series.queue_peak == 0:
        return f"; no request waited for a batch slot (the engine's waiting-queue gauge stayed at 0{running})"
    return f"; the engine's waiting queue peaked at {series.queue_peak}{running}"


def _median_view(decomp: Breakdown, p99_phase: str) -> str:
    """The p50 request's dominant phase where it differs from p99's, so that the
    verdict agrees with the decomposition table beside it."""
    p50 = next((b for b in decomp.ttft if b.label == "p50"), None)
    if p50 is None or p50.ttft_ns <= 0:
        return ""
    phase, ns = p50.dominant()
    if phase == p99_phase:
        return ""
    return f" (at p50, {round(ns / p50.ttft_ns * 100)} % is {phase.replace('_', ' ')})"


def ttft_phase_finding(decomp: Breakdown, series: TimeSeries | None, active: Collection[str] = (),
                       engine: EngineMetricsSummary | None = None) -> Finding | None:
    p99 = next((b for b in decomp.ttft if b.label == "p99"), None)
    if p99 is None or p99.ttft_ns <= 0:
        return None
    phase, phase_ns = p99.dominant()
    share = phase_ns / p99.ttft_ns
    head = f"{round(share * 100)} % of p99 TTFT ({ms_text(phase_ns)} of {ms_text(p99.ttft_ns)})"
    median = _median_view(decomp, phase)
    queue = _queue_context(series)
    if decomp.source == SOURCE_SOCKETS:
        where = SOCKET_PHASE_WORDS.get(phase, f"is in the phase '{phase}'")
        sentence = f"{head} {where}{median}{queue}."
        # The sockets cannot split it; an engine that publishes its own per-request phases can,
        # and a known engine takes its own flags, not inferprobe's probes.
        if (view := engine_ttft_view(engine)) is not None:
            sentence = f"{head} {where}{median}{queue}; {view.sentence()}."
            recommendation = view.recommendation()
        elif (advice := engine_advice(engine)) is not None:
            recommendation = advice[0].upper() + advice[1:]
        else:
            recommendation = (
                "Load the server's inferprobe USDT probes (import inferprobe.probes) to split queueing "
                "from prefill; if requests queue, raise the maximum batch size or add capacity."
            )
    else:
        meanings = (ENGINE_IPC_PHASE_MEANING if decomp.source == SOURCE_ENGINE_IPC
                    else ENGINE_UPROBE_PHASE_MEANING if "llama" in active and "usdt" not in active
                    else PHASE_MEANING)
        meaning = f" ({meanings[phase]})" if phase in meanings else ""
        sentence = f"{head} is the {phase.replace('_', ' ')} phase{meaning}{median}{queue}."
        known = engine.engine if engine is not None and engine.engine in ENGINE_KNOBS else None
        if phase == "queue" and _no_slot_waits(series):
            advice = ADMISSION_ADVICE
        elif known is not None and phase in ("queue", "prefill"):
            # the engine's own flags: inferprobe's probes are not something it can load
            queue_knob, prefill_knob = ENGINE_KNOBS[known]
            advice = f"in {ENGINE_NAMES[known]}, " + (queue_knob if phase == "queue" else prefill_knob)
        else:
            advice = next((a for word, a in PHASE_ADVICE if word in phase.lower()),
                          f"look at what the server does during '{phase}'")
        recommendation = advice[0].upper() + advice[1:] + "."
        if "flush" in phase and (flags := record_again_with(active, ("network",))):
            recommendation += f" Record again with {flags} to see each chunk's write-to-wire delay and Nagle."
    return Finding(kind="ttft.phase", share=share, of="p99 TTFT", sentence=sentence,
                   recommendation=recommendation, evidence=ANCHOR_DECOMPOSITION, source="decompose")


def itl_stall_finding(requests: Sequence[Request], active: Collection[str] = ()) -> Finding | None:
    gaps = [g for r in requests for g in r.itl_ns]
    median = percentile(gaps, 50)
    if not gaps or not median:
        return None
    threshold = max(STALL_FACTOR * median, STALL_MIN_NS)
    stalls = [g for g in gaps if g > threshold]
    total = sum(gaps)
    share = sum(stalls) / total if total else 0.0
    if share < STALL_MIN_SHARE:
        return None
    sentence = (
        f"{round(share * 100)} % of streaming time is spent in {len(stalls)} of {len(gaps)} token gaps "
        f"longer than {ms_text(threshold)} ({STALL_FACTOR:g}x the median inter-token latency of "
        f"{ms_text(median)}); "
        f"the longest is {ms_text(max(stalls))}."
    )
    flags = record_again_with(active, ("locks", "offcpu"))
    see = (f"record again with {flags} to see what the decoding thread waited for" if flags else
           "the lock and off-CPU sections show what the decoding thread waited for")
    recommendation = (
        f"The gaps lie between the server's own writes, so its decode loop paused: {see}, and bound the "
        "decode step time (smaller batches, fewer long prefills mixed into decoding)."
    )
    return Finding(kind="itl.stalls", share=share, of="streaming time", sentence=sentence,
                   recommendation=recommendation, evidence=ANCHOR_DISTRIBUTIONS, source="cadence")


def core_findings(requests: Sequence[Request], decomp: Breakdown,
                  series: TimeSeries | None, active: Collection[str] = (),
                  engine: EngineMetricsSummary | None = None) -> list[Finding]:
    """active: the probe sets the recording had, so a finding another set
    would explain names the flag that turns it on; engine: its own /metrics, scraped."""
    found = [ttft_phase_finding(decomp, series, active, engine), itl_stall_finding(requests, active)]
    return [f for f in found if f is not None]
