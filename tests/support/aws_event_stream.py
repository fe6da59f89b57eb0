"""AWS event stream messages (application/vnd.amazon.eventstream), as Bedrock writes them.

For the test servers that speak Bedrock's wire format and the kernel tests of
bpf/protocols/event_stream.bpf.h. A message: total length and headers length
(big-endian u32), the CRC32 of those 8 bytes, the headers, the payload, the
CRC32 of everything before it. A header: name length (u8), name, type 7 (a
string), value length (big-endian u16), value. botocore and the AWS SDK for
JavaScript check both CRCs, so a server built on this is read by the real
SDKs. Written here, not taken from botocore: botocore decodes event streams
but has no encoder.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib

STRING = 7


def message(headers: dict[str, str], payload: bytes) -> bytes:
    """One message; headers in the order given (Bedrock's: :event-type first)."""
    head = b"".join(bytes([len(name)]) + name.encode() + bytes([STRING]) + struct.pack(">H", len(value))
                    + value.encode() for name, value in headers.items())
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


def event(event_type: str, payload: dict) -> bytes:
    """An event message with a JSON payload, headers as Bedrock orders them."""
    return message({":event-type": event_type, ":content-type": "application/json", ":message-type": "event"},
                   json.dumps(payload, separators=(",", ":")).encode())


def chunk(model_event: dict, padding: str = "abcdefghijklmnopq") -> bytes:
    """invoke-with-response-stream's message: the model's own event, base64 in
    {"bytes": ...}, with the "p" field Bedrock pads payload lengths with."""
    raw = json.dumps(model_event, separators=(",", ":")).encode()
    return event("chunk", {"bytes": base64.b64encode(raw).decode(), "p": padding})


def exception(exception_type: str, text: str) -> bytes:
    """An exception message: the stream ends in it (botocore raises it as an error)."""
    return message({":exception-type": exception_type, ":content-type": "application/json",
                    ":message-type": "exception"}, json.dumps({"message": text}).encode())


def anthropic_events(texts: list[str], input_tokens: int) -> list[dict]:
    """The Anthropic Messages stream of a reply made of `texts`, as Bedrock's chunks carry it."""
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
             "content": [], "model": "claude", "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}
    deltas = [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}
              for t in texts]
    return [start, {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "ping"}, *deltas, {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
             "usage": {"output_tokens": len(texts)}},
            {"type": "message_stop", "amazon-bedrock-invocationMetrics": {
                "inputTokenCount": input_tokens, "outputTokenCount": len(texts)}}]


def converse_events(texts: list[str], input_tokens: int) -> list[bytes]:
    """converse-stream's messages for a reply made of `texts`, its usage in the metadata event."""
    return [event("messageStart", {"role": "assistant"}),
            *(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": t}}) for t in texts),
            event("contentBlockStop", {"contentBlockIndex": 0}),
            event("messageStop", {"stopReason": "end_turn"}),
            event("metadata", {"usage": {"inputTokens": input_tokens, "outputTokens": len(texts),
                                         "totalTokens": input_tokens + len(texts)},
                               "metrics": {"latencyMs": 42}})]
