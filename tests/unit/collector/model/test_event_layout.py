"""Contract: collector/model/events.py decodes exactly what bpf/inferprobe.h lays out.

The mirrors are generated from the header's DWARF (scripts/gen_layout.py);
this test checks them another way: it compiles a small C program that
includes the header with the host compiler and prints sizeof / offsetof of
every mirrored struct and the value of every mirrored enum member, flag and
constant, then compares. Needs no root. That the mirror holds everything the
header declares is tests/unit/collector/model/test_layout_generated.py's part.
"""

from __future__ import annotations

import ctypes
import enum
import re
import shutil
import subprocess

import pytest

from inferprobe.collector.attach.built_objects import BPF_DIR
from inferprobe.collector.model import events, layout_generated

CC = shutil.which("cc") or shutil.which("gcc")


def _c_struct_name(class_name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", class_name).lower()  # IoEvent -> io_event


STRUCTS = {
    _c_struct_name(name): value for name, value in vars(layout_generated).items()
    if isinstance(value, type) and issubclass(value, ctypes.Structure) and value is not ctypes.Structure
}

# Every enum member, flag and constant of the mirror, under its C name.
ENUMS: dict[str, int] = {
    **{layout_generated.C_PREFIXES[cls.__name__] + member.name: member
       for cls in vars(layout_generated).values()
       if isinstance(cls, type) and issubclass(cls, enum.Enum) and cls.__module__ == layout_generated.__name__
       for member in cls},
    **{name: value for name, value in vars(layout_generated).items()
       if name.isupper() and isinstance(value, int)},
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


def test_the_mirror_covers_the_events_and_their_enums():
    # A guard on the two tables above: an empty mirror would pass the rest.
    assert {"event_header", "io_event", "usdt_event", "gpu_call_event", "stack_key"} <= set(STRUCTS)
    assert {"EVENT_SOCK_WRITE", "HTTP_FLAG_EVENT_STREAM", "GPU_FN_CU_MEMCPY", "COUNTER_MAX",
            "INFERPROBE_LAYOUT_VERSION", "WINDOW_OVERLAP"} <= set(ENUMS)


@pytest.mark.parametrize("name", list(STRUCTS))
def test_struct_sizes_and_offsets_match(c_layout, name):
    struct = STRUCTS[name]
    assert ctypes.sizeof(struct) == c_layout[f"sizeof {name}"]
    for field, _ in struct._fields_:
        assert getattr(struct, field).offset == c_layout[f"offsetof {name}.{field}"], field


@pytest.mark.parametrize("name", list(ENUMS))
def test_enum_values_match(c_layout, name):
    assert int(ENUMS[name]) == c_layout[f"value {name}"]


def test_every_event_type_has_a_decoder_of_a_struct_opening_with_the_header():
    assert set(events.DECODERS) == set(events.EventType) - events.UNRECORDED_TYPES
    for decoder in events.DECODERS.values():
        assert decoder.struct._fields_[0] == ("hdr", events.EventHeader)


def test_decode_rejects_short_and_unknown_events():
    with pytest.raises(events.DecodeError):
        events.decode(b"\x03\x00")
    with pytest.raises(events.DecodeError):
        events.decode((250).to_bytes(4, "little") + bytes(40))   # no such type
    short_io = (3).to_bytes(4, "little") + bytes(50)
    with pytest.raises(events.DecodeError):
        events.decode(short_io)


def _io_write(**fields) -> bytes:
    e = events.IoEvent()
    e.hdr.type = events.EventType.SOCK_WRITE
    for name, value in fields.items():
        setattr(e, name, value)
    return bytes(e)


@pytest.mark.parametrize("raw, what", [
    (_io_write(kind=9), "HTTP kind 9"),
    (_io_write(kind=events.HttpKind.REQUEST, method=200), "HTTP method 200"),
])
def test_a_value_outside_its_enum_makes_the_event_undecodable(raw, what):
    with pytest.raises(events.DecodeError, match=what):
        events.decode(raw)


def test_unknown_flag_bits_are_kept_not_rejected():
    e = events.NetXmitEvent()
    e.hdr.type, e.via, e.flags = events.EventType.NET_XMIT, events.NetVia.WRITE, 0x0101
    record = events.decode(bytes(e))
    assert events.NetFlag.RETRANSMIT in record.flags and int(record.flags) == 0x0101


def test_an_unknown_segment_source_is_undecodable_too():
    e = events.NetXmitEvent()
    e.hdr.type, e.via = events.EventType.NET_XMIT, 0
    with pytest.raises(events.DecodeError, match="segment source 0"):
        events.decode(bytes(e))
