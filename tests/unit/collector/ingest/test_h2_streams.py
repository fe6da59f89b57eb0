"""collector/ingest/h2_streams.py through the sessionizer: frames and header blocks as the kernel and
the header decoder hand them over, including several streams' frames in one syscall."""

from __future__ import annotations

from dataclasses import replace

from inferprobe.collector.ingest.sessionizer import sessionize
from inferprobe.collector.model.events import (
    ConnRole,
    EventType,
    H2Content,
    H2Flag,
    H2FramePart,
    H2FramesRecord,
    H2HeadersFlag,
    H2HeadersRecord,
    H2PartFlag,
    Transport,
)
from inferprobe.collector.model.timeline import Outcome

DATA, HEADERS, RST_STREAM, GOAWAY = 0, 1, 3, 7
ENDS, GRPC = H2PartFlag.ENDS, H2PartFlag.ENDS | H2PartFlag.GRPC
NO_FLAGS, NO_HEADER_FLAGS = H2Flag(0), H2HeadersFlag(0)


def frames(t: int, is_read: bool, *parts: tuple, flags: H2Flag = NO_FLAGS) -> H2FramesRecord:
    return H2FramesRecord(type=EventType.H2_FRAMES, pid=1, tid=2, ts_ns=t, exit_ns=t + 10, conn_id=5, fd=9,
                          bytes=100, flags=flags, transport=Transport.SOCKET, role=ConnRole.SERVER,
                          is_read=is_read, wire_ns=None, frames=tuple(H2FramePart(*p) for p in parts))


def headers(t: int, is_read: bool, stream: int, flags: H2HeadersFlag = NO_HEADER_FLAGS, status=None,
            grpc_status=None, path=None, content=H2Content.GRPC) -> H2HeadersRecord:
    return H2HeadersRecord(type=EventType.H2_HEADERS, pid=1, tid=2, ts_ns=t, exit_ns=t + 10, conn_id=5,
                           stream_id=stream, flags=flags, status=status, grpc_status=grpc_status,
                           grpc_message_len=0, method="POST" if path else None, path=path, content=content,
                           is_read=is_read, role=ConnRole.SERVER, transport=Transport.SOCKET,
                           traceparent=None)


def request(t: int, stream: int) -> list:
    return [headers(t, True, stream, path="/llm.Generator/Stream"),
            frames(t, True, (stream, 20, 0, HEADERS, 0x4, ENDS, 0), (stream, 12, 12, DATA, 0x1, GRPC, 1))]


def test_headers_data_and_trailers_in_one_write_make_one_whole_call():
    events = request(100, 1) + [
        headers(200, False, 1, H2HeadersFlag.HAS_STATUS, status=200),
        headers(200, False, 1, H2HeadersFlag.END_STREAM | H2HeadersFlag.GRPC_STATUS, grpc_status=0,
                content=H2Content.NONE),
        frames(200, False, (1, 3, 0, HEADERS, 0x4, ENDS, 0), (1, 30, 30, DATA, 0, GRPC, 1),
               (1, 10, 0, HEADERS, 0x5, ENDS, 0)),
    ]
    (req,) = sessionize(events).requests
    assert req.outcome == Outcome.COMPLETE and req.end_reason == "END_STREAM"
    assert req.rpc_service == "llm.Generator" and req.rpc_method == "Stream" and req.grpc_status == 0
    assert req.token_ns == [200] and req.token_events == [1] and req.t_end_ns == 200


def test_streams_sharing_a_write_each_get_their_chunk_and_a_reset_aborts_one():
    events = request(100, 1) + request(110, 3) + [
        headers(200, False, 1, H2HeadersFlag.HAS_STATUS, status=200),
        headers(200, False, 3, H2HeadersFlag.HAS_STATUS, status=200),
        frames(200, False, (1, 3, 0, HEADERS, 0x4, ENDS, 0), (3, 3, 0, HEADERS, 0x4, ENDS, 0),
               (1, 40, 40, DATA, 0, GRPC, 2), (3, 20, 20, DATA, 0, GRPC, 1)),
        frames(300, True, (3, 4, 8, RST_STREAM, 0, ENDS, 0)),  # the client cancelled stream 3
    ]
    one, three = sessionize(events).requests
    assert one.token_events == [2] and three.token_events == [1]
    assert three.outcome == Outcome.ABORTED and three.end_reason == "RST_STREAM CANCEL"
    assert one.outcome == Outcome.INCOMPLETE


def test_goaway_aborts_only_the_streams_past_the_last_one_handled():
    events = request(100, 1) + request(110, 3) + [frames(300, False, (0, 8, 1, GOAWAY, 0, ENDS, 0))]
    one, three = sessionize(events).requests
    assert three.outcome == Outcome.ABORTED and three.end_reason == "GOAWAY"
    assert one.outcome == Outcome.INCOMPLETE


