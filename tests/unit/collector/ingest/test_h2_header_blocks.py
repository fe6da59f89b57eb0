"""collector/ingest/h2_header_blocks.py: pieces as the kernel sends them, to the fields kept."""

from __future__ import annotations

from hpack import Encoder

from inferprobe.collector.ingest.h2_header_blocks import HeaderBlocks, fragment
from inferprobe.collector.model.events import H2Content, H2FrameFlag, H2FrameType, H2HeadersFlag, decode
from inferprobe.collector.model.layout_generated import H2HeaderPiece

HEADERS, CONTINUATION = H2FrameType.HEADERS, H2FrameType.CONTINUATION
END_STREAM, END_HEADERS = H2FrameFlag.END_STREAM, H2FrameFlag.END_HEADERS
PADDED, PRIORITY = H2FrameFlag.PADDED, H2FrameFlag.PRIORITY


def piece(payload: bytes, frame_length: int, offset: int = 0, frame_type: int = HEADERS,
          flags: int = END_HEADERS,
          stream_id: int = 1, direction: int = 0, truncated: bool = False) -> H2HeaderPiece:
    p = H2HeaderPiece()
    p.hdr.pid, p.hdr.tid, p.hdr.ts_ns = 10, 11, 1000
    p.conn_id, p.exit_ns, p.stream_id = 7, 2000, stream_id
    p.frame_length, p.offset, p.len = frame_length, offset, len(payload)
    p.frame_type, p.frame_flags, p.dir, p.truncated = frame_type, flags, direction, truncated
    p.bytes[: len(payload)] = payload
    return p


def request_block() -> bytes:
    return Encoder().encode([(":method", "POST"), (":path", "/llm.Generator/Stream?q=secret"),
                             ("content-type", "application/grpc+proto"), ("authorization", "Bearer X"),
                             ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                             ("tracestate", "congo=t61rcWkgMzE")])


def test_a_block_split_across_syscalls_and_continuation_frames_decodes_whole():
    block = request_block()
    a, b = block[:10], block[10:]
    blocks = HeaderBlocks()
    assert blocks.feed(piece(a[:4], len(a), 0, flags=0)) is None  # HEADERS, its payload cut by the syscall
    assert blocks.feed(piece(a[4:], len(a), 4, flags=0)) is None
    raw = blocks.feed(piece(b, len(b), 0, frame_type=CONTINUATION, flags=END_HEADERS))
    ev = decode(raw)
    assert ev.method == "POST" and ev.path == "/llm.Generator/Stream" and ev.stream_id == 1
    assert ev.content == H2Content.GRPC and ev.is_read
    assert ev.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert ev.tracestate == "congo=t61rcWkgMzE" and not ev.tracestate_cut
    assert b"Bearer" not in raw and b"secret" not in raw


def test_padding_and_priority_are_stripped():
    block = request_block()
    payload = bytes([3]) + bytes(5) + block + b"\0\0\0"
    assert fragment(True, HEADERS, PADDED | PRIORITY, payload) == block


def test_a_missing_piece_loses_the_table_and_says_so():
    block = request_block()
    blocks = HeaderBlocks()
    raw = blocks.feed(piece(block[8:], len(block), 8))  # its first 8 bytes never came
    ev = decode(raw)
    assert H2HeadersFlag.TABLE_LOST in ev.flags and ev.path is None and ev.method is None
    later = decode(blocks.feed(piece(block, len(block), stream_id=3)))
    assert H2HeadersFlag.TABLE_LOST in later.flags and later.path is None


def test_trailers_carry_grpc_status_and_the_end_of_the_stream():
    block = Encoder().encode([("grpc-status", "13"), ("grpc-message", "model crashed on prompt X")])
    ev = decode(HeaderBlocks().feed(piece(block, len(block), flags=END_HEADERS | END_STREAM, direction=1)))
    assert ev.grpc_status == 13 and ev.grpc_message_len == len("model crashed on prompt X")
    assert H2HeadersFlag.END_STREAM in ev.flags and not ev.is_read


def _on(conn_id: int, p: H2HeaderPiece) -> H2HeaderPiece:
    p.conn_id = conn_id
    return p


def test_a_closed_connection_keeps_no_table():
    encoder = Encoder()
    blocks = HeaderBlocks()
    first = encoder.encode([(":method", "POST"), (":path", "/a"), ("x-big", "v" * 50)])
    assert decode(blocks.feed(_on(1, piece(first, len(first))))).path == "/a"
    assert blocks.connections == 1
    blocks.closed(1)
    assert blocks.connections == 0


def test_tables_past_the_bound_give_way_and_their_connections_say_table_lost():
    blocks = HeaderBlocks(max_connections=2)
    encoders = {conn: Encoder() for conn in (1, 2, 3)}

    def send(conn: int, path: str):
        block = encoders[conn].encode([(":method", "GET"), (":path", path)])
        return decode(blocks.feed(_on(conn, piece(block, len(block)))))

    assert send(1, "/one").path == "/one" and send(2, "/two").path == "/two"
    assert send(1, "/one").path == "/one"          # 1 fed again: 2 is now the least recently fed
    assert send(3, "/three").path == "/three"      # a third connection: 2's table gives way
    assert blocks.connections == 2
    later = send(2, "/two")                        # its encoder still refers to its table: never guessed
    assert later.flags & H2HeadersFlag.TABLE_LOST and later.path is None
    assert send(3, "/three").path == "/three"      # the fed one decodes on (2's return made 1 give way)
    assert blocks.connections == 2


VERTEX = ("/v1/projects/inference-team/locations/us-east5/publishers/anthropic/models/"
          "claude-sonnet-4@20250514:streamRawPredict")


def test_a_long_path_keeps_its_two_ends_as_the_kernel_keeps_a_request_lines():
    """Vertex's path names its operation at its end, past PATH_MAX_BYTES."""
    def path_of(path: str) -> str:
        block = Encoder().encode([(":method", "POST"), (":path", path)])
        return decode(HeaderBlocks().feed(piece(block, len(block)))).path

    assert path_of(VERTEX + "?alt=sse") == "/v1/projects/inference-team/loca…nnet-4@20250514:streamRawPredict"
    assert path_of("/" + "a" * 63) == "/" + "a" * 63  # PATH_MAX_BYTES: whole
    assert path_of("/" + "b" * 300) == "/" + "b" * 63  # no end within PATH_SCAN_BYTES: its start


def test_request_blocks_are_counted_and_responses_trailers_and_promises_are_not():
    """The recorder's request count takes HTTP/2 requests from here (EventStream.h2_requests)."""
    blocks = HeaderBlocks()
    request = request_block()
    blocks.feed(piece(request, len(request)))
    response = Encoder().encode([(":status", "200"), ("content-type", "application/grpc")])
    blocks.feed(piece(response, len(response), direction=1))
    trailers = Encoder().encode([("grpc-status", "0")])
    blocks.feed(piece(trailers, len(trailers), flags=END_HEADERS | END_STREAM, direction=1))
    promise = bytes(4) + Encoder().encode([(":method", "GET"), (":path", "/pushed")])
    blocks.feed(piece(promise, len(promise), frame_type=H2FrameType.PUSH_PROMISE, direction=1, stream_id=3))
    assert blocks.requests == 1
    request = Encoder().encode([(":method", "POST"), (":path", "/v1/chat/completions")])
    blocks.feed(piece(request, len(request), stream_id=5))
    assert blocks.requests == 2
