"""The HTTP/1.1 state machine on event sequences that real servers produce."""

from inferprobe.collector.ingest.sessionizer import ERROR_BODY_UNREAD, sessionize
from inferprobe.collector.model.events import ConnRole, HttpFlag, HttpKind, HttpMethod

from tests.factories import (
    conn_close,
    conn_open,
    decoded,
    io,
    ndjson_chunk,
    ndjson_headers,
    request,
    sse_chunk,
    sse_headers,
    tls_tied,
)


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


# -- stream shapes beyond unnamed SSE events ----------------------------------------

def test_chunked_end_written_in_pieces_is_complete_not_aborted():
    """cpp-httplib (llama.cpp's server): the last data chunk, then "0\\r\\n", then
    "\\r\\n", then close. The response ends at the blank line."""
    s = run(
        conn_open(1), request(1, ts=100), sse_headers(1, ts=200), sse_chunk(1, ts=300),
        io(1, read=False, nbytes=3, flags=HttpFlag.LAST_CHUNK, ts=400),
        io(1, read=False, nbytes=2, flags=HttpFlag.BLANK_LINE_END, ts=410),
        conn_close(1, ts=500),
    )
    (req,) = s.requests
    assert (req.outcome, req.t_end_ns, req.end_reason) == ("complete", 410, "framing")


def test_blank_line_before_the_last_chunk_ends_nothing():
    """An SSE chunk with CRLF lines ends with an empty line too: only after the
    last chunk's line does it end the body."""
    s = run(
        conn_open(1), request(1, ts=100), sse_headers(1, ts=200),
        sse_chunk(1, ts=300, flags=HttpFlag.BLANK_LINE_END),
        conn_close(1, ts=500),
    )
    assert s.requests[0].outcome == "aborted"


def test_close_after_the_last_chunk_without_its_blank_line_is_complete():
    s = run(
        conn_open(1), request(1, ts=100), sse_headers(1, ts=200),
        sse_chunk(1, ts=300, flags=HttpFlag.LAST_CHUNK),
        conn_close(1, ts=500),
    )
    (req,) = s.requests
    assert (req.outcome, req.t_end_ns, req.end_reason) == ("complete", 300, "last chunk, then close")


def test_close_after_the_streams_end_marker_without_the_last_chunk_is_complete():
    """The openai SDK stops reading at "data: [DONE]" and closes; the server's terminating
    chunk, sent in a later segment, is then never read: the stream still ended."""
    s = run(
        conn_open(1), request(1, ts=100), sse_headers(1, ts=200), sse_chunk(1, ts=300),
        sse_chunk(1, ts=350, flags=HttpFlag.SSE_DONE),
        conn_close(1, ts=500),
    )
    (req,) = s.requests
    assert (req.outcome, req.t_end_ns, req.end_reason) == ("complete", 350, "end marker, then close")


def test_last_chunk_with_trailers_and_blank_line_in_one_write_ends_it():
    s = run(request(1, ts=100), sse_headers(1, ts=200), sse_chunk(1, ts=300),
            io(1, read=False, nbytes=20, flags=HttpFlag.LAST_CHUNK | HttpFlag.BLANK_LINE_END, ts=400))
    assert (s.requests[0].outcome, s.requests[0].t_end_ns) == ("complete", 400)


def test_ndjson_lines_are_tokens_and_the_done_line_is_not():
    s = run(
        request(1, ts=100, model="llama3.2:1b"), ndjson_headers(1, ts=200),
        ndjson_chunk(1, ts=300), ndjson_chunk(1, lines=2, ts=400),
        ndjson_chunk(1, done=True, end=True, output_tokens=4, input_tokens=26, ts=500),
    )
    (req,) = s.requests
    assert req.streaming and req.stream_format == "ndjson"
    assert req.token_ns == [300, 400] and req.token_events == [1, 2]
    assert (req.t_done_ns, req.t_end_ns, req.outcome) == (500, 500, "complete")
    assert (req.output_tokens, req.input_tokens, req.model) == (4, 26, "llama3.2:1b")


def test_ndjson_done_line_ending_in_a_later_write_is_still_no_token():
    """A long final line (Ollama's context array): "done" is seen in one write,
    the line ends in the next."""
    s = run(request(1, ts=100), ndjson_headers(1, ts=200), ndjson_chunk(1, ts=300),
            ndjson_chunk(1, lines=0, done=True, ts=400), ndjson_chunk(1, lines=1, end=True, ts=410))
    (req,) = s.requests
    assert req.token_ns == [300] and req.t_done_ns == 400


def test_json_lines_of_an_sse_stream_are_not_tokens():
    s = run(request(1, ts=100), sse_headers(1, ts=200), sse_chunk(1, ts=300, json_lines=1),
            io(1, read=False, nbytes=60, json_lines=1, flags=HttpFlag.JSON_DONE, ts=350),
            sse_chunk(1, events=0, end=True, ts=400))
    (req,) = s.requests
    assert req.token_ns == [300] and req.t_done_ns is None


