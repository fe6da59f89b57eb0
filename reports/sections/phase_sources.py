"""Where each request's phases came from: the server's USDT probes, the
engine's own code through uprobes (llama.cpp's engine steps), or the
sockets only; and where the scheduler gauges came from (those two, or the
engine's /metrics endpoint). A reader needs it to know how far to trust a
queue or prefill figure: USDT is what the server says, engine uprobes are
measured inside the engine and tied to requests first in, first out, the
metrics endpoint is sampled every 250 ms."""

from __future__ import annotations

from collections import Counter

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.engine_metrics import OCCUPANCY
from inferprobe.collector.ingest.engine_ipc_view import KNOWN_LAYOUTS
from inferprobe.collector.ingest.llama_view import phase_source
from inferprobe.collector.model.events import EngineIpcRecord, LlamaStepRecord, UsdtProbe, UsdtRecord
from inferprobe.reports.sections.model import AnalyzerSection, Table, source_states

ANCHOR = "analyzer-phase-sources"
WHAT = {
    "usdt": "queue, schedule, prefill, first token, decode steps: as the server's probes fired them",
    "engine_uprobes": "queue wait, prefill, decode steps and batch sizes: llama.cpp's engine steps "
                      "(llama_decode or llama_process calls), tied first in, first out",
    "engine_ipc": "hand-off, queue, prefill, decode steps and batch sizes: the messages between the "
                  "engine's processes (vLLM's API server and EngineCore), with the engine's own queue times",
    "sockets only": "response headers, first token chunk, decode, finish: on the wire only",
}


def gauge_sources(inp: AnalysisInput) -> list[str]:
    found = []
    if any(isinstance(e, UsdtRecord) and e.probe in (UsdtProbe.QUEUE_DEPTH, UsdtProbe.KV_USAGE)
           for e in inp.events):
        found.append("usdt")
    if any(isinstance(e, LlamaStepRecord) for e in inp.events):
        found.append("engine_uprobes")
    if any(isinstance(e, EngineIpcRecord) for e in inp.events):
        found.append("engine_ipc")
    if inp.engine_metrics is not None:
        found.append("engine_metrics")
    return found


def occupancy_sources(inp: AnalysisInput) -> list[str]:
    """Where token_occupancy_ratio came from: the server's kv_usage probe, or an engine
    that publishes its KV-cache use (llama.cpp's steps do not say it)."""
    found = []
    if any(isinstance(e, UsdtRecord) and e.probe == UsdtProbe.KV_USAGE for e in inp.events):
        found.append("usdt")
    summary = inp.engine_metrics
    if summary is not None and OCCUPANCY in summary.series:
        found.append("engine_metrics")
    return found


def _notes(inp: AnalysisInput, counts: Counter) -> tuple[str, ...]:
    notes = []
    if counts["engine_uprobes"]:
        notes.append("engine_uprobes ties a request to the sequence that started next in order: a request "
                     "the engine never decoded shifts the ties after it until one ends without a sequence.")
    unread = inp.recording.counter("engine_ipc_unread")
    if unread:
        # never guessed at: those requests keep the sockets' phases and the engine's scraped histograms
        notes.append(f"{unread} message(s) between the engine's processes were not in a layout inferprobe "
                     f"reads ({KNOWN_LAYOUTS}): their requests' phases come from the sockets, and the "
                     "engine's own histograms where it publishes them.")
    return tuple(notes)


def build(inp: AnalysisInput) -> AnalyzerSection | None:
    if not inp.requests:
        return None
    counts = Counter(phase_source(r) for r in inp.requests)
    rows = tuple((source, str(counts[source]), WHAT[source])
                 for source in ("usdt", "engine_uprobes", "engine_ipc", "sockets only") if counts[source])
    gauges = gauge_sources(inp)
    return AnalyzerSection(
        anchor=ANCHOR, title="Where the phases came from",
        summary=("Each request's phases, and the scheduler gauges, by the source they were measured at "
                 "(docs/engines.md)."),
        sources=source_states(inp.recording.meta, ["usdt", "llama"]),
        tables=(Table(caption="Requests by the source of their phases",
                      columns=("source", "requests", "phases it gives"), rows=rows),
                Table(caption="Scheduler gauges", columns=("gauge", "from"),
                      rows=(("scheduler_queue_length, running requests", ", ".join(gauges) or "none"),
                            ("token_occupancy_ratio", ", ".join(occupancy_sources(inp)) or "none"),
                            ("batch_stall_duration_seconds",
                             ", ".join(g for g in gauges if g != "engine_metrics") or "none")))),
        notes=_notes(inp, counts))
