"""HPACK (RFC 7541) decoding that keeps only the header fields inferprobe may keep.

Why not hpack.Decoder: it keeps every decoded value in its dynamic table
for the life of the connection, `authorization` and cookies included. Here
the dynamic table keeps, for any field not in KEPT, only its name and its
size (what HPACK's table accounting needs, section 4.1): the value is
decoded (its length is what counts), compared with nothing and dropped
before the block's next field. A later reference to such an entry yields
its name with no value. The Huffman code and the static table come from
the `hpack` package.

One decoder per connection and direction, fed every header block in order:
a block that cannot be read whole (a piece the kernel cut or lost) makes the
table unfollowable, and the decoder says so (`lost`) for good, never guessing
at later blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

# The fields whose values may leave decoding (docs/http2.md). grpc-message's
# value is kept only for its length (it may quote a request).
KEPT = frozenset({b":method", b":path", b":status", b"content-type", b"grpc-status", b"grpc-message",
                  b"traceparent", b"tracestate"})
STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = HeaderTable.STATIC_TABLE
ENTRY_OVERHEAD = 32  # section 4.1
DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE's initial value


class HpackError(ValueError):
    """The block does not decode: its table can no longer be followed."""


@dataclass(slots=True)
class _Entry:
    name: bytes
    value: bytes | None  # None: a field whose value is not kept
    size: int


@dataclass(slots=True)
class FieldDecoder:
    """The dynamic table of one direction of one connection."""

    max_size: int = DEFAULT_TABLE_SIZE
    lost: bool = False
    _table: deque[_Entry] = field(default_factory=deque)
    _size: int = 0

    def decode(self, block: bytes) -> dict[bytes, bytes]:
        """The kept fields of one header block (its last value for a repeated name)."""
        if self.lost:
            raise HpackError("the header table was lost earlier on this connection")
        try:
            return self._decode(memoryview(block))
        except (HpackError, IndexError, ValueError) as exc:
            self.lost = True
            raise HpackError(str(exc)) from None

    def _decode(self, data: memoryview) -> dict[bytes, bytes]:
        kept: dict[bytes, bytes] = {}
        pos = 0
        while pos < len(data):
            byte = data[pos]
            if byte & 0x80:  # indexed field (6.1)
                index, pos = _integer(data, pos, 7)
                name, value = self._entry(index)
            elif byte & 0x40:  # literal with incremental indexing (6.2.1)
                name, value, value_len, pos = self._literal(data, pos, 6)
                self._add(name, value, value_len)
            elif byte & 0x20:  # dynamic table size update (6.3)
                size, pos = _integer(data, pos, 5)
                self.max_size = size
                self._evict(0)
                continue
            else:  # literal without indexing / never indexed (6.2.2, 6.2.3)
                name, value, _, pos = self._literal(data, pos, 4)
            if value is not None and name in KEPT:
                kept[name] = value
        return kept

    def _literal(self, data: memoryview, pos: int, prefix: int) -> tuple[bytes, bytes | None, int, int]:
        """name, the value if it is kept (else None), the value's decoded length, next position."""
        index, pos = _integer(data, pos, prefix)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(data, pos)
        value, pos = _string(data, pos)
        # Everything but the listed fields is dropped here; only its length lives on.
        return name, (value if name in KEPT else None), len(value), pos

    def _entry(self, index: int) -> tuple[bytes, bytes | None]:
        if index == 0:
            raise HpackError("index 0")
        if index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        dynamic = index - len(STATIC_TABLE) - 1
        if dynamic >= len(self._table):
            raise HpackError(f"index {index} past the dynamic table")
        entry = self._table[dynamic]
        return entry.name, entry.value

    def _add(self, name: bytes, value: bytes | None, value_len: int) -> None:
        size = len(name) + value_len + ENTRY_OVERHEAD
        self._evict(size)
        if size <= self.max_size:
            self._table.appendleft(_Entry(name, value, size))
            self._size += size

    def _evict(self, room: int) -> None:
        while self._table and self._size + room > self.max_size:
            self._size -= self._table.pop().size


def _integer(data: memoryview, pos: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer with a prefix of `prefix` bits (5.1)."""
    mask = (1 << prefix) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
        if shift > 28:
            raise HpackError("integer too long")


def _string(data: memoryview, pos: int) -> tuple[bytes, int]:
    """A string literal (5.2), Huffman-decoded where it is coded."""
    huffman = bool(data[pos] & 0x80)
    length, pos = _integer(data, pos, 7)
    end = pos + length
    if end > len(data):
        raise HpackError("string past the end of the block")
    raw = bytes(data[pos:end])
    return (decode_huffman(raw) if huffman else raw), end
