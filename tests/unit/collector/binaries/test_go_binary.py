"""Go binary analysis on inputs built here byte by byte: build info in both layouts, Go's
function table in both layouts, return instructions found by decoding, not by byte value.

The same code on real binaries built with Go: tests/integration/collector/binaries/test_go_binary_real.py.
"""

from __future__ import annotations

import struct

import pytest

from inferprobe.collector.binaries.go_binary import NotHookable, go_binary_verdict, return_instructions
from inferprobe.collector.binaries.go_buildinfo import (
    FLAG_BIG_ENDIAN,
    FLAG_INLINE_STRINGS,
    MAGIC,
    BuildInfoError,
    find_header,
    parse_version,
    version_from_header,
)
from inferprobe.collector.binaries.go_pclntab import MAGIC_GO116, MAGIC_GO120, PclntabError, function_entries
from inferprobe.collector.binaries.go_struct_offsets import FALLBACK_TABLE, table_offsets


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def inline_build_info(version: str, modinfo: str = "path\tcmd/x\n") -> bytes:
    header = MAGIC + bytes([8, FLAG_INLINE_STRINGS]) + bytes(16)
    return header + uvarint(len(version)) + version.encode() + uvarint(len(modinfo)) + modinfo.encode()


class Memory:
    """A sparse memory image: what the pointer layout's read_at reads through."""

    def __init__(self) -> None:
        self.regions: dict[int, bytes] = {}

    def put(self, address: int, data: bytes) -> None:
        self.regions[address] = data

    def read_at(self, address: int, size: int) -> bytes:
        for start, data in self.regions.items():
            if start <= address < start + len(data):
                return data[address - start : address - start + size]
        return b""


def pointer_build_info(version: str, ptr_size: int, big_endian: bool) -> tuple[bytes, Memory]:
    order = "big" if big_endian else "little"
    mem = Memory()
    string_header, text = 0x5000, 0x6000
    mem.put(string_header, text.to_bytes(ptr_size, order) + len(version).to_bytes(ptr_size, order))
    mem.put(text, version.encode())
    flags = FLAG_BIG_ENDIAN if big_endian else 0
    header = MAGIC + bytes([ptr_size, flags]) + string_header.to_bytes(ptr_size, order)
    return header.ljust(32, b"\0"), mem


def test_inline_layout_version() -> None:
    assert version_from_header(inline_build_info("go1.21.4")) == "go1.21.4"


def test_inline_layout_long_string_length_is_a_multi_byte_varint() -> None:
    version = "devel go1.23-" + "a" * 120 + " X:boringcrypto"  # 135 bytes: a two-byte varint
    assert version_from_header(inline_build_info(version)) == version


@pytest.mark.parametrize("ptr_size,big_endian", [(8, False), (4, False), (8, True)])
def test_pointer_layout_version(ptr_size: int, big_endian: bool) -> None:
    blob, mem = pointer_build_info("go1.16.15", ptr_size, big_endian)
    assert version_from_header(blob, mem.read_at) == "go1.16.15"


def test_pointer_layout_pointing_outside_the_image_is_an_error() -> None:
    blob, _mem = pointer_build_info("go1.16.15", 8, False)
    with pytest.raises(BuildInfoError):
        version_from_header(blob, Memory().read_at)


def test_truncated_inline_string_is_an_error() -> None:
    with pytest.raises(BuildInfoError):
        version_from_header(inline_build_info("go1.21.4")[:36])


def test_header_found_only_on_a_16_byte_boundary() -> None:
    image = b"x" * 5 + MAGIC + b"y" * 13 + inline_build_info("go1.20")  # a stray magic at 5, the real at 32
    assert find_header(image, None) == 32
    assert find_header(image, 32) == 32
    assert find_header(image, 5 + len(MAGIC)) is None  # the section offset must hold the magic
    assert find_header(b"no go here" * 10, None) is None


@pytest.mark.parametrize("text,release", [
    ("go1.19.8", (1, 19)), ("go1.22", (1, 22)), ("devel go1.23-0a1b2c3 Tue Jan 2", (1, 23)),
    ("go1.21.0 X:boringcrypto", (1, 21)),
])
def test_release_of_a_version_string(text: str, release: tuple[int, int]) -> None:
    parsed = parse_version(text)
    assert parsed is not None and parsed.release == release and parsed.text == text


def test_version_string_naming_no_release() -> None:
    assert parse_version("devel +abcdef") is None


# -- Go's function table


