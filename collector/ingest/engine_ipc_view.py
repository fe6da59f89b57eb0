"""An engine's own messages between its processes (bpf/protocols/zmtp.bpf.h) -> the server's
view: the same ServerRequest, DecodeStep and gauges the USDT probes make, so
every analyzer reads them unchanged.

What crosses. vLLM V1's API server hands each request to EngineCore (ADD:
the request id and its prompt's token count), and EngineCore sends back each
engine step's outputs: per request in the step, its id, its new tokens'
count, whether it finished and, on its first output, the engine's own QUEUED
and SCHEDULED times (time.monotonic(): CLOCK_MONOTONIC, the kernel's event
clock). The kernel sees each message twice, written by one process and read
by the other, so both ends are timed: the hand-off (API write, engine read)
and each step's end (engine write, API read).

Phases of one request, in order:
  - before hand-off: HTTP ingress to the ADD write (tokenisation, the API's event loop);
  - queue: the engine's QUEUED to its SCHEDULED (where the engine sent its
    events; else the ADD read to the start of the step that first carried it);
  - prefill: SCHEDULED to the end of the step whose output carries its first token;
  - decode: each later step, one output each;
  - after each step: the API's read of the output to its socket write (detokenisation, SSE).

Steps. A step's outputs message is its end. It starts where the previous one
ended, or, after an idle engine, where its first new request was scheduled.
Its batch is the requests with an output in it; its prefill tokens the
prompt tokens of those that had their first output in it.

Requests. Nothing in an HTTP request names the engine's id, so each engine
request is tied to the API server's HTTP request whose first token write
follows its first output read soonest, among those read before the hand-off
and still open at its last output (correlated_by "engine_ipc"). Requests
that share a step share their step times, so a tie that swaps two of them
moves only their hand-off and queue times, never their prefill or decode.

Which vLLM. The kernel reads the message layout of vLLM 0.32's V1 engine
(vllm/v1/engine/__init__.py: EngineCoreRequest, EngineCoreOutput). Messages of
another layout are not guessed at: the kernel counts them (engine_ipc_unread)
and they give no phases here; analyzers/engine_phases.py then falls back to
the engine's scraped histograms.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferprobe.collector.ingest.server_view import ServerView
from inferprobe.collector.model.events import EngineIpcFlag, EngineIpcKind, EngineIpcRecord
from inferprobe.collector.model.timeline import DecodeStep, ProbeSpan, Request, ServerRequest

SOURCE = "engine_ipc"
PROBE_NAME = "engine_ipc"
KNOWN_LAYOUTS = "vLLM 0.32 (V1 engine, msgpack over ZeroMQ)"


@dataclass
class EngineOutput:
    """One request's entry in one step's outputs, from either end."""

    tokens: int
    finished: bool
    engine_write_ns: int | None = None  # EngineCore sent the step's outputs (the step's end)
    api_read_ns: int | None = None  # the API server had them


@dataclass
class EngineRequest:
    request_id: str
    prompt_tokens: int | None = None
    api_pid: int | None = None
    api_tid: int | None = None
    engine_pid: int | None = None
    handoff_ns: int | None = None  # the API server's ADD write began
    engine_read_ns: int | None = None  # EngineCore's read of it returned
    queued_ns: int | None = None  # the engine's own QUEUED
    scheduled_ns: int | None = None  # ... and SCHEDULED
    outputs: list[EngineOutput] = field(default_factory=list)
    steps: list[DecodeStep] = field(default_factory=list)

    def output_ns(self, out: EngineOutput) -> int:
        return out.engine_write_ns if out.engine_write_ns is not None else out.api_read_ns  # type: ignore

    @property
    def first_read_ns(self) -> int | None:
        return self.outputs[0].api_read_ns if self.outputs else None

    @property
    def last_read_ns(self) -> int | None:
        return self.outputs[-1].api_read_ns if self.outputs else None


def _engine_ns(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1e9)


class EngineIpcGather:
    """Engine requests by id from engine_ipc events fed in time order: for a whole
    recording (gather()) or a live stream (LiveEngineIpc), which forgets what it tied."""

    def __init__(self, keep_steps: bool = True) -> None:
        self.keep_steps = keep_steps  # live: no step timeline, so nothing to keep
        self.found: dict[str, EngineRequest] = {}
        self._written: dict[str, list[EngineIpcRecord]] = defaultdict(list)
        self._read: dict[str, list[EngineIpcRecord]] = defaultdict(list)
        self._last_ns: dict[str, int] = {}  # id -> its last event, for forgetting
        self._finished: dict[str, None] = {}  # ids whose last output so far said so, in order
        self.step_writes: list[EngineIpcRecord] = []
        self.step_reads: list[EngineIpcRecord] = []

    def feed(self, ev: EngineIpcRecord) -> None:
        if ev.kind == EngineIpcKind.STEP:
            if self.keep_steps:
                (self.step_reads if ev.is_read else self.step_writes).append(ev)
            return
        if ev.request_id is None or EngineIpcFlag.ID_CUT in ev.flags:
            return  # an id cut short could be another request's
        req = self.found.setdefault(ev.request_id, EngineRequest(ev.request_id))
        self._last_ns[ev.request_id] = ev.ts_ns
        if ev.kind == EngineIpcKind.ADD:
            req.prompt_tokens = ev.count
            if ev.is_read:
                req.engine_read_ns, req.engine_pid = ev.ts_ns, ev.pid
            else:
                req.handoff_ns, req.api_pid, req.api_tid = ev.ts_ns, ev.pid, ev.tid
            return
        (self._read if ev.is_read else self._written)[ev.request_id].append(ev)
        if EngineIpcFlag.FINISHED in ev.flags:
            self._finished[ev.request_id] = None
        if ev.queued_s is not None and req.queued_ns is None:
            req.queued_ns = _engine_ns(ev.queued_s)
        if ev.scheduled_s is not None and req.scheduled_ns is None:
            req.scheduled_ns = _engine_ns(ev.scheduled_s)

    def pair(self, req: EngineRequest) -> EngineRequest:
        """Its outputs, each one's two ends (EngineCore's write, the API's read) in order."""
        ws, rs = self._written.get(req.request_id, []), self._read.get(req.request_id, [])
        req.outputs = []
        for i in range(max(len(ws), len(rs))):
            w = ws[i] if i < len(ws) else None
            r = rs[i] if i < len(rs) else None
            one = w or r
            assert one is not None
            req.outputs.append(EngineOutput(tokens=one.count, finished=EngineIpcFlag.FINISHED in one.flags,
                                            engine_write_ns=w.ts_ns if w else None,
                                            api_read_ns=r.ts_ns if r else None))
            if w is not None:
                req.engine_pid = w.pid
            if r is not None and req.api_pid is None:
                req.api_pid, req.api_tid = r.pid, r.tid
        return req

    def finished(self) -> list[EngineRequest]:
        """The requests that sent their last output, paired: kept apart as their last
        output comes, so a live view looks at those only, not at every open request."""
        return [self.pair(self.found[rid]) for rid in self._finished]

    def forget(self, request_id: str) -> None:
        for table in (self.found, self._written, self._read, self._last_ns, self._finished):
            table.pop(request_id, None)

    def forget_before(self, cut_ns: int) -> None:
        """Requests with no event since cut_ns: a live view's bound."""
        for rid in [rid for rid, t in self._last_ns.items() if t < cut_ns]:
            self.forget(rid)


