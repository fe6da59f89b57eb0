"""The HTTP/1.1 state machine on event sequences that real servers produce."""

from inferprobe.collector.events import HttpFlag, HttpKind, HttpMethod
from inferprobe.collector.sessionizer import sessionize

from factories import conn_close, conn_open, decoded, io, request, sse_chunk, sse_headers


def run(*raws):
    return sessionize(decoded(*raws))


def test_streaming_request_on_keep_alive_connection():
    s = run(
        conn_open(1),
        request(1, ts=100), sse_headers(1, ts=200),
        sse_chunk(1, ts=300), sse_chunk(1, ts=400), sse_chunk(1, events=0, ts=450, done=True),
        sse_chunk(1, events=0, end=True, ts=460),
        request(1, ts=1000), sse_headers(1, ts=1100), sse_chunk(1, ts=1200),
        sse_chunk(1, events=0, end=True, ts=1300),
    )
    first, second = s.requests
    assert first.outcome == second.outcome == "complete"
    assert first.token_ns == [300, 400]
    assert first.t_done_ns == 450 and first.t_end_ns == 460
    assert first.ttft_ns == 300 - 110  # ingress is the read's exit
    assert first.itl_ns == [100]
    assert second.token_ns == [1200] and second.t_end_ns == 1300


def test_pipelined_requests_get_their_own_responses_in_order():
    s = run(
        request(1, ts=100), request(1, ts=120),
        io(1, read=False, nbytes=100, kind=HttpKind.RESPONSE, status=200,
           flags=HttpFlag.HEADERS_END, header_bytes=80, content_length=20, ts=200),
        io(1, read=False, nbytes=90, kind=HttpKind.RESPONSE, status=404,
           flags=HttpFlag.HEADERS_END, header_bytes=80, content_length=10, ts=300),
    )
    a, b = s.requests
    assert (a.status, a.t_end_ns, a.outcome) == (200, 200, "complete")
    assert (b.status, b.t_end_ns, b.outcome) == (404, 300, "complete")


def test_content_length_body_split_across_writes():
    s = run(
        request(1, ts=100),
        io(1, read=False, nbytes=80, kind=HttpKind.RESPONSE, status=200,
           flags=HttpFlag.HEADERS_END, header_bytes=80, content_length=1000, ts=200),
        io(1, read=False, nbytes=600, ts=300),
        io(1, read=False, nbytes=400, ts=400),
    )
    (r,) = s.requests
    assert r.outcome == "complete" and r.t_end_ns == 400 and r.bytes_out == 1080


def test_client_disconnect_mid_stream_is_aborted():
    s = run(
        request(1, ts=100), sse_headers(1, ts=200), sse_chunk(1, ts=300),
        io(1, read=True, nbytes=0, kind=HttpKind.EOF, ts=350),
        conn_close(1, ts=400),
    )
    (r,) = s.requests
    assert r.outcome == "aborted" and r.t_end_ns == 400 and r.token_ns == [300]


def test_close_delimited_response_completes_at_close():
    s = run(
        request(1, ts=100),
        io(1, read=False, nbytes=100, kind=HttpKind.RESPONSE, status=200,
           flags=HttpFlag.HEADERS_END | HttpFlag.EVENT_STREAM, header_bytes=100, ts=200),
        sse_chunk(1, ts=300), sse_chunk(1, ts=400),
        conn_close(1, ts=500),
    )
    (r,) = s.requests
    assert r.outcome == "complete" and r.t_end_ns == 400 and len(r.token_ns) == 2


def test_unfinished_request_is_incomplete_not_dropped_or_invented():
    s = run(request(1, ts=100), sse_headers(1, ts=200), sse_chunk(1, ts=300))
    (r,) = s.requests
    assert r.outcome == "incomplete" and r.t_end_ns is None


def test_request_without_response_at_close_is_aborted():
    s = run(request(1, ts=100), conn_close(1, ts=200))
    (r,) = s.requests
    assert r.outcome == "aborted" and r.status is None


def test_writes_on_connection_seen_mid_response_are_not_requests():
    s = run(sse_chunk(9, ts=100), sse_chunk(9, ts=200, end=True))
    assert s.requests == []
    assert s.stats.writes_without_response == 2


def test_interim_100_continue_does_not_consume_the_request():
    s = run(
        request(1, ts=100),
        io(1, read=False, nbytes=25, kind=HttpKind.RESPONSE, status=100,
           flags=HttpFlag.HEADERS_END, header_bytes=25, ts=150),
        io(1, read=True, nbytes=50, ts=160),
        io(1, read=False, nbytes=90, kind=HttpKind.RESPONSE, status=201,
           flags=HttpFlag.HEADERS_END, header_bytes=80, content_length=10, ts=200),
    )
    (r,) = s.requests
    assert r.status == 201 and r.outcome == "complete" and r.bytes_in == 250


def test_head_and_204_have_no_body():
    s = run(
        io(1, read=True, nbytes=40, kind=HttpKind.REQUEST, path="/x",
           method=HttpMethod.HEAD,
           ts=100),
        io(1, read=False, nbytes=80, kind=HttpKind.RESPONSE, status=200,
           flags=HttpFlag.HEADERS_END, header_bytes=80, content_length=5000, ts=200),
        request(1, ts=300),
        io(1, read=False, nbytes=60, kind=HttpKind.RESPONSE, status=204,
           flags=HttpFlag.HEADERS_END, header_bytes=60, ts=400),
    )
    head, no_content = s.requests
    assert head.outcome == "complete" and head.t_end_ns == 200
    assert no_content.outcome == "complete" and no_content.t_end_ns == 400
