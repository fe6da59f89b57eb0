"""llama.cpp engine steps (bpf/llama.bpf.c) -> the server's view: the same
ServerRequest, DecodeStep and gauges the USDT probes make, so every analyzer
reads them unchanged.

What a step says. Each llama_decode() call (llama_process() in later
builds, bpf/llama.bpf.c) is one engine step, its batch summarised as runs:
one slot's tokens each (llama-server passes the slot id as seq_id), with the
run's first position and whether the step samples a token for that slot
(logits on its last token).

Sequences. A slot's run whose first position is not past the slot's last
one (positions went back: a new prompt, its cached prefix skipped), or a
multi-token run on a slot that was already generating, begins a new
sequence on that slot: one request. Until a run of the sequence samples,
its runs are its prompt (prefill, possibly over several steps when the
prompt is longer than n_batch); the step that samples first ends prefill
and yields the first token; each later sampling step is one decode step
of the request and yields one token. The sequence ends at the end of the
last step that carried it.

Requests. The socket tracer sees a request read on an HTTP thread; the
engine decodes on the main loop thread: nothing in a step names the
connection. llama-server queues tasks first in, first out, so the requests
are tied in order: each new sequence, in the order sequences start, takes
the oldest request of that process that was read before it started, is
still open then, could reach the engine (a POST that is not one of the
server's non-generating endpoints, nor answered with an error), and whose
response ended with the sequence (tie_in_order: two requests read a moment
apart reach the queue in either order). The tie is marked
correlated_by="fifo" (phase_source() names the source of a request's
phases from it). What cannot be tied: speculative decoding (several tokens
per decode run) is read as new sequences; a sequence that began before
recording has no request.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferprobe.collector.ingest.server_view import ServerView
from inferprobe.collector.model.events import LlamaStepPhase, LlamaStepRecord
from inferprobe.collector.model.timeline import Connection, DecodeStep, ProbeSpan, Request, ServerRequest

SOURCE = "engine_uprobes"
PROBE_NAME = "llama_decode"  # the probe's name in the view, for either API (llama_decode, llama_process)
# llama-server endpoints that never reach llama_decode (tools/server/server.cpp's routes).
NON_GENERATING = ("/tokenize", "/detokenize", "/apply-template", "/slots", "/props", "/lora-adapters",
                  "/health", "/metrics", "/models", "/v1/models")


@dataclass
class Step:
    pid: int
    tid: int
    t_start_ns: int
    t_end_ns: int | None
    record: LlamaStepRecord
    synced: bool = False  # its end is a llama_synchronize's return that waited for its compute


@dataclass
class Sequence:
    """One request's life on one slot, as the engine's steps show it."""

    pid: int
    ctx: int
    seq_id: int
    t_first_ns: int  # start of the first step that carried it
    tid: int
    last_pos: int = -1
    prompt_tokens: int = 0
    t_prefill_end_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    steps: list[DecodeStep] = field(default_factory=list)  # decode steps (after prefill)
    t_last_ns: int = 0

    @property
    def generating(self) -> bool:
        return self.t_prefill_end_ns is not None


# A llama_synchronize that took less than this found no compute to wait for
# (its own two uprobes cost a few microseconds).
SYNC_WAITED_NS = 20_000


def pair_steps(records: Iterable[LlamaStepRecord]) -> list[Step]:
    """Entry and return events -> steps, by thread, in time order (a return
    lost with a full ring buffer leaves its step without an end).

    A step's compute may outlast its call on a GPU backend (the call queues
    the graph and returns): llama-server then calls llama_synchronize(ctx)
    before it samples. The first sync on the step's thread and context after
    it returned, before the next step, ends the step at the sync's return
    when the sync waited; one that did not wait (the CPU backend computes
    inside the call; an idle-time sync) leaves the step's end at its return."""
    steps: list[Step] = []
    open_: dict[int, Step] = {}
    ended: dict[int, Step] = {}  # thread -> its last step, returned, no sync seen yet
    for ev in sorted(records, key=lambda e: e.ts_ns):
        if ev.phase == LlamaStepPhase.ENTER:
            step = Step(ev.pid, ev.tid, ev.ts_ns, None, ev)
            open_[ev.tid] = step
            ended.pop(ev.tid, None)
            steps.append(step)
        elif ev.phase == LlamaStepPhase.RETURN:
            step_ = open_.pop(ev.tid, None)
            if step_ is not None:
                step_.t_end_ns = ev.ts_ns
                ended[ev.tid] = step_
        elif ev.phase == LlamaStepPhase.SYNC:
            last = ended.get(ev.tid)
            if last is not None and last.record.ctx == ev.ctx:
                del ended[ev.tid]
                if ev.ret >= SYNC_WAITED_NS:
                    last.t_end_ns = ev.ts_ns
                    last.synced = True
    return steps