def gather(records: Iterable[EngineIpcRecord]) -> tuple[dict[str, EngineRequest], list[EngineIpcRecord]]:
    """Engine requests by id, and the steps' end records (each step once: its write, else its read)."""
    g = EngineIpcGather()
    for ev in sorted(records, key=lambda e: e.ts_ns):
        g.feed(ev)
    for req in g.found.values():
        g.pair(req)
    return g.found, (g.step_writes or g.step_reads)


def build_steps(requests: dict[str, EngineRequest], step_ends: list[EngineIpcRecord]) -> list[DecodeStep]:
    """One DecodeStep per outputs message, with the requests that had an output in it."""
    by_end: dict[int, list[tuple[EngineRequest, int]]] = defaultdict(list)
    for req in requests.values():
        for i, out in enumerate(req.outputs):
            by_end[req.output_ns(out)].append((req, i))
    steps: list[DecodeStep] = []
    previous_end: dict[int, int] = {}
    for n, ev in enumerate(step_ends):
        members = by_end.get(ev.ts_ns, [])
        new = [req for req, i in members if i == 0]
        starts = [req.scheduled_ns for req in new if req.scheduled_ns is not None]
        prev = previous_end.get(ev.conn_id)
        if starts:
            start = min(starts)
        elif new:  # no engine events: the latest hand-off read it waited for
            reads = [r.engine_read_ns for r in new if r.engine_read_ns is not None]
            start = max([prev or 0, *reads]) or ev.ts_ns
        else:
            start = prev if prev is not None else ev.ts_ns
        start = min(max(start, prev or start), ev.ts_ns)
        step = DecodeStep(pid=ev.pid, tid=ev.tid, step_id=n, t_start_ns=start, t_end_ns=ev.ts_ns,
                          batch_size=len(members) or ev.count,
                          tokens_in_batch=sum(req.outputs[i].tokens for req, i in members),
                          prefill_tokens=sum(req.prompt_tokens or 0 for req in new))
        for req, _ in members:
            req.steps.append(step)
        steps.append(step)
        previous_end[ev.conn_id] = ev.ts_ns
    return steps


