"""Per-phase flame graphs: each streamed stack sample tagged with the phase
its thread was in, from the request timelines of the same recording.

Phases, in the order that wins when several apply to one instant:
    network-write  the thread was inside a write-family syscall on a traced connection
    ingress        the thread was inside the read that returned a request line
    prefill        USDT prefill_start..prefill_end on that thread; without USDT
                   probes: any request of the process between its arrival and its
                   first token (so this includes queueing)
    decode         USDT decode_step_start..decode_step_end on that thread; without
                   USDT: any request of the process between first token and end
    queued         USDT request_queued..request_scheduled (process-wide)
    idle           none of the above

Without the server's USDT probes, prefill and decode are request-level and
process-wide: with concurrent requests the same instant can be prefill for
one and decode for another, and prefill wins. Samples carry times only
when recorded with `record --phases`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from inferprobe.analyzers import stack_fold as fold
from inferprobe.analyzers.stack_fold import Stacks
from inferprobe.collector.errors import RecordingProblem
from inferprobe.collector.ingest.pipeline import Ingested, ingest
from inferprobe.collector.model.events import EventType, HttpKind, IoRecord, StackSampleRecord, UsdtProbe
from inferprobe.collector.model.recording import Recording

ORDER = ("network-write", "ingress", "prefill", "decode", "queued")
SAMPLE_TYPES = {"cpu": EventType.CPU_SAMPLE, "offcpu": EventType.OFFCPU_SAMPLE}
NOT_IN_TABLE = "[lost: stack not in the kernel's counts table]"


class _Intervals:
    """Merged [start, end) intervals per key (a tid or a pid), for point lookups."""

    def __init__(self) -> None:
        self._raw: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self._starts: dict[int, list[int]] = {}
        self._ends: dict[int, list[int]] = {}

    def add(self, key: int, start: int, end: int) -> None:
        if end > start:
            self._raw[key].append((start, end))

    def freeze(self) -> None:
        for key, spans in self._raw.items():
            spans.sort()
            merged: list[list[int]] = []
            for s, e in spans:
                if merged and s <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], e)
                else:
                    merged.append([s, e])
            self._starts[key] = [m[0] for m in merged]
            self._ends[key] = [m[1] for m in merged]

    def contains(self, key: int, t: int) -> bool:
        starts = self._starts.get(key)
        if not starts:
            return False
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t < self._ends[key][i]


class PhaseTagger:
    def __init__(self, ingested: Ingested) -> None:
        self.by_tid = {name: _Intervals() for name in ORDER}
        self.by_pid = {name: _Intervals() for name in ORDER}
        for ev in ingested.events:
            if isinstance(ev, IoRecord):
                if not ev.is_read:
                    self.by_tid["network-write"].add(ev.tid, ev.ts_ns, ev.exit_ns)
                elif ev.kind == HttpKind.REQUEST:
                    self.by_tid["ingress"].add(ev.tid, ev.ts_ns, ev.exit_ns)
        server = ingested.server
        self.uses_usdt = bool({UsdtProbe.PREFILL_START.name.lower(), UsdtProbe.DECODE_STEP_START.name.lower()}
                              & server.probes_seen)
        if self.uses_usdt:
            for span in server.prefills:
                self.by_tid["prefill"].add(span.tid, span.start_ns, span.end_ns)
            for step in server.steps:
                if step.t_end_ns is not None:
                    self.by_tid["decode"].add(step.tid, step.t_start_ns, step.t_end_ns)
            for span in server.queue_waits:
                self.by_pid["queued"].add(span.pid, span.start_ns, span.end_ns)
        else:
            for r in ingested.requests:
                first = r.t_first_token_ns
                end = r.t_end_ns
                self.by_pid["prefill"].add(r.pid, r.t_ingress_ns, first if first is not None else (end or 0))
                if first is not None and end is not None:
                    self.by_pid["decode"].add(r.pid, first, end)
        for table in (*self.by_tid.values(), *self.by_pid.values()):
            table.freeze()

    def phase_of(self, pid: int, tid: int, t: int) -> str:
        for name in ORDER:
            if self.by_tid[name].contains(tid, t) or self.by_pid[name].contains(pid, t):
                return name
        return "idle"


def tagged_samples(recording: Recording, kind: str) -> tuple[list[StackSampleRecord], PhaseTagger]:
    ingested = ingest(recording.events)
    samples = [e for e in ingested.events
               if isinstance(e, StackSampleRecord) and e.type == SAMPLE_TYPES[kind]]
    return samples, PhaseTagger(ingested)


def stacks_for_phase(recording: Recording, snap: dict, kind: str, phase: str, group: str) -> Stacks:
    if not snap.get("streamed"):
        raise RecordingProblem(
            f"{recording.path} has no timed stack samples, so they cannot be split by phase: "
            "record with `inferprobe record --phases ...`"
        )
    samples, tagger = tagged_samples(recording, kind)
    table = fold.frames_by_ids(snap)
    out: Stacks = {}
    for s in samples:
        if tagger.phase_of(s.pid, s.tid, s.ts_ns) != phase:
            continue
        entry = table.get((s.pid, s.user_stack_id, s.kernel_stack_id, s.flags, s.python_stack_id))
        frames = entry["frames"] if entry else [NOT_IN_TABLE]
        thread = entry["thread"] if entry and entry["tid"] == s.tid else f"thread {s.tid}"
        roots = fold.root_frames({"pid": s.pid, "tid": s.tid, "thread": thread}, snap, group)
        key = roots + tuple(fold.clean_frame(f) for f in frames)
        out[key] = out.get(key, 0) + int(s.weight)
    return out


def phase_totals(recording: Recording, kind: str) -> dict[str, int]:
    """Weight per phase (samples or µs), for the report."""
    samples, tagger = tagged_samples(recording, kind)
    totals: dict[str, int] = defaultdict(int)
    for s in samples:
        totals[tagger.phase_of(s.pid, s.tid, s.ts_ns)] += int(s.weight)
    return dict(totals)