def pclntab(magic: int, functions: list[tuple[str, int]], text_end: int, text_start: int) -> bytes:
    """A function table in the layout magic names, functions as (name, entry)."""
    names = b"".join(n.encode() + b"\0" for n, _ in functions)
    name_offsets, pos = [], 0
    for n, _ in functions:
        name_offsets.append(pos)
        pos += len(n) + 1
    old = magic == MAGIC_GO116
    pair = "<QQ" if old else "<II"
    words = 7 if old else 8  # nfunc, nfiles, [textStart,] funcname, cu, filetab, pctab, pcln
    header_size = 8 + 8 * words
    names_at = header_size
    functab_at = names_at + len(names)
    nfunc = len(functions)
    records_at = (nfunc + 1) * struct.calcsize(pair)  # from functab_at
    record_size = 12 if old else 8
    functab = b""
    records = b""
    entries = [e for _, e in functions] + [text_end]
    for i, entry in enumerate(entries):
        raw = entry if old else entry - text_start
        functab += struct.pack(pair, raw, records_at + i * record_size if i < nfunc else 0)
    for (_, entry), name_off in zip(functions, name_offsets, strict=True):
        records += (struct.pack("<Qi", entry, name_off) if old
                    else struct.pack("<Ii", entry - text_start, name_off))
    if old:
        fields = [nfunc, 0, names_at, 0, 0, 0, functab_at]
    else:
        fields = [nfunc, 0, text_start, names_at, 0, 0, 0, functab_at]
    header = struct.pack("<IBBBB", magic, 0, 0, 1, 8) + b"".join(struct.pack("<Q", f) for f in fields)
    return header + names + functab + records


FUNCTIONS = [("main.main", 0x401000), ("crypto/tls.(*Conn).Read", 0x401200),
             ("crypto/tls.(*Conn).Write", 0x401480), ("runtime.goexit", 0x401500)]


@pytest.mark.parametrize("magic", [MAGIC_GO120, MAGIC_GO116])
def test_function_table_entries_and_sizes(magic: int) -> None:
    table = pclntab(magic, FUNCTIONS, 0x401520, 0x401000)
    wanted = frozenset({"crypto/tls.(*Conn).Read", "crypto/tls.(*Conn).Write", "runtime.goexit"})
    found = function_entries(table, 0x401000, wanted)
    assert {n: (e.entry, e.size) for n, e in found.items()} == {
        "crypto/tls.(*Conn).Read": (0x401200, 0x280), "crypto/tls.(*Conn).Write": (0x401480, 0x80),
        "runtime.goexit": (0x401500, 0x20)}


def test_function_table_of_an_unknown_release_is_refused() -> None:
    table = bytearray(pclntab(MAGIC_GO120, FUNCTIONS, 0x401520, 0x401000))
    table[0:4] = struct.pack("<I", 0xFFFFFFFB)  # Go 1.2 to 1.15
    with pytest.raises(PclntabError, match="not read here"):
        function_entries(bytes(table), 0x401000, frozenset({"main.main"}))


# -- return instructions


def test_return_byte_inside_an_instruction_is_no_return() -> None:
    code = bytes.fromhex(
        "b8c3000000"  # mov eax, 0xc3: a c3 byte that is no instruction
        "4881c4c3000000"  # add rsp, 0xc3
        "c3"  # ret
        "ebf0"  # jmp back
        "c3"  # ret
        "cccccc"  # int3 padding
    )
    assert return_instructions(code, 0x1000) == (0x100C, 0x100F)


def test_code_that_does_not_decode_to_its_end_is_refused() -> None:
    with pytest.raises(NotHookable, match="disassembled"):
        return_instructions(bytes.fromhex("c3") + b"\x0f\xff\xff", 0x1000)  # ret, then an invalid opcode


def test_code_without_return_is_refused() -> None:
    with pytest.raises(NotHookable, match="no return"):
        return_instructions(bytes.fromhex("ebfe"), 0x1000)


# -- refusals and the fallback table


def test_no_go_binary_gives_no_verdict(tmp_path) -> None:
    path = tmp_path / "not-elf"
    path.write_bytes(b"#!/bin/sh\necho hi\n")
    assert go_binary_verdict(str(path)) is None
    assert go_binary_verdict("/bin/sh") is None  # an ELF file, but no Go


def test_table_knows_only_register_abi_releases() -> None:
    assert table_offsets((1, 16)) is None
    assert table_offsets((9, 99)) is None
    known = table_offsets((1, 19))
    assert known is not None and known.source == "table"
    assert min(FALLBACK_TABLE) == (1, 17)
