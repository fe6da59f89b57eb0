"""What the live ingest keeps per connection and per process goes at the end the kernel
reports (a close, a process's exit) or at a stated bound: created in bulk, then ended."""

from __future__ import annotations

from inferprobe.collector.ingest import server_view
from inferprobe.collector.ingest.h2_streams import _H2Conn
from inferprobe.collector.ingest.pipeline import SERVER_MEMORY_NS, LiveIngest
from inferprobe.collector.ingest.server_view import ServerViewBuilder
from inferprobe.collector.ingest.sessionizer import PROCESS_EXITED, Sessionizer
from inferprobe.collector.model.events import UsdtProbe as P
from inferprobe.collector.model.timeline import Outcome, Request

from tests.factories import conn_close, conn_open, decoded, request, sse_chunk, sse_headers, usdt

MS = 1_000_000


def test_closed_connections_leave_no_per_connection_state():
    s = Sessionizer()
    events = []
    for cid in range(1, 501):
        events += [conn_open(cid, fd=cid, ts=cid * MS), request(cid, fd=cid, ts=cid * MS + 10),
                   conn_close(cid, fd=cid, ts=cid * MS + MS // 2)]
    s.feed_all(decoded(*events))
    assert s._conns == {} and s._open_at == {} and s._trace._last_io == {}
    assert len(s.requests) == 500 and all(r.outcome == Outcome.ABORTED for r in s.requests)


def test_an_exited_process_s_connections_end_and_its_state_goes():
    t0 = 1_000 * MS
    live = LiveIngest()
    raws = []
    for cid in range(1, 201):   # pid 200: requests read, no answer yet, then the process is killed
        raws += [conn_open(cid, pid=200, fd=cid, ts=t0), request(cid, pid=200, fd=cid, ts=t0 + cid)]
    raws += [conn_open(999, pid=100, fd=5, ts=t0), request(999, pid=100, fd=5, ts=t0 + 1)]
    live.feed(raws)
    started, ended = live.harvest()
    assert len(started) == 201 and ended == []
    assert live.pids() == {100, 200}
    assert live.forget_processes({200}) == 200
    _, ended = live.harvest()
    assert len(ended) == 200 and {r.pid for r in ended} == {200}
    assert all(r.outcome == Outcome.ABORTED and r.t_end_ns is not None for r in ended)
    s = live.sessionizer
    assert set(s._conns) == {999} and set(s._open_at) == {(100, 5)}
    assert [r.conn for r in s.requests] == [999]   # the live process's request is still open
    # once their close is SERVER_MEMORY_NS behind the requests that end, the connections go too
    late = live._clock() + SERVER_MEMORY_NS + 10 * MS
    live.feed([sse_headers(999, pid=100, fd=5, ts=late),
               sse_chunk(999, pid=100, fd=5, ts=late + MS, end=True)])
    live._clock = lambda: late + 100 * MS
    live.harvest()
    assert set(s.connections) == {999} and live.pids() == {100}


def test_an_exited_http2_stream_s_request_ends_with_the_process():
    s = Sessionizer()
    s._h2._conns[7] = _H2Conn()   # an HTTP/2 connection with its stream state
    s.feed_all(decoded(conn_open(7, pid=300, fd=3, ts=MS)))
    assert s.forget_process(300, 5 * MS) == 1
    assert 7 not in s._h2._conns and 7 not in s._conns and s.connections[7].t_close_ns == 5 * MS


def test_requests_given_up_on_without_an_end_time_are_handed_out():
    """An HTTP/2 connection whose frames were no longer followed ends its streams
    incomplete, with no end time: harvest() hands them out instead of keeping them."""
    live = LiveIngest()
    lost = Request(pid=1, tid=1, conn=5, method="POST", path="/x", t_ingress_ns=MS)
    lost.end_reason = "HTTP/2 frames no longer followed"
    still = Request(pid=1, tid=1, conn=6, method="POST", path="/y", t_ingress_ns=MS)
    live.sessionizer.requests += [lost, still]
    _, ended = live.harvest()
    assert ended == [lost] and live.sessionizer.requests == [still]


def test_server_view_of_an_exited_process_goes():
    b = ServerViewBuilder()
    for rid in range(100):
        for ev in decoded(usdt(P.REQUEST_START, rid, 5, 3, pid=200, ts=MS + rid),
                          usdt(P.PREFILL_START, rid, 5, pid=200, ts=2 * MS + rid),
                          usdt(P.DECODE_STEP_START, rid, 1, 1, pid=200, ts=3 * MS + rid)):
            b.feed(ev)
    for ev in decoded(usdt(P.REQUEST_START, 1, 5, 3, pid=100, ts=MS),
                      usdt(P.DECODE_STEP_START, 1, 1, 1, pid=100, ts=3 * MS)):
        b.feed(ev)
    assert b.pids() == {100, 200}
    b.forget_process(200)
    assert b.pids() == {100}
    assert set(b.view.requests) == {(100, 1)} and set(b._open_steps) == {(100, 1)}
    assert b._open_spans == {} and [st.pid for st in b.view.steps] == [100]


def test_steps_that_lost_their_end_go_with_forget_before():
    b = ServerViewBuilder()
    b.feed(decoded(usdt(P.DECODE_STEP_START, 1, 1, 1, ts=MS))[0])
    b.feed(decoded(usdt(P.DECODE_STEP_START, 2, 1, 1, ts=100 * MS))[0])
    b.forget_before(50 * MS)
    assert set(b._open_steps) == {(100, 2)} and [st.step_id for st in b.view.steps] == [2]
    assert b.last_step(100).step_id == 2


def test_unended_server_requests_are_bounded(monkeypatch):
    monkeypatch.setattr(server_view, "MAX_OPEN_REQUESTS", 10)
    b = ServerViewBuilder()
    for rid in range(25):   # request_end lost for every one
        b.feed(decoded(usdt(P.REQUEST_START, rid, 5, 3, ts=MS + rid))[0])
    assert len(b.view.requests) == 10 and b.requests_evicted == 15
    assert sorted(r for _, r in b.view.requests) == list(range(15, 25))


def test_process_exited_is_the_reason_of_an_answer_cut_short():
    s = Sessionizer()
    s.feed_all(decoded(conn_open(1, pid=9, ts=MS), request(1, pid=9, ts=2 * MS),
                       sse_headers(1, pid=9, ts=3 * MS)))
    s.forget_process(9, 10 * MS)
    (req,) = s.requests
    assert (req.outcome, req.end_reason, req.t_end_ns) == (Outcome.ABORTED, PROCESS_EXITED, 10 * MS)
