"""vLLM V1's messages between its API server and EngineCore, as bytes on the wire: ZMTP 3
frames around msgpack (vllm/v1/engine/__init__.py; bpf/protocols/zmtp.bpf.h reads them).

Written here rather than with the msgpack package: the tests need the exact encodings
vLLM's msgspec writes (array16 headers, str8 ids, float64 timestamps), and byte offsets
to cut messages at, and the package is not a dependency of inferprobe."""

from __future__ import annotations

import struct

QUEUED, SCHEDULED = 1, 2  # vLLM's EngineCoreEventType
ENTRY_FIELDS = 18  # EngineCoreOutput's fields in vLLM 0.32


def pack(value) -> bytes:
    if value is None:
        return b"\xc0"
    if isinstance(value, bool):
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        if 0 <= value <= 0x7F:
            return bytes([value])
        if 0 <= value <= 0xFFFF:
            return b"\xcd" + struct.pack(">H", value)
        return b"\xce" + struct.pack(">I", value)
    if isinstance(value, float):
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode()
        return (bytes([0xA0 | len(raw)]) if len(raw) < 32 else b"\xd9" + bytes([len(raw)])) + raw
    if isinstance(value, list):
        head = bytes([0x90 | len(value)]) if len(value) < 16 else b"\xdc" + struct.pack(">H", len(value))
        return head + b"".join(pack(v) for v in value)
    if isinstance(value, dict):
        return bytes([0x80 | len(value)]) + b"".join(pack(k) + pack(v) for k, v in value.items())
    raise TypeError(value)


def frame(payload: bytes, more: bool = False) -> bytes:
    flags = 0x01 if more else 0x00
    if len(payload) < 256:
        return bytes([flags, len(payload)]) + payload
    return bytes([flags | 0x02]) + struct.pack(">Q", len(payload)) + payload


def greeting() -> bytes:
    """ZMTP 3.0's 64-byte greeting (NULL mechanism), which each peer sends first on a new connection."""
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)


def ready(socket_type: bytes) -> bytes:
    """The READY command frame that follows the greeting: its one property, the socket type."""
    body = b"\x05READY" + bytes([11]) + b"Socket-Type" + len(socket_type).to_bytes(4, "big") + socket_type
    return bytes([0x04, len(body)]) + body


def add_request(request_id: str, prompt_tokens: list[int]) -> bytes:
    """An ADD: the type frame, then an EngineCoreRequest (22 fields, the rest left nil)."""
    body = pack([request_id, prompt_tokens] + [None] * 20)
    return frame(b"\x00", more=True) + frame(body)


def output_entry(request_id: str, new_tokens: list[int], finished: bool = False,
                 events: list[tuple[int, float]] | None = None) -> list:
    fields: list = [request_id, new_tokens, None, None, None, 1 if finished else None, None,
                    [{"type": t, "timestamp": ts} for t, ts in events] if events else None]
    fields += [None] * (ENTRY_FIELDS - len(fields))
    fields[9] = {"num_cached_tokens": 0, "kv_transfer_params": ["x", 1.5]}  # nested values to pass over
    return fields


def outputs(entries: list[list]) -> bytes:
    """An EngineCoreOutputs message: engine index, the outputs, then scheduler stats."""
    return frame(pack([0, entries, {"num_running_reqs": len(entries), "kv_cache_usage": 0.25},
                       None, None, None, None, None, 0]))
