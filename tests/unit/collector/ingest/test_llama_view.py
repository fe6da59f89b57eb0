"""llama_decode steps -> sequences, phases, FIFO ties and gauges (collector/ingest/llama_view.py)."""

from __future__ import annotations

import time

from inferprobe.collector.ingest.llama_view import build_llama_view, pair_steps, phase_source
from inferprobe.collector.model.events import EventType, LlamaRunRecord, LlamaStepPhase, LlamaStepRecord
from inferprobe.collector.model.timeline import Outcome, Request

MS = 1_000_000


class Engine:
    """Steps of one llama-server main thread, each 10 ms long, 1 ms apart."""

    def __init__(self) -> None:
        self.t = 100 * MS
        self.events: list[LlamaStepRecord] = []

    def step(self, *runs: tuple[int, int, int, bool]) -> tuple[int, int]:
        start, end = self.t, self.t + 10 * MS
        recs = tuple(LlamaRunRecord(*r) for r in runs)
        n = sum(r.n_tokens for r in recs)
        self.events.append(LlamaStepRecord(EventType.LLAMA_STEP, 7, 8, start, LlamaStepPhase.ENTER, n, recs,
                                           False, 0, 0xC0))
        self.events.append(LlamaStepRecord(EventType.LLAMA_STEP, 7, 8, end, LlamaStepPhase.RETURN, 0, (),
                                           False, 0, 0))
        self.t = end + MS
        return start, end


def _request(conn: int, ingress_ms: int, end_ms: int | None = None, method: str = "POST",
             path: str = "/completion") -> Request:
    return Request(pid=7, tid=20 + conn, conn=conn, method=method, path=path, t_ingress_ns=ingress_ms * MS,
                   status=200, outcome=Outcome.COMPLETE, t_end_ns=None if end_ms is None else end_ms * MS)


def test_one_slot_two_requests_fifo_with_the_second_queued():
    e = Engine()
    a0, a_pre = e.step((0, 0, 30, True))          # request A's prompt: 30 tokens, samples its first token
    a1 = e.step((0, 30, 1, True))                  # A decodes
    a2 = e.step((0, 31, 1, True))
    b0, b_pre = e.step((0, 0, 12, False))          # positions back to 0: B begins (a chunk, no sample yet)
    b1, b_pre_end = e.step((0, 12, 5, True))       # B's prompt continues and ends: first token
    b2 = e.step((0, 17, 1, True))
    health = _request(1, 50, 60, method="GET", path="/health")
    ra, rb = _request(2, 90, 200), _request(3, 95, 400)
    tokenize = _request(4, 96, 97, path="/tokenize")
    view, tied = build_llama_view(e.events, [health, ra, rb, tokenize])
    assert tied == 2 and view.probes_seen == {"llama_decode"}
    sa, sb = ra.server, rb.server
    assert sa is not None and sb is not None and ra.correlated_by == rb.correlated_by == "fifo"
    assert phase_source(ra) == "engine_uprobes" and phase_source(health) == "sockets only"
    assert (sa.t_start_ns, sa.t_scheduled_ns, sa.t_prefill_end_ns) == (90 * MS, a0, a_pre)
    assert sa.token_ns == [a_pre, a1[1], a2[1]] and sa.prompt_tokens == 30 and sa.t_end_ns == a2[1]
    # B waited from its read until its first step, after A's last one
    assert sb.t_scheduled_ns == b0 > sa.t_end_ns
    assert sb.t_prefill_end_ns == b_pre_end and sb.prompt_tokens == 17
    assert sb.token_ns == [b_pre_end, b2[1]]
    assert [s.tokens_in_batch for s in sb.steps] == [1]
    waits = [(w.req_id, w.start_ns, w.end_ns) for w in view.queue_waits]
    assert waits == [(0, 90 * MS, a0), (1, 95 * MS, b0)]
    # B is counted waiting at every step while A runs
    assert [w for t, w, _ in view.queue_depth if t < b0] == [1, 1, 1]


def test_two_slots_in_one_batch_and_a_cached_prompt_restart():
    e = Engine()
    e.step((0, 0, 8, True), (1, 0, 20, True))      # two prompts in one batch
    e.step((0, 8, 1, True), (1, 20, 1, True))      # both decode: batch size 2
    e.step((0, 9, 1, True))
    e.step((0, 4, 1, True))                        # slot 0: cached prefix kept, positions go back: new
    ra, rb, rc = _request(1, 10), _request(2, 20), _request(3, 30)
    view, tied = build_llama_view(e.events, [ra, rb, rc])
    assert tied == 3
    assert [s.batch_size for s in view.steps] == [2, 2, 1, 1]
    assert view.steps[1].requests == {0, 1}
    assert rc.server is not None and rc.server.prompt_tokens == 1
    assert rc.server.token_ns == [rc.server.t_end_ns]


