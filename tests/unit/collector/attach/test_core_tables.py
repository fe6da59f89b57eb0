"""Map types read from a built object's BTF (collector/attach/core_tables.py) against the
layout generated from bpf/inferprobe.h: the same fields at the same offsets, signed where
the C is signed. Opening an object only parses its ELF: no root, no kernel."""

from __future__ import annotations

import ctypes

import pytest

from inferprobe.collector.attach.built_objects import BPF_DIR
from inferprobe.collector.attach.core_tables import BtfTypes
from inferprobe.collector.attach.libbpf import BpfObject, library
from inferprobe.collector.model.layout_generated import OffcpuValue, StackKey

OFFCPU = BPF_DIR / "build" / "offcpu.bpf.o"
pytestmark = pytest.mark.skipif(not OFFCPU.exists(), reason=f"{OFFCPU} is not built (make setup builds it)")


def _layout(ctype) -> list[tuple[str, int, int, bool]]:
    """(name, offset, size, signed) of each field that is not padding."""
    out = []
    for name, field_type in ctype._fields_:
        if name.startswith("_"):
            continue
        signed = issubclass(field_type, ctypes._SimpleCData) and field_type(-1).value == -1
        out.append((name, getattr(ctype, name).offset, ctypes.sizeof(field_type), signed))
    return out


def _map_types(obj: BpfObject, name: str) -> tuple[type, type]:
    types = BtfTypes(library().bpf_object__btf(obj.ptr))
    key, value = types.map_member(name, "key"), types.map_member(name, "value")
    assert key is not None and value is not None, name
    return types.ctype(key), types.ctype(value)


def test_a_maps_key_and_value_types_are_the_c_structs():
    obj = BpfObject(OFFCPU)
    try:
        key, value = _map_types(obj, "offcpu_counts")
        assert ctypes.sizeof(key) == ctypes.sizeof(StackKey)
        assert _layout(key) == _layout(StackKey)
        assert _layout(value) == _layout(OffcpuValue)
        tid_key, start = _map_types(obj, "offcpu_start")
        assert tid_key is ctypes.c_uint32
        # struct offcpu_start_t (offcpu.bpf.c): u64, then u32 and s32 fields, a u64 and more, 56 bytes
        assert ctypes.sizeof(start) == 56
        assert [(n, o, s) for n, o, s, _ in _layout(start)][:4] == [
            ("ts_ns", 0, 8), ("tgid", 8, 4), ("user_stack_id", 12, 4), ("kernel_stack_id", 16, 4)]
        # a u64 after six 4-byte fields, which bring it to 32: its own alignment, no padding
        assert ("wake_ns", 32, 8) in [(n, o, s) for n, o, s, _ in _layout(start)]
        assert dict((n, signed) for n, _, _, signed in _layout(start))["user_stack_id"] is True
    finally:
        obj.close()
