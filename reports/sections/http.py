"""The HTTP-over-sockets analyzer section: what the socket probes saw."""

from __future__ import annotations

from collections import Counter

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.reports.sections.model import AnalyzerSection, Table, source_states


def build(inp: AnalysisInput) -> AnalyzerSection:
    reqs = inp.requests
    statuses = Counter(str(r.status) if r.status is not None else "none" for r in reqs)
    outcomes = Counter(r.outcome.value for r in reqs)
    chunks = [n for r in reqs for n in r.token_events]
    multi = sum(1 for n in chunks if n > 1)
    conns = {r.conn for r in reqs}
    rows = (
        ("requests", str(len(reqs))),
        ("connections carrying requests", str(len(conns))),
        ("streaming responses", str(sum(1 for r in reqs if r.streaming))),
        ("token chunks (writes with SSE data)", str(len(chunks))),
        ("chunks with more than one SSE event", str(multi)),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))),
        ("status codes", ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))),
    )
    return AnalyzerSection(
        anchor="analyzer-sockets",
        title="HTTP over sockets",
        summary="Requests, responses and token chunks as the kernel saw them on the server's sockets.",
        sources=source_states(inp.recording.meta, ["sockets"]),
        tables=(Table(caption="What the socket probes saw", columns=("measure", "value"), rows=rows),),
        notes=(
            "A token chunk is one write carrying SSE data; a chunk may hold more than one token.",
            "Queueing and prefill both happen before the first token and cannot be told apart on "
            "the socket: the server's USDT probes split them.",
        ),
    )
