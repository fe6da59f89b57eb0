"""HTTP/2 header blocks, from the kernel's pieces to the fields inferprobe keeps.

bpf/classifier_chain.bpf.c sends each HEADERS, CONTINUATION and PUSH_PROMISE payload,
as far as each syscall carried it, through the h2_header_pieces ring, which
nothing records. Here the pieces of each connection and direction are put
back together in order (a payload split across syscalls, a block split
across CONTINUATION frames), padding and priority fields are stripped, and
the block is decoded with that direction's HPACK table
(collector/ingest/hpack_fields.py). What comes out is one h2_headers_event per
block: :method, :path without its query, :status, the content-type's kind,
grpc-status, grpc-message's length, traceparent and tracestate. The block's bytes are
dropped as soon as it is decoded.

A piece that is missing (the ring was full: COUNTER_H2_PIECES_LOST) or cut
(the kernel could not read it) loses the table of its direction:
that block and every later one on the connection come out with
H2_HEADERS_FLAG_TABLE_LOST and no fields, and the report says so.

Tables live as long as their connection: the kernel says when it closed
(an h2_conn_closed record on the same ring, after its last piece). So that
a recorder running for days stays bounded where that record cannot come
(the kernel's walk state was evicted first, a process killed), at most
MAX_CONNECTIONS connections keep tables, the least recently fed giving way;
a connection whose table gave way is remembered as such (as many again),
and its later blocks come out TABLE_LOST rather than decoded against an
empty table.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from inferprobe.collector.ingest.hpack_fields import FieldDecoder, HpackError
from inferprobe.collector.model.events import (
    EventType,
    H2Content,
    H2FrameFlag,
    H2FrameType,
    H2HeadersEvent,
    H2HeadersFlag,
    HttpMethod,
    path_ends,
)
from inferprobe.collector.model.layout_generated import (
    H2_TRACEPARENT_BYTES,
    TRACESTATE_MAX_BYTES,
    EventHeader,
    H2ConnClosed,
    H2HeaderPiece,
)
from inferprobe.collector.model.ringbuf_format import frame_records, iter_ring_records

# As many as the kernel walks at once (h2_conns in bpf/classifier_chain.bpf.c).
MAX_CONNECTIONS = 16384

NDJSON_TYPES = (b"application/x-ndjson", b"application/ndjson", b"application/jsonl",
                b"application/x-jsonlines")


@dataclass(slots=True)
class _Direction:
    table: FieldDecoder = field(default_factory=FieldDecoder)
    frame: bytearray = field(default_factory=bytearray)  # the current frame's payload so far
    block: bytearray = field(default_factory=bytearray)  # the block's fragments so far
    first: H2HeaderPiece | None = None  # the first piece of the block's first frame
    broken: bool = False  # a piece of the current block is missing or cut


def content_kind(content_type: bytes | None) -> H2Content:
    if content_type is None:
        return H2Content.NONE
    media = content_type.split(b";", 1)[0].strip().lower()
    if media.startswith(b"application/grpc"):
        return H2Content.GRPC
    if media == b"text/event-stream":
        return H2Content.EVENT_STREAM
    if media in NDJSON_TYPES:
        return H2Content.NDJSON
    if media == b"application/json":
        return H2Content.JSON
    if media == b"application/vnd.amazon.eventstream":
        return H2Content.AWS_EVENT_STREAM
    return H2Content.OTHER


def fragment(first_frame: bool, frame_type: int, flags: int, payload: bytes) -> bytes:
    """The header block fragment of one frame's payload (RFC 9113 6.2, 6.6, 6.10)."""
    if not first_frame:
        return payload  # CONTINUATION: all fragment
    start, end = 0, len(payload)
    if flags & H2FrameFlag.PADDED:
        if not payload:
            raise HpackError("padded frame without a pad length")
        start, end = 1, end - payload[0]
    if frame_type == H2FrameType.HEADERS and flags & H2FrameFlag.PRIORITY:
        start += 5
    elif frame_type == H2FrameType.PUSH_PROMISE:
        start += 4  # the promised stream id
    if start > end:
        raise HpackError("padding longer than the frame")
    return payload[start:end]


