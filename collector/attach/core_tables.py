"""The maps of a built object as tables: typed keys and values read from its BTF.

The probe sets read and seed their maps through one small interface, which
bcc's tables defined and they were written against: table[key], table[key] =
value, del, items(), keys(), Key and Leaf (ctypes types), walk() for a stack
map, a list of per-CPU values for a per-CPU map. CoreTable gives the same for
a map of an object loaded with libbpf, so a set that moves off bcc keeps its
Python. The ctypes types come from the object's own BTF (clang writes the
key and value type of every map there): nothing restates a C struct by hand.

Written here rather than taken from a library: libbpf has no Python binding of
its own, and the few that exist wrap bcc or generate per-object code.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, Protocol

from inferprobe.collector.attach import libbpf_library as libbpf

# BTF kinds (include/uapi/linux/btf.h)
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FLOAT, ENUM64 = 16, 19
TYPE_TAG = 18

PERCPU_TYPES = {5, 6, 10}   # BPF_MAP_TYPE_PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
STACK_TRACE = 7             # BPF_MAP_TYPE_STACK_TRACE

# What ctypes can hand the kernel by reference (ctypes._CData is no runtime name before 3.12).
_CDATA = (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)
_SIGNED = {1: ctypes.c_int8, 2: ctypes.c_int16, 4: ctypes.c_int32, 8: ctypes.c_int64}
_UNSIGNED = {1: ctypes.c_uint8, 2: ctypes.c_uint16, 4: ctypes.c_uint32, 8: ctypes.c_uint64}


class _Member(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("type", ctypes.c_uint32), ("offset", ctypes.c_uint32)]


class _Array(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("index_type", ctypes.c_uint32), ("nelems", ctypes.c_uint32)]


class BtfTypes:
    """ctypes types built from one object's BTF, by type id."""

    def __init__(self, btf: int) -> None:
        self.btf = btf
        self._built: dict[int, type] = {}

    def _raw(self, type_id: int) -> tuple[int, int, int, int]:
        """(kind, vlen, size or type, address of what follows the header) of a BTF type."""
        t = libbpf.library().btf__type_by_id(self.btf, type_id)
        info = t.contents.info
        return (info >> 24) & 0x1F, info & 0xFFFF, t.contents.size_or_type, \
            ctypes.addressof(t.contents) + ctypes.sizeof(libbpf._BtfType)

    def _name(self, name_off: int) -> str:
        return libbpf.library().btf__name_by_offset(self.btf, name_off).decode()

    def map_member(self, map_name: str, member: str) -> int | None:
        """The type id T of a map's `__type(member, T)` in this object's .maps section, or None.

        Read from the definition, not from bpf_map__btf_key_type_id(): a map reused from
        another object carries that object's type ids, which mean nothing in this BTF."""
        lib = libbpf.library()
        section_id = lib.btf__find_by_name_kind(self.btf, b".maps", libbpf.BTF_KIND_DATASEC)
        if section_id < 0:
            return None
        _kind, vlen, _size, after = self._raw(section_id)
        for entry in (libbpf._BtfVarSecinfo * vlen).from_address(after):
            var = lib.btf__type_by_id(self.btf, entry.type).contents
            if self._name(var.name_off) != map_name:
                continue
            kind, vlen, _size, after = self._raw(self._resolve(var.size_or_type))
            for field in (_Member * vlen).from_address(after):
                if self._name(field.name_off) == member:
                    pointer_kind, _v, target, _a = self._raw(field.type)
                    return target if pointer_kind == PTR else None
        return None

    def _resolve(self, type_id: int) -> int:
        kind, _vlen, target, _after = self._raw(type_id)
        return self._resolve(target) if kind in (TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG) else type_id

    def ctype(self, type_id: int) -> type:
        if type_id not in self._built:
            self._built[type_id] = self._build(type_id)
        return self._built[type_id]

    def _build(self, type_id: int) -> type:
        kind, vlen, size_or_type, after = self._raw(type_id)
        if kind in (TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG):
            return self.ctype(size_or_type)
        if kind == INT:
            encoding = ctypes.c_uint32.from_address(after).value
            signed = (encoding >> 24) & 1
            return (_SIGNED if signed else _UNSIGNED)[size_or_type]
        if kind in (ENUM, ENUM64):
            return _UNSIGNED[size_or_type]
        if kind == PTR:
            return ctypes.c_uint64
        if kind == ARRAY:
            array = _Array.from_address(after)
            return self.ctype(array.type) * array.nelems
        if kind in (STRUCT, UNION):
            return self._record(type_id, kind, vlen, size_or_type, after)
        raise TypeError(f"BTF type {type_id} (kind {kind}) has no ctypes form here")

    def _record(self, type_id: int, kind: int, vlen: int, size: int, after: int) -> type:
        members = (_Member * vlen).from_address(after)
        fields: list[tuple[str, type]] = []
        at = 0
        for index, member in enumerate(members):
            offset = member.offset // 8   # bit offset; the layouts here have no bitfields
            if kind == STRUCT and offset > at:
                fields.append((f"_pad{index}", ctypes.c_uint8 * (offset - at)))
                at = offset
            member_type = self.ctype(member.type)
            fields.append((self._name(member.name_off) or f"_anon{index}", member_type))
            if kind == STRUCT:
                at = offset + ctypes.sizeof(member_type)
        if kind == STRUCT and size > at:
            fields.append(("_tail", ctypes.c_uint8 * (size - at)))
        base = ctypes.Structure if kind == STRUCT else ctypes.Union
        return type(f"btf_{type_id}", (base,), {"_pack_": 1, "_fields_": fields})


