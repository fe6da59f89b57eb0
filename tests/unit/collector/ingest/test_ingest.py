"""The ingest stage (collector/ingest/pipeline.py): raw events -> decoded events, requests,
the server's view, each request tied to it; whole recordings and live batches.

Fed with the exact bytes the kernel writes (tests/factories.py); no root needed.
"""

from __future__ import annotations

from inferprobe.collector.ingest.pipeline import (
    REORDER_WINDOW_NS,
    SERVER_MEMORY_NS,
    LiveIngest,
    decode_all,
    ingest,
)
from inferprobe.collector.ingest.server_view import build_server_view
from inferprobe.collector.model.events import (
    ConnRole,
    EngineIpcFlag,
    EngineIpcKind,
    EventType,
    HttpFlag,
    HttpKind,
    HttpMethod,
)
from inferprobe.collector.model.events import UsdtProbe as P

from tests.factories import (
    conn_close,
    conn_open,
    decoded,
    engine_ipc,
    io,
    request,
    sse_chunk,
    sse_headers,
    usdt,
)

MS = 1_000_000


def _streamed(conn: int, fd: int, t0: int, tokens: int = 2) -> list[bytes]:
    """One streamed request on its own connection: read at t0, tokens 1 ms apart, closed after."""
    raws = [conn_open(conn, fd=fd, ts=t0 - 1000), request(conn, ts=t0), sse_headers(conn, ts=t0 + MS)]
    raws += [sse_chunk(conn, ts=t0 + (2 + i) * MS, end=(i == tokens - 1)) for i in range(tokens)]
    return raws + [conn_close(conn, ts=t0 + (3 + tokens) * MS)]


def _announced(req_id: int, fd: int, t0: int) -> list[bytes]:
    """The server's probes for a request it read on fd at t0."""
    return [usdt(P.REQUEST_START, req_id, 5, fd, ts=t0 + 100_000),
            usdt(P.REQUEST_END, req_id, 2, 0, ts=t0 + 4 * MS)]


def test_undecodable_events_are_counted_and_the_rest_kept_in_order():
    good = [conn_open(1, ts=10), request(1, ts=20)]
    truncated = request(1, ts=30)[:20]
    unknown_type = (9999).to_bytes(4, "little") + bytes(60)
    events, bad = decode_all([good[0], truncated, unknown_type, good[1]])
    assert bad == 2
    assert [e.type for e in events] == [EventType.CONN_OPEN, EventType.SOCK_READ]


def test_a_recording_becomes_requests_by_ingress_tied_to_the_server():
    t0 = 1_000 * MS
    raws = _streamed(2, 12, t0 + 50 * MS) + _streamed(1, 11, t0) + _announced(7, 11, t0)
    got = ingest(raws + [b"\x00\x01"])
    assert got.undecodable == 1
    assert len(got.events) == len(raws)
    assert [r.conn for r in got.requests] == [1, 2]  # by ingress, not by recording order
    assert got.correlated == 1
    assert got.requests[0].server is got.server.requests[(100, 7)]
    assert got.requests[0].correlated_by == "conn_fd" and got.requests[1].server is None
    assert set(got.connections) == {1, 2} and got.session.requests == 2


def test_socket_events_are_taken_in_the_order_their_bytes_moved():
    # The response was written after the read returned, though the ring buffer
    # handed the write over first: a read is ordered by its exit, a write by its entry.
    t0 = 1_000 * MS
    read, headers, *rest = _streamed(1, 11, t0)[1:]
    got = ingest([headers, read, *rest])
    (req,) = got.requests
    assert req.outcome == "complete" and req.token_ns == [t0 + 2 * MS, t0 + 3 * MS]


def test_live_batches_give_what_the_whole_recording_gives():
    t0 = 1_000 * MS
    raws = _streamed(1, 11, t0, tokens=3) + _announced(7, 11, t0) + _streamed(2, 12, t0 + 10 * MS)
    live = LiveIngest()
    started, ended = [], []
    for batch in (raws[:4], raws[4:9], raws[9:]):
        assert live.feed(batch) == decoded(*batch)  # the batch decoded, as handed over
        new, done = live.harvest()
        started += new
        ended += done
    def shape(requests):
        return [(r.conn, r.token_ns, r.t_end_ns, r.outcome) for r in requests]

    assert shape(ended) == shape(ingest(raws).requests)
    assert [r.conn for r in started] == [1, 2]
    assert ended[0].server is not None and ended[0].server.req_id == 7
    # What ended is no longer held: neither the request nor the server's view of it.
    assert live.sessionizer.requests == [] and live.server.view.requests == {}


def test_a_request_is_started_once_and_an_open_one_ends_as_incomplete():
    t0 = 1_000 * MS
    read_and_headers, tokens = _streamed(1, 11, t0)[:3], _streamed(1, 11, t0)[3:4]
    live = LiveIngest()
    live.feed(read_and_headers)
    started, ended = live.harvest()
    assert [r.conn for r in started] == [1] and ended == []
    live.feed(tokens)
    assert live.harvest() == ([], [])
    (left,) = live.finish()
    assert left.outcome == "incomplete" and left.token_ns == [t0 + 2 * MS]
    assert live.sessionizer.requests == []