def sequences(steps: list[Step]) -> tuple[list[Sequence], list[DecodeStep]]:
    """The sequences the steps carried (by start time), and the steps as DecodeSteps."""
    current: dict[tuple[int, int, int], Sequence] = {}
    done: list[Sequence] = []
    decode_steps: list[DecodeStep] = []
    for index, step in enumerate(steps):
        ev = step.record
        end = step.t_end_ns if step.t_end_ns is not None else step.t_start_ns
        ds = DecodeStep(pid=step.pid, tid=step.tid, step_id=index, t_start_ns=step.t_start_ns,
                        t_end_ns=step.t_end_ns, batch_size=len(ev.runs), tokens_in_batch=ev.n_tokens,
                        prefill_tokens=0, context_tokens=0)
        decode_steps.append(ds)
        for run in ev.runs:
            key = (step.pid, ev.ctx, run.seq_id)
            seq = current.get(key)
            restarted = seq is not None and (run.pos0 <= seq.last_pos
                                             or (seq.generating and run.n_tokens > 1))
            if seq is None or restarted:
                if seq is not None:
                    done.append(seq)
                seq = current[key] = Sequence(step.pid, ev.ctx, run.seq_id, step.t_start_ns, step.tid)
            ds.context_tokens = (ds.context_tokens or 0) + run.pos0 + run.n_tokens
            if not seq.generating:
                seq.prompt_tokens += run.n_tokens
                ds.prefill_tokens = (ds.prefill_tokens or 0) + run.n_tokens
                if run.samples:
                    seq.t_prefill_end_ns = end
                    seq.token_ns.append(end)
            else:
                seq.steps.append(ds)
                if run.samples:
                    seq.token_ns.append(end)
            seq.last_pos = run.pos0 + run.n_tokens - 1
            seq.t_last_ns = end
    done.extend(current.values())
    return sorted(done, key=lambda s: s.t_first_ns), decode_steps


def phase_source(r: Request) -> str:
    """Where a request's phases came from: "usdt", "engine_uprobes", "engine_ipc" or "sockets only"."""
    if r.server is None:
        return "sockets only"
    if r.correlated_by == "engine_ipc":
        return "engine_ipc"
    return SOURCE if r.correlated_by == "fifo" else "usdt"


def could_reach_engine(r: Request) -> bool:
    if r.method != "POST" or (r.status is not None and r.status >= 400):
        return False
    path = (r.path or "").split("?", 1)[0]
    return not path.endswith(NON_GENERATING)