@lru_cache(maxsize=1)
def possible_cpus() -> int:
    """What a per-CPU map holds a value for (libbpf counts /sys/devices/system/cpu/possible)."""
    count = libbpf.library().libbpf_num_possible_cpus()
    if count <= 0:
        raise libbpf.LibbpfError(f"the number of possible CPUs is unknown ({os.strerror(-count)})")
    return count


def _plain(value):
    """An integer ctypes value as an int, anything else as it is (bcc's tables do the same)."""
    return value.value if isinstance(value, ctypes._SimpleCData) else value


class CoreTable:
    """One map of a loaded object, with bcc's table interface (module docstring)."""

    # Key and Leaf are ctypes types made at run time (BtfTypes): Any, as bcc's are.
    def __init__(self, fd: int, name: str, map_type: int, key: Any, leaf: Any, max_entries: int) -> None:
        self.map_fd, self.name, self.map_type = fd, name, map_type
        self.Key, self.Leaf, self.max_entries = key, leaf, max_entries
        self.per_cpu = map_type in PERCPU_TYPES

    def _key(self, key) -> ctypes._CData:
        return key if isinstance(key, _CDATA) and ctypes.sizeof(key) == ctypes.sizeof(self.Key) \
            else self.Key(_plain(key))

    def _value_buffer(self) -> Any:
        if not self.per_cpu:
            return self.Leaf()
        stride = (ctypes.sizeof(self.Leaf) + 7) // 8 * 8
        return (ctypes.c_uint8 * (stride * possible_cpus()))()

    def lookup(self, key):
        """The value at key (per-CPU: a list of one per CPU), or None."""
        value = self._value_buffer()
        if libbpf.library().bpf_map_lookup_elem(self.map_fd, ctypes.byref(self._key(key)),
                                                ctypes.byref(value)) != 0:
            return None
        if not self.per_cpu:
            return value
        stride = len(value) // possible_cpus()
        return [_plain(self.Leaf.from_buffer_copy(value, cpu * stride)) for cpu in range(possible_cpus())]

    def __getitem__(self, key):
        value = self.lookup(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value) -> None:
        leaf = value if isinstance(value, _CDATA) else self.Leaf(value)
        if libbpf.library().bpf_map_update_elem(self.map_fd, ctypes.byref(self._key(key)),
                                                ctypes.byref(leaf), 0) != 0:
            raise OSError(ctypes.get_errno(), f"updating map {self.name} failed")

    def __delitem__(self, key) -> None:
        if libbpf.library().bpf_map_delete_elem(self.map_fd, ctypes.byref(self._key(key))) != 0:
            raise KeyError(key)

    def keys(self) -> Iterator:
        lib = libbpf.library()
        key, following = self.Key(), self.Key()
        at: ctypes._CData | None = None
        while lib.bpf_map_get_next_key(self.map_fd, ctypes.byref(at) if at is not None else None,
                                       ctypes.byref(following)) == 0:
            key = self.Key.from_buffer_copy(following)
            yield key
            at = key
        if ctypes.get_errno() not in (0, errno.ENOENT):
            raise OSError(ctypes.get_errno(), f"walking map {self.name} failed")

    def items(self) -> list[tuple]:
        out = []
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None:   # deleted since the walk saw it
                out.append((key, value))
        return out

    def values(self) -> list:
        return [value for _, value in self.items()]

    def __iter__(self) -> Iterator:
        return self.keys()

    def items_update_batch(self, keys, values) -> None:
        for key, value in zip(keys, values, strict=True):
            self[key] = value

    def walk(self, stack_id: int) -> Iterator[int]:
        """A stack map's addresses, innermost first, up to the first empty slot."""
        for address in self[stack_id]:
            if not address:
                return
            yield int(address)


class LoadedObject(Protocol):
    """What a table needs of a loaded object (collector/attach/libbpf.py's BpfObject)."""

    ptr: int | None

    def _map(self, name: str) -> int: ...

    def map_fd(self, name: str) -> int: ...


def table(obj: LoadedObject, name: str) -> CoreTable:
    """The named map of a loaded object as a CoreTable."""
    lib = libbpf.library()
    ptr = obj._map(name)
    types = BtfTypes(lib.bpf_object__btf(obj.ptr))
    map_type = lib.bpf_map__type(ptr)
    key_id, value_id = types.map_member(name, "key"), types.map_member(name, "value")
    key_size, value_size = lib.bpf_map__key_size(ptr), lib.bpf_map__value_size(ptr)
    key = types.ctype(key_id) if key_id else _UNSIGNED.get(key_size, ctypes.c_uint8 * key_size)
    if value_id:
        leaf = types.ctype(value_id)
    elif map_type == STACK_TRACE:
        leaf = ctypes.c_uint64 * (value_size // 8)
    else:
        leaf = _UNSIGNED.get(value_size, ctypes.c_uint8 * value_size)
    return CoreTable(obj.map_fd(name), name, map_type, key, leaf, lib.bpf_map__max_entries(ptr))