def _open_at(r: Request, t_ns: int | None) -> bool:
    return t_ns is None or r.t_end_ns is None or r.t_end_ns >= t_ns


def _first_write(r: Request) -> int | None:
    return r.token_ns[0] if r.token_ns else r.t_response_start_ns


def tie_requests(engine: list[EngineRequest], requests: list[Request]) -> dict[str, Request]:
    """Each engine request's HTTP request on the API server (module docstring): the
    earliest first write at or after its first output read, then the earliest read.

    Each process's candidates are sorted by (first write, ingress) once, and each
    engine request looks from its first output read on, by bisection: a day's
    recording holds tens of thousands of both, and a scan of every candidate for each
    was quadratic (see llama_view._queue_depth)."""
    candidates: dict[int, list[tuple[int, int, int, Request]]] = defaultdict(list)
    for i, r in enumerate(requests):
        first = _first_write(r)
        if r.role == "server" and r.method == "POST" and not r.is_error and first is not None:
            candidates[r.pid].append((first, r.t_ingress_ns, i, r))
    for by_first in candidates.values():
        by_first.sort(key=lambda c: c[:3])
    ties: dict[str, Request] = {}
    taken: set[int] = set()
    for req in sorted((e for e in engine if e.first_read_ns is not None), key=lambda e: e.first_read_ns or 0):
        handoff = req.handoff_ns if req.handoff_ns is not None else req.engine_read_ns
        by_first = candidates.get(req.api_pid or -1, [])
        # By index from the bisection: a slice would copy the rest of the list for each
        # engine request, which made the tie quadratic again (40,000 in 2.4 s).
        for at in range(bisect_left(by_first, (req.first_read_ns or 0,)), len(by_first)):
            _, ingress, i, r = by_first[at]
            if i in taken or (handoff is not None and ingress > handoff) or not _open_at(r, req.last_read_ns):
                continue
            taken.add(i)
            ties[req.request_id] = r
            break
    return ties


def server_request(n: int, req: EngineRequest, http: Request | None) -> ServerRequest:
    """The server's view of one engine request (it has outputs), as req_id n; tied to http
    (Request.server, correlated_by "engine_ipc") where that is given."""
    pid = req.api_pid if req.api_pid is not None else (req.engine_pid or 0)
    first_step = req.steps[0] if req.steps else None
    scheduled = req.scheduled_ns if req.scheduled_ns is not None else (
        first_step.t_start_ns if first_step else None)
    queued = req.queued_ns if req.queued_ns is not None else req.engine_read_ns
    token_ns = [req.output_ns(out) for out in req.outputs for _ in range(max(out.tokens, 1))]
    finished = req.outputs[-1].finished
    srv = ServerRequest(
        pid=pid, req_id=n, tid=req.api_tid,
        t_start_ns=http.t_ingress_ns if http is not None else req.handoff_ns,
        prompt_tokens=req.prompt_tokens, t_queued_ns=queued, t_scheduled_ns=scheduled,
        t_prefill_start_ns=scheduled, t_prefill_end_ns=req.output_ns(req.outputs[0]),
        token_ns=token_ns, t_end_ns=req.output_ns(req.outputs[-1]) if finished else None,
        output_tokens=sum(out.tokens for out in req.outputs) if finished else None,
        status=0 if finished else None, steps=list(req.steps[1:]),
        engine_request_id=req.request_id, t_handoff_ns=req.handoff_ns)
    if http is not None:
        http.server, http.correlated_by = srv, SOURCE
    return srv