def test_a_sequence_with_no_open_request_is_not_tied():
    e = Engine()
    e.step((0, 0, 4, True))
    done_before = _request(1, 10, end_ms=20)  # ended before the engine began: not its request
    view, tied = build_llama_view(e.events, [done_before])
    assert tied == 0 and done_before.server is None and len(view.requests) == 1


def test_two_requests_read_a_moment_apart_are_told_apart_by_where_their_responses_end():
    """A (read first) and B (0.4 ms later, on another HTTP thread) reach the queue B first:
    B's sequence runs first and its response ends with it. FIFO alone would give B's sequence
    to A, and C's to B: every later tie one request off."""
    e = Engine()
    b0, _ = e.step((0, 0, 6, True))
    _, b_last = e.step((0, 6, 1, True))
    a0, _ = e.step((0, 0, 8, True))
    e.step((0, 8, 1, True))
    _, a_last = e.step((0, 9, 1, True))
    c0, _ = e.step((0, 0, 5, True))
    _, c_last = e.step((0, 5, 1, True))
    ra = _request(1, 90, end_ms=a_last // MS + 1)
    rb = _request(2, 90, end_ms=b_last // MS + 1)
    rb.t_ingress_ns += 400_000
    rc = _request(3, 95, end_ms=c_last // MS + 1)
    _, tied = build_llama_view(e.events, [ra, rb, rc])
    assert tied == 3
    assert (rb.server.t_scheduled_ns, ra.server.t_scheduled_ns, rc.server.t_scheduled_ns) == (b0, a0, c0)


def test_a_request_the_engine_never_decoded_does_not_shift_the_ties_after_it():
    e = Engine()
    a0, _ = e.step((0, 0, 6, True))
    _, a_last = e.step((0, 6, 1, True))
    b0, _ = e.step((0, 0, 4, True))
    _, b_last = e.step((0, 4, 1, True))
    dropped = _request(1, 90, end_ms=a0 // MS + 5)  # answered while A ran, never decoded
    ra = _request(2, 91, end_ms=a_last // MS + 1)
    rb = _request(3, 92, end_ms=b_last // MS + 1)
    _, tied = build_llama_view(e.events, [dropped, ra, rb])
    assert tied == 2 and dropped.server is None
    assert (ra.server.t_scheduled_ns, rb.server.t_scheduled_ns) == (a0, b0)


def _sync(ts_ns: int, waited_ns: int, ctx: int = 0xC0, tid: int = 8) -> LlamaStepRecord:
    return LlamaStepRecord(EventType.LLAMA_STEP, 7, tid, ts_ns, LlamaStepPhase.SYNC, 0, (), False,
                           waited_ns, ctx)


def test_a_sync_that_waited_ends_the_step_before_it_and_no_other():
    e = Engine()
    s0 = e.step((0, 0, 30, True))
    s1 = e.step((0, 30, 1, True))
    s2 = e.step((0, 31, 1, True))
    us = MS // 1000  # steps are 1 ms apart: each sync returns before the next step
    e.events += [
        _sync(s0[1] + 800 * us, 700 * us),           # the GPU still computing step 0: it ends here
        _sync(s1[1] + 300 * us, 200 * us, ctx=0xD0),  # a draft model's context: not step 1's
        _sync(s1[1] + 500 * us, 5 * us),              # waited for nothing: step 1 ends at its return
        _sync(s2[1] + 500 * us, 400 * us, tid=9),     # another thread's wait
    ]
    steps = pair_steps(e.events)
    ends = [(s.t_end_ns, s.synced) for s in steps]
    assert ends == [(s0[1] + 800 * us, True), (s1[1], False), (s2[1], False)]


def test_a_days_worth_of_requests_is_tied_in_time_linear_in_them():
    """20,000 requests, one after another: every one tied to its sequence, and the waiting
    and running counts right, within seconds (scanning every request at every step took
    90 s here; bisection takes under one)."""
    e = Engine()
    requests, firsts = [], []
    for k in range(20_000):
        first, _ = e.step((0, 0, 4, True))
        _, last = e.step((0, 4, 1, True))
        requests.append(_request(k, first // MS - 1, end_ms=last // MS + 1))
        firsts.append(first)
    began = time.monotonic()
    view, tied = build_llama_view(e.events, requests)
    assert time.monotonic() - began < 10
    assert tied == 20_000 and [r.server.t_scheduled_ns for r in requests] == firsts
    # at each step one sequence runs and nothing waits (each request is read 1 ms before its step)
    assert {(w, r) for _, w, r in view.queue_depth} == {(0, 1)}