class HeaderBlocks:
    """Per-connection reassembly and decoding; feed() takes pieces in ring order."""

    def __init__(self, max_connections: int = MAX_CONNECTIONS) -> None:
        self._conns: OrderedDict[int, dict[int, _Direction]] = OrderedDict()   # least recently fed first
        self._gave_way: OrderedDict[int, None] = OrderedDict()
        self._max = max_connections
        self.requests = 0   # request header blocks decoded (a :method in a HEADERS block), either side

    @property
    def connections(self) -> int:
        return len(self._conns)

    def closed(self, conn_id: int) -> None:
        """The kernel saw the connection close: its tables go."""
        self._conns.pop(conn_id, None)
        self._gave_way.pop(conn_id, None)

    def _direction(self, conn_id: int, direction: int) -> _Direction:
        dirs = self._conns.get(conn_id)
        if dirs is None:
            dirs = self._conns[conn_id] = {}
            if conn_id in self._gave_way:
                # Its table went with the eviction: decoding from an empty one would guess.
                dirs[0], dirs[1] = _Direction(), _Direction()
                dirs[0].table.lost = dirs[1].table.lost = True
            if len(self._conns) > self._max:
                evicted, _ = self._conns.popitem(last=False)
                self._gave_way[evicted] = None
                if len(self._gave_way) > self._max:
                    self._gave_way.popitem(last=False)
        else:
            self._conns.move_to_end(conn_id)
        d = dirs.get(direction)
        if d is None:
            d = dirs[direction] = _Direction()
        return d

    def feed(self, piece: H2HeaderPiece) -> bytes | None:
        """The raw h2_headers_event of the block this piece completes, else None."""
        d = self._direction(piece.conn_id, piece.dir)
        if piece.offset == 0:
            d.frame.clear()
        elif piece.offset != len(d.frame):
            d.broken = True  # a piece between went missing
        if piece.truncated:
            d.broken = True
        d.frame += bytes(piece.bytes[: piece.len])
        first_frame = piece.frame_type != H2FrameType.CONTINUATION
        if first_frame and piece.offset == 0:
            d.first = piece
            d.block.clear()
        if piece.offset + piece.len < piece.frame_length and not piece.truncated:
            return None  # the frame's payload goes on in a later syscall
        if d.first is None:
            d.broken = True
            d.first = piece
        try:
            d.block += fragment(first_frame, piece.frame_type, d.first.frame_flags if first_frame else 0,
                                bytes(d.frame))
        except HpackError:
            d.broken = True
        d.frame.clear()
        if not piece.frame_flags & H2FrameFlag.END_HEADERS:
            return None  # CONTINUATION frames follow
        first, block, broken = d.first, bytes(d.block), d.broken
        d.block.clear()
        d.first = None
        d.broken = False
        fields: dict[bytes, bytes] = {}
        if broken:
            d.table.lost = True
        if not d.table.lost:
            try:
                fields = d.table.decode(block)
            except HpackError:
                fields = {}
        del block
        if b":method" in fields and first.frame_type == H2FrameType.HEADERS:
            self.requests += 1
        return encode_event(piece, first, fields, lost=d.table.lost)


def encode_event(last: H2HeaderPiece, first: H2HeaderPiece, fields: dict[bytes, bytes], lost: bool) -> bytes:
    ev = H2HeadersEvent()
    ev.hdr.type = EventType.H2_HEADERS
    ev.hdr.pid, ev.hdr.tid, ev.hdr.cpu = last.hdr.pid, last.hdr.tid, last.hdr.cpu
    ev.hdr.ts_ns = last.hdr.ts_ns
    ev.conn_id, ev.exit_ns, ev.stream_id = last.conn_id, last.exit_ns, first.stream_id
    ev.dir, ev.role, ev.transport = last.dir, last.role, last.transport
    # A block cut across syscalls (a server reading in pieces) began with the first of them.
    ev.first_piece_ns = first.exit_ns if first.dir == 0 else first.hdr.ts_ns
    flags = 0
    if first.frame_flags & H2FrameFlag.END_STREAM and first.frame_type == H2FrameType.HEADERS:
        flags |= H2HeadersFlag.END_STREAM
    if first.frame_type == H2FrameType.PUSH_PROMISE:
        flags |= H2HeadersFlag.PUSH_PROMISE
    if lost:
        flags |= H2HeadersFlag.TABLE_LOST
    status = fields.get(b":status")
    if status is not None and status.isdigit() and len(status) == 3:
        ev.status = int(status)
        flags |= H2HeadersFlag.HAS_STATUS
    grpc_status = fields.get(b"grpc-status")
    if grpc_status is not None and grpc_status.isdigit() and len(grpc_status) <= 4:
        ev.grpc_status = int(grpc_status)
        flags |= H2HeadersFlag.GRPC_STATUS
    ev.grpc_message_len = len(fields.get(b"grpc-message", b""))
    method = fields.get(b":method")
    if method is not None:
        ev.method = getattr(HttpMethod, method.decode("latin-1").upper(), HttpMethod.UNKNOWN)
    path = fields.get(b":path")
    if path is not None:
        # a char array: ctypes copies the bytes in (reading ev.path gives a copy)
        ev.path, ev.path_len = path_ends(path.split(b"?", 1)[0])
    ev.content = content_kind(fields.get(b"content-type"))
    traceparent = fields.get(b"traceparent")
    if traceparent is not None and len(traceparent) <= H2_TRACEPARENT_BYTES:
        ev.traceparent = traceparent
        ev.traceparent_len = len(traceparent)
    tracestate = fields.get(b"tracestate")
    if tracestate is not None:
        ev.tracestate_cut = len(tracestate) > TRACESTATE_MAX_BYTES
        tracestate = tracestate[:TRACESTATE_MAX_BYTES]
        ev.tracestate = tracestate
        ev.tracestate_len = len(tracestate)
    ev.flags = flags
    return bytes(ev)


def _record_type(raw: bytes) -> int:
    return EventHeader.from_buffer_copy(raw[: ctypes.sizeof(EventHeader)]).type


class HeaderPieceDecoder:
    """Takes runs of records from the h2_header_pieces ring (as the ring reader
    hands them, collector/attach/event_stream.py) and hands each decoded block
    to `sink` as ring-framed records, like the kernel's events (the recording
    and the live exporters take both the same way). One Python call per
    piece: pieces come once per header block, not per token."""

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        self.blocks = HeaderBlocks()
        self._sink = sink

    def feed(self, chunk: bytes) -> None:
        out = []
        for raw in iter_ring_records(chunk):
            size = len(raw)
            if size >= ctypes.sizeof(H2ConnClosed) and _record_type(raw) == EventType.H2_CONN_CLOSED:
                self.blocks.closed(H2ConnClosed.from_buffer_copy(raw[: ctypes.sizeof(H2ConnClosed)]).conn_id)
                continue
            piece = H2HeaderPiece.from_buffer_copy(
                raw[: ctypes.sizeof(H2HeaderPiece)].ljust(ctypes.sizeof(H2HeaderPiece), b"\0"))
            event = self.blocks.feed(piece)
            if event is not None:
                out.append(event)
        if out:
            self._sink(frame_records(out))