def test_live_memory_forgets_closed_connections_and_old_server_state():
    t0 = 1_000 * MS
    late = t0 + SERVER_MEMORY_NS + 10 * MS
    live = LiveIngest()
    live.feed(_streamed(1, 11, t0) + [usdt(P.QUEUE_DEPTH, 3, 1, ts=t0)])
    live.harvest()
    assert set(live.sessionizer.connections) == {1}
    live.feed(_streamed(2, 12, late))
    live.harvest()
    assert set(live.sessionizer.connections) == {2}
    assert live.server.view.queue_depth == []


def test_server_view_pairs_each_prefill_and_each_wait_in_the_queue():
    t0 = 1_000 * MS
    raws = [usdt(P.REQUEST_QUEUED, 7, 1, tid=101, ts=t0),
            usdt(P.REQUEST_SCHEDULED, 7, 1, tid=102, ts=t0 + 2 * MS),
            usdt(P.PREFILL_START, 7, 5, tid=102, ts=t0 + 3 * MS),
            usdt(P.PREFILL_END, 7, 5, tid=102, ts=t0 + 4 * MS),
            # preempted, queued again, prefilled again on another thread
            usdt(P.REQUEST_QUEUED, 7, 1, tid=101, ts=t0 + 5 * MS),
            usdt(P.REQUEST_SCHEDULED, 7, 1, tid=102, ts=t0 + 6 * MS),
            usdt(P.PREFILL_START, 7, 5, tid=103, ts=t0 + 7 * MS),
            usdt(P.PREFILL_END, 7, 5, tid=103, ts=t0 + 9 * MS),
            usdt(P.PREFILL_END, 8, 5, tid=103, ts=t0 + 9 * MS)]  # its start came before recording
    view = build_server_view(decoded(*raws))
    assert [(s.tid, s.start_ns - t0, s.end_ns - t0) for s in view.queue_waits] == [
        (101, 0, 2 * MS), (101, 5 * MS, 6 * MS)]
    assert [(s.tid, s.req_id, s.start_ns - t0, s.end_ns - t0) for s in view.prefills] == [
        (102, 7, 3 * MS, 4 * MS), (103, 7, 7 * MS, 9 * MS)]


def test_a_request_write_handed_over_a_batch_after_its_response_still_gets_it():
    """The live path's batches: a client's request Write, preempted after its socket
    write, reaches user space in the batch after its response's reads. Held for
    REORDER_WINDOW_NS, the response waits for it and the call is whole."""
    t0 = 1_000 * MS
    now = [t0]
    live = LiveIngest(clock=lambda: now[0])
    client = {"role": ConnRole.CLIENT, "fd": 18}
    write = io(1, read=False, nbytes=300, kind=HttpKind.REQUEST, method=HttpMethod.POST,
               path="/v1/chat/completions", flags=HttpFlag.HEADERS_END, header_bytes=250,
               content_length=50, ts=t0 + MS, duration=4 * MS, **client)
    head_flags = HttpFlag.HEADERS_END | HttpFlag.CHUNKED | HttpFlag.EVENT_STREAM
    response = [io(1, read=True, nbytes=149, kind=HttpKind.RESPONSE, status=200, header_bytes=149,
                   flags=head_flags, ts=t0, duration=2 * MS, **client),
                io(1, read=True, nbytes=175, sse_events=1, ts=t0 + 3 * MS, **client),
                io(1, read=True, nbytes=5, flags=HttpFlag.CHUNKED_END, ts=t0 + 4 * MS, **client)]
    now[0] = t0 + 5 * MS
    live.feed([conn_open(1, fd=18, role=ConnRole.CLIENT, ts=t0 - MS), *response])
    assert live.harvest() == ([], [])  # nothing is old enough to be fed yet
    now[0] = t0 + 6 * MS + REORDER_WINDOW_NS
    live.feed([write])
    started, (call,) = live.harvest()
    assert started == [call] and call.outcome == "complete" and call.status == 200
    assert call.t_ingress_ns == t0 + MS and call.t_response_start_ns == t0 + 2 * MS
    assert live.sessionizer.stats.responses_without_request == 0


def test_live_ingest_ties_each_request_to_its_engine_request_once_it_finished():
    """vLLM's hand-off and step outputs (bpf/protocols/zmtp.bpf.h), fed live beside the HTTP request
    they served: the ended request carries the engine's phases, and the engine's state of
    it is gone."""
    t0 = 1_000 * MS
    rid = "chatcmpl-1-0a1b2c3d"
    engine = [engine_ipc(EngineIpcKind.ADD, rid, 40, is_read=False, ts=t0 + MS // 5),
              engine_ipc(EngineIpcKind.OUTPUT, rid, 1, is_read=True, ts=t0 + 19 * MS // 10,
                         queued_s=(t0 + MS // 2) / 1e9, scheduled_s=(t0 + MS) / 1e9),
              engine_ipc(EngineIpcKind.OUTPUT, rid, 1, is_read=True, ts=t0 + 29 * MS // 10, message=2,
                         flags=EngineIpcFlag.FINISHED)]
    live = LiveIngest(clock=lambda: t0 + 60 * MS)
    live.feed(_streamed(1, 11, t0) + engine)
    _, ended = live.harvest()
    (req,) = ended
    assert req.correlated_by == "engine_ipc" and req.server is not None
    assert req.server.engine_request_id == rid and req.server.prompt_tokens == 40
    assert (req.server.t_handoff_ns, req.server.t_queued_ns, req.server.t_scheduled_ns) == (
        t0 + MS // 5, t0 + MS // 2, t0 + MS)
    assert req.server.output_tokens == 2
    assert live.engine_ipc.gather.found == {}
