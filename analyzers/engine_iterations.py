"""An engine's iterations and its workload, read from a recording: what the
batching model (analyzers/step_model.py) is fitted on and what the what-if
replay (analyzers/batching_replay.py) plays again.

An iteration is one turn of the engine's scheduling loop: the work it did
for the requests it held, from one turn's start to the next one's. Its cost
is what a request already running waits between two of its tokens, so that
is the time fitted (not the forward pass alone: sampling, detokenising and
the hand-off to the HTTP side are in it too). Two shapes of engine are read:

- "mixed steps" (llama.cpp's server; vLLM V1 is the same shape): one step
  carries a token for each generating sequence and prompt tokens of the
  sequences still in prefill; a sequence's first token is sampled at the end
  of the step that finished its prompt, its next ones one a step.
- "prefill, then decode" (the demo server and engines with inferprobe's USDT
  probes): a turn prefills the requests it admitted one after another (each
  prefill samples that request's first token), then runs one decode step
  over every running request, the new ones included.

The workload is what the clients asked for: each request's arrival, prompt
and output token counts (the engine's own: the tokens it prefilled and
sampled), and, for a request that followed another of the same client, the
client's pause between that response's end and its next request. A request
follows the one before it on the same keep-alive connection, or, on a new
connection, a response that ended at most RECONNECT_NS before it (from the
same peer address where the tracer saw one) and that nothing followed yet.
A closed-loop client is replayed as one: its next request is sent that
pause after the replayed response ends, so a slower setting also slows the
arrivals, as it would.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from inferprobe.analyzers.cadence import percentile
from inferprobe.collector.ingest.llama_view import PROBE_NAME as LLAMA_PROBE
from inferprobe.collector.ingest.server_view import ServerView
from inferprobe.collector.model.timeline import DecodeStep, Request

MIXED = "mixed steps"
PREFILL_THEN_DECODE = "prefill, then decode"


@dataclass(frozen=True)
class Engine:
    """Which engine, how its loop is shaped, and the flag that caps its batch."""

    name: str
    shape: str  # MIXED or PREFILL_THEN_DECODE
    knob: str  # the flag, as the engine spells it
    knob_meaning: str  # what the number means

    def flag(self, value: int) -> str:
        return f"{self.knob} {value}"


LLAMA_CPP = Engine("llama.cpp server", MIXED, "-np", "slots: requests decoded at once")
USDT_ENGINE = Engine("server with inferprobe's USDT probes", PREFILL_THEN_DECODE, "--max-batch-size",
                     "requests in one decode batch (the demo server's flag; another server's own cap)")


@dataclass(frozen=True)
class Iteration:
    pid: int
    t_start_ns: int
    cycle_ns: int | None  # to the next iteration's start, when the engine went straight on
    decode_seqs: int  # sequences that got a decode token
    prefill_tokens: int  # prompt tokens processed
    prefill_seqs: int  # sequences whose prompt was (partly) processed
    context_tokens: int  # cached positions the step's attention covered
    prefill_ns: int | None = None  # prefill-then-decode: the prefills' own time, as measured
    compute_end_ns: int | None = None  # where the step's compute (its last forward pass) returned


@dataclass(frozen=True)
class WorkItem:
    """One request as the replay sends it."""

    key: int  # index in arrival order
    after: int | None  # the key of the request its client waited for (None: sent at its recorded time)
    arrival_ns: int  # its ingress, as recorded
    think_ns: int  # from that request's response end to this one's ingress
    prompt_tokens: int
    output_tokens: int
    # Where its client's previous request got its last token from a step: when this one was
    # ready for the engine, from the start of the step after that one (negative: before it
    # started, so it could join it). See _ready_after_next_step.
    ready_after_step_ns: int | None = None


# A request on a new connection that arrived this soon after another response ended (from
# the same peer address, where known) is read as that client's next one: a closed-loop
# client whose server closes the connection after each response (llama-server does after
# a stream) reconnects and sends again within a millisecond or two.
RECONNECT_NS = 20_000_000


@dataclass(frozen=True)
class EngineTrace:
    engine: Engine
    iterations: list[Iteration]
    work: list[WorkItem]
    # Constant parts of a request's latency that the batch setting does not move,
    # medians over the recording: ingress -> the engine could take it; the engine's
    # token -> its write on the socket; the last token's write -> the response's end.
    before_engine_ns: int
    engine_to_wire_ns: int
    tail_ns: int
    current: int  # the batch cap the recording ran at: the most requests the engine held at once
    current_binding: bool  # requests waited while that many ran: the cap, not the load, set it
    untied: int  # served requests the engine's view could not be tied to (left out of the replay)
    # The engine's work between steps (handing out the tokens; where a request ended,
    # answering it and freeing its place), as measured after each step: after those that
    # ended a request and after the others. A request that arrives meanwhile joins the next
    # step: see _between_steps.
    between_steps_ns: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())


def engine_of(view: ServerView) -> Engine | None:
    if view.empty or not view.steps:
        return None
    return LLAMA_CPP if LLAMA_PROBE in view.probes_seen else USDT_ENGINE


def _continuing(starts: list[int], spans: list[tuple[int, int]]) -> list[bool]:
    """For each iteration start but the last: did some request stay in the engine from it
    to the next start (the engine went straight on rather than idling)?"""
    ordered = sorted(spans)
    span_starts = [s for s, _ in ordered]
    latest_end: list[int] = []  # the latest end among the spans that began so far
    for _, e in ordered:
        latest_end.append(max(e, latest_end[-1]) if latest_end else e)
    out = []
    for a, b in zip(starts, starts[1:], strict=False):
        i = bisect.bisect_right(span_starts, a)
        out.append(i > 0 and latest_end[i - 1] >= b)
    return out


def _iterations_mixed(steps: Sequence[DecodeStep], spans: list[tuple[int, int]]) -> list[Iteration]:
    ordered = sorted(steps, key=lambda s: s.t_start_ns)
    starts = [s.t_start_ns for s in ordered]
    go_on = _continuing(starts, spans)
    out = []
    for i, step in enumerate(ordered):
        prefill = step.prefill_tokens or 0
        decode = max(0, step.tokens_in_batch - prefill)
        cycle = starts[i + 1] - step.t_start_ns if i < len(go_on) and go_on[i] else None
        out.append(Iteration(step.pid, step.t_start_ns, cycle, decode_seqs=decode, prefill_tokens=prefill,
                             prefill_seqs=step.batch_size - decode, context_tokens=step.context_tokens or 0,
                             compute_end_ns=step.t_end_ns))
    return out


def _iterations_prefill_then_decode(view: ServerView, spans: list[tuple[int, int]]) -> list[Iteration]:
    steps = sorted(view.steps, key=lambda s: s.t_start_ns)
    prefills = sorted(view.prefills, key=lambda p: p.start_ns)
    prompt = {key: r.prompt_tokens or 0 for key, r in view.requests.items()}
    out = []
    j = 0
    previous_end = 0
    groups = []
    for step in steps:
        # the prefills of this turn: after the previous decode step, before this one
        mine = []
        while j < len(prefills) and prefills[j].start_ns < step.t_start_ns:
            if prefills[j].start_ns >= previous_end:
                mine.append(prefills[j])
            j += 1
        groups.append((step, mine))
        previous_end = step.t_end_ns or step.t_start_ns
    starts = [min([step.t_start_ns, *(p.start_ns for p in mine)]) for step, mine in groups]
    go_on = _continuing(starts, spans)
    for i, (step, mine) in enumerate(groups):
        cycle = starts[i + 1] - starts[i] if i < len(go_on) and go_on[i] else None
        out.append(Iteration(step.pid, starts[i], cycle, decode_seqs=step.batch_size,
                             prefill_tokens=sum(prompt.get((p.pid, p.req_id), 0) for p in mine),
                             prefill_seqs=len(mine), context_tokens=step.tokens_in_batch,
                             prefill_ns=sum(p.end_ns - p.start_ns for p in mine),
                             compute_end_ns=step.t_end_ns))
    return out


def _between_steps(iterations: Sequence[Iteration], spans: list[tuple[int, int]]) -> tuple[tuple[int, ...],
                                                                                         tuple[int, ...]]:
    """From each step's compute end to the next step's start: after the steps in which a
    request ended, and after the others.

    Each step's tokens leave the engine when its compute returns; the next step starts only
    after the engine has handed them out, and, where a request ended, answered it and freed
    its place. A closed-loop client's next request often arrives in that gap, and is then in
    the very next step (llama-server at one thread on this repository's VM: 2.2 ms after a
    step that ended a request, 1.0 after others, medians; the client's next request read
    0.7 ms after the step's end; at a setting where a place was always free, ingress to the
    first step took 1.5 ms at the median, not the half step, ~25 ms, a request arriving at a
    random moment waits)."""
    ends = sorted(e for _, e in spans)
    after_end: list[int] = []
    others: list[int] = []
    for it in iterations:
        if it.cycle_ns is None or it.compute_end_ns is None:
            continue
        gap = it.t_start_ns + it.cycle_ns - it.compute_end_ns
        if gap < 0:
            continue
        i = bisect.bisect_left(ends, it.t_start_ns)
        (after_end if i < len(ends) and ends[i] < it.t_start_ns + it.cycle_ns else others).append(gap)
    return tuple(after_end), tuple(others)


def _median(values: list[int]) -> int:
    return int(percentile(values, 50) or 0)


def peak_overlap(spans: list[tuple[int, int]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = now = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


def _address(r: Request) -> str | None:
    return r.peer.rsplit(":", 1)[0] if r.peer else None


def _same_client_address(a: Request, b: Request) -> bool:
    """Where either address is unknown (a server that accepts without asking), any may match."""
    return _address(a) is None or _address(b) is None or _address(a) == _address(b)


def _client_chains(served: Sequence[Request]) -> dict[int, tuple[int, int]]:
    """key -> (the key of the request its client sent before, the pause after that one ended)."""
    chains: dict[int, tuple[int, int]] = {}
    last_on_conn: dict[int, int] = {}
    open_ends: list[tuple[int, int]] = []  # (end, key) of responses nothing followed yet
    for key, r in enumerate(served):
        prev = last_on_conn.get(r.conn)
        if prev is None:
            near = [(end, k) for end, k in open_ends if 0 <= r.t_ingress_ns - end <= RECONNECT_NS
                    and _same_client_address(served[k], r)]
            if near:
                prev = max(near)[1]
        if prev is not None:
            end = served[prev].t_end_ns
            if end is not None and end <= r.t_ingress_ns:
                chains[key] = (prev, r.t_ingress_ns - end)
                open_ends = [(e, k) for e, k in open_ends if k != prev]
        last_on_conn[r.conn] = key
        if r.t_end_ns is not None:
            open_ends.append((r.t_end_ns, key))
        # responses that ended long before this arrival can no longer be followed
        open_ends = [(e, k) for e, k in open_ends if e > r.t_ingress_ns - RECONNECT_NS]
    return chains


def _ready_after_next_step(served: Sequence[Request], chains: dict[int, tuple[int, int]],
                           step_starts: Sequence[int], before_ns: int) -> dict[int, int]:
    """key -> when that request was ready for the engine, from the start of the first step
    after its client's previous request got its last token (negative: ready before it).

    A closed-loop client's next request races the engine's next step: it joins that step if
    it is ready before the step starts, and else waits a whole step. Both sides of the race
    take about a millisecond (the client reads the response and sends again; the engine
    hands the tokens out and starts over), and they are not independent: on the demo server
    the HTTP side's handling of the new request holds the interpreter that the engine's loop
    needs. So the race is carried over per request as it was run, not drawn from its two
    sides apart. The demo server with 8 clients, recorded at 4 places: 52 of 104 next
    requests were ready before the next step started. Replayed at 8 places, the median
    request waited 89 ms for its first step with the two sides drawn apart, 38 ms with the
    race carried over, and 0 ms as measured at 8 (2026-12-06)."""
    out: dict[int, int] = {}
    for key, (prev, _) in chains.items():
        answered, sent = served[prev].server, served[key].server
        if answered is None or not answered.token_ns or sent is None:
            continue
        i = bisect.bisect_right(step_starts, answered.token_ns[-1])
        if i == len(step_starts):
            continue
        ready = sent.t_queued_ns if sent.t_queued_ns is not None else served[key].t_ingress_ns + before_ns
        out[key] = ready - step_starts[i]
    return out


def read_trace(view: ServerView, requests: Sequence[Request]) -> EngineTrace | None:
    """The engine's iterations and the workload; None without an engine step timeline."""
    engine = engine_of(view)
    if engine is None:
        return None
    served = sorted((r for r in requests if r.role == "server" and r.server is not None
                     and r.server.t_scheduled_ns is not None and r.server.t_end_ns is not None),
                    key=lambda r: r.t_ingress_ns)
    # every request the engine held, tied to an HTTP request or not: each kept it busy
    spans = [(s.t_scheduled_ns, s.t_end_ns) for s in view.requests.values()
             if s.t_scheduled_ns is not None and s.t_end_ns is not None]
    if engine.shape == MIXED:
        iterations = _iterations_mixed(view.steps, spans)
    else:
        iterations = _iterations_prefill_then_decode(view, spans)
    before, to_wire, tail = [], [], []
    for r in served:
        srv = r.server
        assert srv is not None and srv.t_scheduled_ns is not None
        ready = srv.t_queued_ns if srv.t_queued_ns is not None else srv.t_scheduled_ns
        before.append(max(0, ready - r.t_ingress_ns))
        if r.token_ns and srv.token_ns:
            to_wire.append(max(0, r.token_ns[0] - srv.token_ns[0]))
            if r.t_end_ns is not None:
                tail.append(max(0, r.t_end_ns - r.token_ns[-1]))
    # Engines that say when a request was queued give the time before it directly; where
    # only its first step is seen (llama.cpp), the quickest start stands for it: a request
    # that found a slot free waited for nothing else.
    before_ns = _median(before) if any(r.server and r.server.t_queued_ns for r in served) else min(before,
                                                                                                 default=0)
    chains = _client_chains(served)
    after_step = _ready_after_next_step(served, chains, sorted(it.t_start_ns for it in iterations), before_ns)
    work = []
    for key, r in enumerate(served):
        srv = r.server
        assert srv is not None
        after, think = chains.get(key, (None, 0))
        out_tokens = srv.output_tokens if srv.output_tokens is not None else len(srv.token_ns)
        work.append(WorkItem(key, after, r.t_ingress_ns, think, srv.prompt_tokens or 0, max(1, out_tokens),
                             after_step.get(key)))
    # The engine's own count of what it ran at once where it gives one (the queue_depth
    # gauge: running after admission); else the most requests between their first step
    # and their end at once.
    current = max((running for _, _, running in view.queue_depth), default=0) or peak_overlap(spans)
    binding = any(waiting > 0 and running >= current for _, waiting, running in view.queue_depth)
    untied = sum(1 for r in requests if r.role == "server" and r.server is None and r.method == "POST")
    return EngineTrace(engine, iterations, work, before_ns, _median(to_wire), _median(tail), current,
                       binding, untied, _between_steps(iterations, spans))
