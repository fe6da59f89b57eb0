"""vLLM's hand-offs and step outputs -> requests, phases, steps and ties
(collector/ingest/engine_ipc_view.py), on records as bpf/protocols/zmtp.bpf.h sends them."""

from __future__ import annotations

from inferprobe.analyzers.decompose import phases_ns
from inferprobe.collector.ingest.engine_ipc_view import build_engine_ipc_view
from inferprobe.collector.ingest.llama_view import phase_source
from inferprobe.collector.model.events import EngineIpcFlag, EngineIpcKind, EngineIpcRecord, EventType
from inferprobe.collector.model.timeline import Outcome, Request

MS = 1_000_000
API, CORE = 10, 11  # the API server's and EngineCore's pids
ADD_CONN, OUT_CONN = 1, 2


class Wire:
    """Both ends of each message: the API server writes ADDs that EngineCore reads 0.1 ms
    later; EngineCore writes each step's outputs that the API server reads 0.1 ms later."""

    def __init__(self) -> None:
        self.records: list[EngineIpcRecord] = []
        self.messages = 0

    def _both(self, writer: int, reader: int, t_ms: float, kind: EngineIpcKind, rid: str | None,
              count: int, index: int = 0, flags: EngineIpcFlag | None = None,
              queued: float | None = None, scheduled: float | None = None) -> None:
        for pid, is_read, t in ((writer, False, t_ms), (reader, True, t_ms + 0.1)):
            self.records.append(EngineIpcRecord(
                EventType.ENGINE_IPC, pid, pid, round(t * MS),
                ADD_CONN if kind == EngineIpcKind.ADD else OUT_CONN, self.messages, kind, is_read,
                flags or EngineIpcFlag(0), count, index, rid, queued, scheduled))

    def add(self, t_ms: float, rid: str, prompt: int) -> None:
        self.messages += 1
        self._both(API, CORE, t_ms, EngineIpcKind.ADD, rid, prompt)

    def step(self, t_ms: float, *entries: tuple) -> None:
        """entries: (rid, tokens, finished, (queued_ms, scheduled_ms) or None)"""
        self.messages += 1
        for i, (rid, tokens, finished, events) in enumerate(entries):
            q, s = (events[0] * MS / 1e9, events[1] * MS / 1e9) if events else (None, None)
            self._both(CORE, API, t_ms, EngineIpcKind.OUTPUT, rid, tokens, i,
                       EngineIpcFlag.FINISHED if finished else EngineIpcFlag(0), q, s)
        self._both(CORE, API, t_ms, EngineIpcKind.STEP, None, len(entries), len(entries))


def _http(conn: int, ingress_ms: float, first_token_ms: float, end_ms: float) -> Request:
    return Request(pid=API, tid=API, conn=conn, method="POST", path="/v1/chat/completions",
                   t_ingress_ns=round(ingress_ms * MS), status=200, outcome=Outcome.COMPLETE,
                   t_response_start_ns=round((ingress_ms + 1) * MS), streaming=True,
                   token_ns=[round(first_token_ms * MS), round(end_ms * MS) - MS],
                   t_end_ns=round(end_ms * MS))


def _scenario():
    """A arrives first and is scheduled at once; B arrives during A's prefill, waits for
    that step to end (hand-off), then for a slot (queue) behind it; A finishes first."""
    w = Wire()
    w.add(10, "chatcmpl-a-00000001", 30)
    w.step(40, ("chatcmpl-a-00000001", 1, False, (10.2, 10.3)))           # A's prefill: 10.3 .. 40
    w.add(20, "chatcmpl-b-00000002", 12)
    w.step(60, ("chatcmpl-a-00000001", 1, False, None))
    w.step(90, ("chatcmpl-b-00000002", 1, False, (40.05, 62.0)),          # B scheduled at 62
           ("chatcmpl-a-00000001", 1, True, None))
    w.step(110, ("chatcmpl-b-00000002", 2, True, None))
    w.records.sort(key=lambda r: r.ts_ns)
    a = _http(1, 5, 40.5, 91)
    b = _http(2, 15, 90.4, 111)
    return w, a, b


def test_each_request_gets_the_engines_own_queue_and_prefill_to_its_step():
    w, a, b = _scenario()
    view, tied = build_engine_ipc_view(w.records, [a, b])
    assert tied == 2 and a.correlated_by == b.correlated_by == "engine_ipc"
    assert phase_source(a) == "engine_ipc"
    sa, sb = a.server, b.server
    assert sa is not None and sb is not None
    assert sa.engine_request_id == "chatcmpl-a-00000001" and sb.prompt_tokens == 12
    assert (sb.t_handoff_ns, sb.t_queued_ns, sb.t_scheduled_ns) == (20 * MS, 40.05 * MS, 62 * MS)
    assert sb.t_prefill_end_ns == 90 * MS and sb.output_tokens == 3 and sb.t_end_ns == 110 * MS
    assert sb.token_ns == [90 * MS, 110 * MS, 110 * MS]   # a two-token output is two tokens of its step
    phases = phases_ns(b)
    assert phases["ingress"] == 5 * MS and phases["handoff"] == round(20.05 * MS)
    assert phases["queue"] == round(21.95 * MS) and phases["prefill"] == 28 * MS
    assert phases["network_flush"] == round(0.4 * MS)


def test_steps_carry_their_batch_and_prefill_tokens_and_start_where_the_last_ended():
    w, a, b = _scenario()
    view, _ = build_engine_ipc_view(w.records, [a, b])
    shape = [(s.t_start_ns, s.t_end_ns, s.batch_size, s.prefill_tokens) for s in view.steps]
    assert shape == [(round(10.3 * MS), 40 * MS, 1, 30), (40 * MS, 60 * MS, 1, 0),
                     (62 * MS, 90 * MS, 2, 12), (90 * MS, 110 * MS, 1, 0)]
    # at B's step start nothing waits and two run; at A's second step B waited
    assert view.queue_depth[1] == (40 * MS, 0, 1) and view.queue_depth[2] == (62 * MS, 0, 2)


def test_a_tie_goes_to_the_request_whose_first_token_follows_the_output_not_the_earliest_read():
    w, a, b = _scenario()
    other = _http(3, 1, 39, 45)   # read before both, answered before A's first output: another route's
    build_engine_ipc_view(w.records, [other, a, b])
    assert other.server is None and a.server is not None and b.server is not None
    assert a.server.engine_request_id.startswith("chatcmpl-a")


def test_an_id_cut_short_is_not_taken_for_a_request():
    w, a, b = _scenario()
    cut = [r if r.request_id != "chatcmpl-b-00000002" else
           EngineIpcRecord(r.type, r.pid, r.tid, r.ts_ns, r.conn_id, r.message, r.kind, r.is_read,
                           r.flags | EngineIpcFlag.ID_CUT, r.count, r.index, r.request_id, r.queued_s,
                           r.scheduled_s) for r in w.records]
    view, tied = build_engine_ipc_view(cut, [a, b])
    assert tied == 1 and b.server is None