def test_a_goaway_from_the_side_that_opened_the_streams_ends_none_of_them():
    """A client's GOAWAY names the last stream the server pushed: the AWS SDK for JavaScript
    sends one (last stream 0) after each response's headers, and the server goes on
    answering. Its request, and a server's reading the same frame, stay open."""
    events = request(100, 1) + [
        frames(300, True, (0, 8, 0, GOAWAY, 0, ENDS, 0)),   # the server reads the client's GOAWAY (last 0)
        headers(310, False, 1, H2HeadersFlag.HAS_STATUS, status=200),
        frames(310, False, (1, 3, 0, HEADERS, 0x4, ENDS, 0), (1, 30, 30, DATA, 0x1, GRPC, 1)),
    ]
    (one,) = sessionize(events).requests
    assert one.outcome == Outcome.COMPLETE and one.end_reason == "END_STREAM" and one.token_events == [1]


def test_a_connection_whose_frames_are_lost_leaves_its_streams_incomplete_and_counted():
    events = request(100, 1) + [frames(200, False, flags=H2Flag.LOST_SYNC)]
    session = sessionize(events)
    (req,) = session.requests
    assert req.outcome == Outcome.INCOMPLETE and req.end_reason == "HTTP/2 frames no longer followed"
    assert session.stats.h2_connections_lost == 1


def test_a_client_s_request_write_that_returns_after_its_answer_arrived_still_gets_it():
    """A gRPC client's HEADERS and message write, preempted after its socket write,
    returns (1000) after the response's HEADERS and message were read (410): the
    stream is still opened by its request, and answered."""
    def client(ev, exit_ns: int | None = None):
        return replace(ev, role=ConnRole.CLIENT, exit_ns=exit_ns if exit_ns is not None else ev.exit_ns)

    events = [
        client(headers(100, False, 1, path="/llm.Generator/Stream"), exit_ns=1000),
        client(frames(100, False, (1, 20, 0, HEADERS, 0x4, ENDS, 0), (1, 12, 12, DATA, 0x1, GRPC, 1)),
               exit_ns=1000),
        client(headers(400, True, 1, H2HeadersFlag.HAS_STATUS, status=200)),
        client(frames(400, True, (1, 3, 0, HEADERS, 0x4, ENDS, 0), (1, 30, 30, DATA, 0, GRPC, 1))),
        client(headers(600, True, 1, H2HeadersFlag.END_STREAM | H2HeadersFlag.GRPC_STATUS, grpc_status=0,
                       content=H2Content.NONE)),
        client(frames(600, True, (1, 10, 0, HEADERS, 0x5, ENDS, 0))),
    ]
    (req,) = sessionize(events).requests
    assert req.role == "client" and req.outcome == Outcome.COMPLETE and req.grpc_status == 0
    assert req.t_ingress_ns == 100 and req.t_response_start_ns == 410 and req.token_ns == [410]


def test_the_live_path_hands_out_http2_requests_after_its_first_harvest():
    """LiveIngest.harvest once replaced the sessionizer's request list, which the HTTP/2 view
    keeps a reference to: every HTTP/2 request after the first harvest was never handed out
    (no span, no metric) and kept for good. Found by benchmarks/bench_soak.py's gRPC load."""
    from inferprobe.collector.ingest.pipeline import LiveIngest

    clock = [0]
    live = LiveIngest(clock=lambda: clock[0])
    handed_out = []
    for n, stream in enumerate((1, 3, 5, 7)):   # one call per tick, each harvested
        t = 1_000_000_000 * (n + 1)
        live.feed_decoded(request(t, stream) + [
            headers(t + 100, False, stream, H2HeadersFlag.HAS_STATUS, status=200),
            headers(t + 100, False, stream, H2HeadersFlag.END_STREAM | H2HeadersFlag.GRPC_STATUS,
                    grpc_status=0, content=H2Content.NONE),
            frames(t + 100, False, (stream, 3, 0, HEADERS, 0x4, ENDS, 0), (stream, 30, 30, DATA, 0, GRPC, 1),
                   (stream, 10, 0, HEADERS, 0x5, ENDS, 0))])
        clock[0] = t + 500_000_000   # past the reorder window
        _started, ended = live.harvest()
        handed_out += ended
    # each request once, at its read's exit
    assert [r.t_ingress_ns for r in handed_out] == [1_000_000_000 * (n + 1) + 10 for n in range(4)]
    assert all(r.outcome == Outcome.COMPLETE for r in handed_out)
    assert live.sessionizer.requests == []   # nothing kept once handed out
