"""Contract: collector/events.py decodes exactly what bpf/inferprobe.h lays out.

Compiles a small C program that includes the header with the host compiler
and prints sizes, offsets and enum values; compares them with the ctypes
mirrors. Needs no root.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from inferprobe.collector import events, ringbuf
from inferprobe.collector.loader import BPF_DIR

CC = shutil.which("cc") or shutil.which("gcc")

STRUCTS = {
    "event_header": events.EventHeader,
    "conn_event": events.ConnEvent,
    "io_event": events.IoEvent,
}

ENUMS = {
    "EVENT_CONN_OPEN": events.EventType.CONN_OPEN,
    "EVENT_CONN_CLOSE": events.EventType.CONN_CLOSE,
    "EVENT_SOCK_READ": events.EventType.SOCK_READ,
    "EVENT_SOCK_WRITE": events.EventType.SOCK_WRITE,
    "HTTP_KIND_DATA": events.HttpKind.DATA,
    "HTTP_KIND_REQUEST": events.HttpKind.REQUEST,
    "HTTP_KIND_RESPONSE": events.HttpKind.RESPONSE,
    "HTTP_KIND_EOF": events.HttpKind.EOF,
    "HTTP_KIND_ERROR": events.HttpKind.ERROR,
    "HTTP_METHOD_GET": events.HttpMethod.GET,
    "HTTP_METHOD_POST": events.HttpMethod.POST,
    "HTTP_METHOD_PUT": events.HttpMethod.PUT,
    "HTTP_METHOD_DELETE": events.HttpMethod.DELETE,
    "HTTP_METHOD_HEAD": events.HttpMethod.HEAD,
    "HTTP_METHOD_OPTIONS": events.HttpMethod.OPTIONS,
    "HTTP_METHOD_PATCH": events.HttpMethod.PATCH,
    "HTTP_FLAG_HEADERS_END": events.HttpFlag.HEADERS_END,
    "HTTP_FLAG_CHUNKED": events.HttpFlag.CHUNKED,
    "HTTP_FLAG_EVENT_STREAM": events.HttpFlag.EVENT_STREAM,
    "HTTP_FLAG_SSE_DONE": events.HttpFlag.SSE_DONE,
    "HTTP_FLAG_CHUNKED_END": events.HttpFlag.CHUNKED_END,
    "HTTP_FLAG_CONN_CLOSE": events.HttpFlag.CONN_CLOSE,
    "HTTP_FLAG_HAS_LENGTH": events.HttpFlag.HAS_LENGTH,
    "HTTP_FLAG_VECTORED": events.HttpFlag.VECTORED,
    "COUNTER_EVENTS_SENT": events.Counter.EVENTS_SENT,
    "COUNTER_EVENTS_LOST": events.Counter.EVENTS_LOST,
    "COUNTER_IO_SKIPPED": events.Counter.IO_SKIPPED,
    "COUNTER_MAX": events.COUNTER_MAX,
    "INFERPROBE_LAYOUT_VERSION": events.LAYOUT_VERSION,
    "PATH_MAX_BYTES": events.PATH_MAX_BYTES,
}


def _c_program() -> str:
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "inferprobe.h"',
             "int main(void) {"]
    for name, struct in STRUCTS.items():
        lines.append(f'printf("sizeof {name} %zu\\n", sizeof(struct {name}));')
        for field, _ in struct._fields_:
            lines.append(f'printf("offsetof {name}.{field} %zu\\n", offsetof(struct {name}, {field}));')
    for name in ENUMS:
        lines.append(f'printf("value {name} %lld\\n", (long long){name});')
    lines.append("return 0; }")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory) -> dict[str, int]:
    if CC is None:
        pytest.skip("no C compiler on this host: the layout contract cannot be checked")
    d = tmp_path_factory.mktemp("layout")
    (d / "layout.c").write_text(_c_program())
    subprocess.run([CC, f"-I{BPF_DIR}", "-o", str(d / "layout"), str(d / "layout.c")], check=True)
    out = subprocess.run([str(d / "layout")], capture_output=True, text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        kind, name, value = line.split()
        result[f"{kind} {name}"] = int(value)
    return result


@pytest.mark.parametrize("name", list(STRUCTS))
def test_struct_sizes_and_offsets_match(c_layout, name):
    struct = STRUCTS[name]
    assert ctypes.sizeof(struct) == c_layout[f"sizeof {name}"]
    for field, _ in struct._fields_:
        assert getattr(struct, field).offset == c_layout[f"offsetof {name}.{field}"], field


@pytest.mark.parametrize("name", list(ENUMS))
def test_enum_values_match(c_layout, name):
    assert int(ENUMS[name]) == c_layout[f"value {name}"]


def test_live_request_counter_offset_matches(c_layout):
    assert ringbuf.IO_KIND_OFFSET == c_layout["offsetof io_event.kind"]
    assert ringbuf.EVENT_SOCK_READ == events.EventType.SOCK_READ
    assert ringbuf.HTTP_KIND_REQUEST == events.HttpKind.REQUEST


def test_decode_rejects_short_and_unknown_events():
    with pytest.raises(events.DecodeError):
        events.decode(b"\x03\x00")
    with pytest.raises(events.DecodeError):
        events.decode((99).to_bytes(4, "little") + bytes(40))
    short_io = (3).to_bytes(4, "little") + bytes(50)
    with pytest.raises(events.DecodeError):
        events.decode(short_io)