def tie_in_order(seqs: list[Sequence], requests: list[Request],
                 steps: list[DecodeStep]) -> dict[int, Request]:
    """Sequence index -> the request it serves: first in, first out, per process.

    Two requests read within a moment of each other on two HTTP threads reach the
    engine's queue in either order, and pure FIFO would then tie each to the
    other's sequence and every later sequence one request off. The end of a
    response tells them apart: it comes right after its sequence's last token.
    So a sequence takes the oldest request that was read before it began and
    whose response ended by the end of the step after the sequence's last (one
    step of slack for the final write), and the oldest read before it began only
    when none did (a response still open at the recording's end, or one cut by
    its client while the engine went on)."""
    waiting: dict[int, list[Request]] = {}
    for r in sorted(requests, key=lambda r: r.t_ingress_ns):
        if r.server is None and could_reach_engine(r):
            waiting.setdefault(r.pid, []).append(r)
    step_ends: dict[int, list[int]] = {}
    for step in steps:
        if step.t_end_ns is not None:
            step_ends.setdefault(step.pid, []).append(step.t_end_ns)
    for ends in step_ends.values():
        ends.sort()
    ties: dict[int, Request] = {}
    for i, seq in enumerate(seqs):
        queue = waiting.get(seq.pid, [])
        # Only the queue's head is looked at, the requests read before the sequence
        # began (the queue is in read order): the rest of it is the future.
        n = 0
        while n < len(queue) and queue[n].t_ingress_ns <= seq.t_first_ns:
            n += 1
        head = queue[:n]
        # Requests that ended before this sequence began were never decoded (or
        # were before recording): they cannot be its request.
        read_before = [r for r in head if r.t_end_ns is None or r.t_end_ns >= seq.t_first_ns]
        if not read_before:
            del queue[:len(head)]
            continue
        ends = step_ends.get(seq.pid, [])
        # the end of the step after the sequence's last one
        after = bisect_right(ends, seq.t_last_ns)
        by = ends[after] if after < len(ends) else None
        ended_with = [r for r in read_before if r.t_end_ns is not None and r.t_end_ns >= seq.t_last_ns
                      and (by is None or r.t_end_ns <= by)]
        chosen = (ended_with or read_before)[0]
        read_before.remove(chosen)
        queue[:len(head)] = read_before
        ties[i] = chosen
    return ties


def _queue_depth(view: ServerView, starts: list[tuple[int, int]], seqs: list[Sequence],
                 steps: list[DecodeStep]) -> None:
    """(t, waiting, running) at each step's start: waiting = requests read but
    whose sequence had not begun; running = sequences begun and not ended.

    Counted by bisection over sorted times, not by a scan of every request at
    every step: a day's recording holds tens of thousands of both (20,000 took
    90 s scanned). A request is read before its sequence begins, and a sequence
    begins before it ends, so each count is a difference of two ranks."""
    read = sorted(ingress for ingress, _ in starts)
    begun_tied = sorted(first for _, first in starts)
    begun = sorted(s.t_first_ns for s in seqs)
    ended = sorted(s.t_last_ns for s in seqs)
    for step in steps:
        t = step.t_start_ns
        waiting = bisect_right(read, t) - bisect_right(begun_tied, t)
        running = bisect_right(begun, t) - bisect_left(ended, t)
        view.queue_depth.append((t, waiting, running))


def build_llama_view(records: Iterable[LlamaStepRecord], requests: list[Request],
                     connections: dict[int, Connection] | None = None) -> tuple[ServerView, int]:
    """The server's view from the engine's steps, and how many requests were tied to it.

    Sets Request.server and correlated_by="fifo" on each tied request."""
    view = ServerView()
    steps = pair_steps(records)
    if not steps:
        return view, 0
    view.probes_seen.add(PROBE_NAME)
    seqs, decode_steps = sequences(steps)
    view.steps = decode_steps
    ties = tie_in_order(seqs, requests, decode_steps)
    starts = []
    for i, seq in enumerate(seqs):
        req = ties.get(i)
        srv = ServerRequest(pid=seq.pid, req_id=i, tid=seq.tid,
                            t_start_ns=req.t_ingress_ns if req is not None else seq.t_first_ns,
                            prompt_tokens=seq.prompt_tokens, t_scheduled_ns=seq.t_first_ns,
                            t_prefill_start_ns=seq.t_first_ns, t_prefill_end_ns=seq.t_prefill_end_ns,
                            token_ns=list(seq.token_ns), t_end_ns=seq.t_last_ns,
                            output_tokens=len(seq.token_ns), status=0, steps=list(seq.steps))
        for ds in seq.steps:
            ds.requests.add(i)
        view.requests[(seq.pid, i)] = srv
        if seq.t_prefill_end_ns is not None:
            view.prefills.append(ProbeSpan(seq.pid, seq.tid, i, seq.t_first_ns, seq.t_prefill_end_ns))
        if req is not None:
            req.server, req.correlated_by = srv, "fifo"
            view.queue_waits.append(ProbeSpan(seq.pid, req.tid, i, req.t_ingress_ns, seq.t_first_ns))
            starts.append((req.t_ingress_ns, seq.t_first_ns))
    view.prefills.sort(key=lambda s: s.end_ns)
    view.queue_waits.sort(key=lambda s: s.end_ns)
    _queue_depth(view, starts, seqs, decode_steps)
    return view, len(ties)