class LiveEngineIpc:
    """The same ties on a live stream (collector/ingest/pipeline.LiveIngest): each engine
    request that finished is tied when the requests that ended are handed out, then
    forgotten; what is never tied goes after memory_ns. No step timeline live: each
    request's hand-off, queue, prefill and tokens (what its span and phases need)."""

    def __init__(self, memory_ns: int) -> None:
        self.gather = EngineIpcGather(keep_steps=False)
        self.memory_ns = memory_ns
        self.tied = 0  # a counter for the req_ids handed out

    def feed(self, ev: EngineIpcRecord) -> None:
        self.gather.feed(ev)

    def tie(self, ended: list[Request], now_ns: int) -> int:
        """Ties the ended requests nothing else claimed; returns how many."""
        untied = [r for r in ended if r.server is None]
        finished = self.gather.finished() if untied else []
        ties = tie_requests(finished, untied) if finished else {}
        by_id = {req.request_id: req for req in finished}
        for rid, http in ties.items():
            server_request(self.tied, by_id[rid], http)
            self.tied += 1
            self.gather.forget(rid)
        self.gather.forget_before(now_ns - self.memory_ns)
        return len(ties)


def _queue_depth(view: ServerView, reqs: list[ServerRequest], steps: list[DecodeStep]) -> None:
    """(t, waiting, running) at each step's start, by bisection (see llama_view._queue_depth)."""
    queued = sorted(r.t_queued_ns for r in reqs if r.t_queued_ns is not None and r.t_scheduled_ns is not None)
    scheduled = sorted(r.t_scheduled_ns for r in reqs
                       if r.t_queued_ns is not None and r.t_scheduled_ns is not None)
    begun = sorted(r.t_scheduled_ns for r in reqs if r.t_scheduled_ns is not None and r.t_end_ns is not None)
    ended = sorted(r.t_end_ns for r in reqs if r.t_scheduled_ns is not None and r.t_end_ns is not None)
    for step in steps:
        t = step.t_start_ns
        waiting = bisect_right(queued, t) - bisect_right(scheduled, t)
        running = bisect_right(begun, t) - bisect_left(ended, t)
        view.queue_depth.append((t, waiting, running))


def build_engine_ipc_view(records: Iterable[EngineIpcRecord],
                          requests: list[Request]) -> tuple[ServerView, int]:
    """The server's view from an engine's messages, and how many HTTP requests were tied to it.

    Sets Request.server and correlated_by="engine_ipc" on each tied request."""
    view = ServerView()
    engine, step_ends = gather(records)
    if not engine and not step_ends:
        return view, 0
    view.probes_seen.add(PROBE_NAME)
    view.steps = build_steps(engine, step_ends)
    ordered = sorted(engine.values(), key=lambda e: e.handoff_ns or e.engine_read_ns or 0)
    ties = tie_requests(ordered, requests)
    built = []
    for n, req in enumerate(ordered):
        if not req.outputs:
            continue  # handed over, no output yet (the recording ended) or aborted before any
        http = ties.get(req.request_id)
        srv = server_request(n, req, http)
        for step in req.steps:
            step.requests.add(n)
        view.requests[(srv.pid, n)] = srv
        built.append(srv)
        queued, scheduled = srv.t_queued_ns, srv.t_scheduled_ns
        if queued is not None and scheduled is not None:
            view.queue_waits.append(ProbeSpan(srv.pid, req.api_tid or 0, n, queued, max(queued, scheduled)))
        if scheduled is not None and srv.t_prefill_end_ns is not None:
            view.prefills.append(ProbeSpan(srv.pid, req.api_tid or 0, n, scheduled,
                                           srv.t_prefill_end_ns))
    view.prefills.sort(key=lambda s: s.end_ns)
    view.queue_waits.sort(key=lambda s: s.end_ns)
    _queue_depth(view, built, view.steps)
    return view, sum(1 for rid in ties if engine[rid].outputs)