def test_named_events_are_stream_events_and_ttft_is_the_first_token():
    s = run(
        request(1, ts=100), sse_headers(1, ts=200),
        sse_chunk(1, events=0, named_events=1, event_name="message_start", input_tokens=25,
                  output_tokens=1, ts=300),
        sse_chunk(1, events=0, named_events=1, event_name="ping", ts=350),
        sse_chunk(1, ts=400), sse_chunk(1, ts=450),
        sse_chunk(1, events=0, named_events=2, event_name="message_delta", output_tokens=15, ts=500),
        sse_chunk(1, events=0, end=True, ts=510),
    )
    (req,) = s.requests
    assert req.token_ns == [400, 450] and req.ttft_ns == 400 - 110
    assert [(e.t_ns, e.name, e.count) for e in req.stream_events] == [
        (300, "message_start", 1), (350, "ping", 1), (500, "message_delta", 2)]
    assert (req.output_tokens, req.input_tokens) == (15, 25)  # the last count stated wins


def test_model_in_a_body_read_apart_from_the_headers():
    s = run(request(1, ts=100), io(1, read=True, nbytes=300, model="gpt-4o-mini", ts=110),
            sse_headers(1, ts=200))
    assert s.requests[0].model == "gpt-4o-mini"


CLIENT = ConnRole.CLIENT


def _client_request(conn_id: int, ts: int) -> bytes:
    return io(conn_id, read=False, nbytes=300, kind=HttpKind.REQUEST, method=HttpMethod.POST,
              path="/v1/chat/completions", flags=HttpFlag.HEADERS_END, header_bytes=250, content_length=50,
              role=CLIENT, ts=ts, fd=-1)


def _client_error_headers(conn_id: int, ts: int, status: int = 503) -> bytes:
    return io(conn_id, read=True, nbytes=158, kind=HttpKind.RESPONSE, status=status, content_length=65,
              flags=HttpFlag.HEADERS_END, header_bytes=158, role=CLIENT, ts=ts, fd=18)


def test_a_tls_session_tied_at_its_first_read_takes_the_connection_opened_at_its_socket():
    """Node's client: the request's SSL_write shows no socket (a memory BIO), so its
    session runs under an id of its own (2) until its first read ties it to the
    socket connect()ed at fd 18 (id 1): the request gets that connection's peer and
    connect times, and id 1, which carried only ciphertext, is no connection of its own."""
    s = run(
        conn_open(1, port=8443, fd=18, role=CLIENT, ts=100),
        _client_request(2, ts=200),
        _client_error_headers(2, ts=300),
        tls_tied(2, fd=18, ts=301),
        conn_close(2, fd=18, role=CLIENT, ts=400),
    )
    (r,) = s.requests
    assert r.peer == "127.0.0.1:8443"
    assert set(s.connections) == {2}
    conn = s.connections[2]
    assert conn.t_open_ns == 100 and conn.peer_port == 8443 and conn.t_close_ns == 400


def test_a_client_s_error_answer_closed_unread_is_complete_with_its_status():
    """SDKs that retry read a 503's status and close without reading its body."""
    s = run(conn_open(1, fd=18, role=CLIENT, ts=100), _client_request(1, ts=200),
            _client_error_headers(1, ts=300), conn_close(1, fd=18, role=CLIENT, ts=400))
    (r,) = s.requests
    assert r.outcome == "complete" and r.status == 503 and r.t_end_ns == 310  # the read's return
    assert r.end_reason == ERROR_BODY_UNREAD


def test_a_client_s_success_answer_closed_early_is_still_aborted():
    s = run(conn_open(1, fd=18, role=CLIENT, ts=100), _client_request(1, ts=200),
            _client_error_headers(1, ts=300, status=200), conn_close(1, fd=18, role=CLIENT, ts=400))
    (r,) = s.requests
    assert r.outcome == "aborted" and r.t_end_ns == 400


def test_a_request_write_that_returns_after_its_response_arrived_still_gets_it():
    """Go's client under load: the request's Write is preempted after its socket
    write and returns (1500) after the response's first read did (1000, a read
    its connection's read loop had begun before the request). The request still
    gets its own response, and the next call on the connection its own."""
    def chunk(ts: int, **flags) -> bytes:
        return io(1, read=True, nbytes=175, kind=HttpKind.DATA, role=CLIENT, ts=ts, fd=18, **flags)

    def exchange(write_ts: int, write_duration: int, head_ts: int, head_duration: int) -> list[bytes]:
        write = io(1, read=False, nbytes=300, kind=HttpKind.REQUEST, method=HttpMethod.POST,
                   path="/v1/chat/completions", flags=HttpFlag.HEADERS_END, header_bytes=250,
                   content_length=50, role=CLIENT, ts=write_ts, fd=18, duration=write_duration)
        head = io(1, read=True, nbytes=149, kind=HttpKind.RESPONSE, status=200, role=CLIENT, ts=head_ts,
                  fd=18, flags=HttpFlag.HEADERS_END | HttpFlag.CHUNKED | HttpFlag.EVENT_STREAM,
                  header_bytes=149, duration=head_duration)
        end = head_ts + head_duration
        return [write, head, chunk(end + 100, sse_events=1), chunk(end + 200, sse_events=1),
                chunk(end + 300, flags=HttpFlag.CHUNKED_END)]

    s = run(conn_open(1, fd=18, role=CLIENT, ts=100),
            *exchange(write_ts=200, write_duration=1300, head_ts=150, head_duration=850),
            *exchange(write_ts=2000, write_duration=20, head_ts=1500, head_duration=1000))
    first, second = s.requests
    assert first.outcome == second.outcome == "complete"
    assert first.t_response_start_ns == 1000 and first.token_ns == [1110, 1210] and first.t_end_ns == 1310
    assert second.t_response_start_ns == 2500 and second.token_ns == [2610, 2710]
    assert s.stats.responses_without_request == 0
