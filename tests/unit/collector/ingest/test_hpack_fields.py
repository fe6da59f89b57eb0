"""collector/ingest/hpack_fields.py against blocks made by the hpack package's encoder (RFC 7541)."""

from __future__ import annotations

import pytest
from hpack import Encoder

from inferprobe.collector.ingest.hpack_fields import FieldDecoder, HpackError

REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/llm.Generator/Stream?x=1"),
           (":authority", "127.0.0.1:50051"), ("content-type", "application/grpc"),
           ("authorization", "Bearer sk-SECRET-1"), ("cookie", "session=SECRET-2"), ("te", "trailers")]


def test_kept_fields_decode_through_the_dynamic_table_over_many_blocks():
    encoder, decoder = Encoder(), FieldDecoder()
    for _ in range(5):  # later blocks refer to the table the first one filled
        fields = decoder.decode(encoder.encode(REQUEST))
        assert fields == {b":method": b"POST", b":path": b"/llm.Generator/Stream?x=1",
                          b"content-type": b"application/grpc"}


def test_the_table_keeps_no_value_of_an_unlisted_field():
    encoder, decoder = Encoder(), FieldDecoder()
    decoder.decode(encoder.encode(REQUEST))
    names = {entry.name: entry.value for entry in decoder._table}
    assert names[b"authorization"] is None and names[b"cookie"] is None
    assert b"SECRET" not in repr(decoder).encode() + repr(list(decoder._table)).encode()


def test_sizes_stay_in_step_with_the_encoder_when_entries_are_evicted():
    # A small table forces evictions; a mismatch in size accounting would make
    # later indices point at the wrong entries.
    encoder, decoder = Encoder(), FieldDecoder()
    encoder.header_table_size = 256
    for i in range(30):
        block = encoder.encode([(":status", "200"), ("content-type", "text/event-stream"),
                                ("x-secret", f"value-{i}" * 3), ("grpc-status", str(i % 3))])
        fields = decoder.decode(block)
        assert fields[b":status"] == b"200" and fields[b"grpc-status"] == str(i % 3).encode()
        assert fields[b"content-type"] == b"text/event-stream"


def test_a_block_that_does_not_decode_loses_the_table_for_good():
    encoder, decoder = Encoder(), FieldDecoder()
    block = encoder.encode(REQUEST)
    with pytest.raises(HpackError):
        decoder.decode(block[: len(block) // 2])
    assert decoder.lost
    with pytest.raises(HpackError):
        decoder.decode(Encoder().encode([(":status", "200")]))
