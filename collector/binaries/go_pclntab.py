"""Function entries from a Go binary's own function table (.gopclntab): found even when stripped.

`go build -ldflags=-s` drops the ELF symbol table, but the runtime needs its
function table for tracebacks and garbage collection, so it stays: every
function's entry address and name. Two layouts matter (Go's runtime/symtab.go
describes them as pcHeader and functab):

    header (both): magic u32, 2 pad bytes, minLC u8, ptrSize u8, nfunc, nfiles, ...
    Go 1.18+ (magic 0xfffffff0; 0xfffffff1 from 1.20): then textStart, funcnameOffset, cuOffset,
        filetabOffset, pctabOffset, pclnOffset (each ptrSize); functab: nfunc+1 pairs of u32
        (entry - textStart, offset of the function's record from pclnOffset)
    Go 1.16/1.17 (magic 0xfffffffa): no textStart; functab: nfunc+1 pairs of ptrSize
        (entry, record offset)

A function's record opens with its entry (u32 offset, or an address in the
older layout) and then an int32 offset of its name in the name table. The
last functab pair holds the end of the text, so each function's size is the
next entry minus its own, trailing padding included.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC_GO118 = 0xFFFFFFF0
MAGIC_GO120 = 0xFFFFFFF1
MAGIC_GO116 = 0xFFFFFFFA


class PclntabError(ValueError):
    """The table is absent, of a layout not read here, or truncated."""


@dataclass(frozen=True, slots=True)
class GoFunctionEntry:
    name: str
    entry: int  # virtual address
    size: int  # to the next function's entry


def function_entries(table: bytes, text_start: int, wanted: frozenset[str]) -> dict[str, GoFunctionEntry]:
    """The entries of the functions named in wanted; text_start is the address of the
    .text section, used when the header's own is zero (a position-independent binary)."""
    if len(table) < 8:
        raise PclntabError("function table too short")
    magic = struct.unpack_from("<I", table, 0)[0]
    ptr = table[7]
    if table[4:6] != b"\0\0" or ptr != 8:
        raise PclntabError("function table header is not a 64-bit one")
    word = "<Q"

    def uword(index: int) -> int:
        return struct.unpack_from(word, table, 8 + index * ptr)[0]

    if magic in (MAGIC_GO118, MAGIC_GO120):
        nfunc, header_text = uword(0), uword(2)
        names_at, functab_at = uword(3), uword(7)
        base = header_text or text_start
        pair, entry_of = "<II", (lambda raw: base + raw)
    elif magic == MAGIC_GO116:
        nfunc = uword(0)
        names_at, functab_at = uword(2), uword(6)
        pair, entry_of = "<QQ", (lambda raw: raw)
    else:
        raise PclntabError(f"function table magic {magic:#x} is of a Go release not read here")
    pair_size = struct.calcsize(pair)
    name_field = 8 if magic == MAGIC_GO116 else 4  # after the record's entry: an address, or a u32
    if functab_at + (nfunc + 1) * pair_size > len(table):
        raise PclntabError("function table truncated")
    found: dict[str, GoFunctionEntry] = {}
    try:
        for i in range(nfunc):
            raw_entry, record = struct.unpack_from(pair, table, functab_at + i * pair_size)
            next_entry = struct.unpack_from(pair, table, functab_at + (i + 1) * pair_size)[0]
            name_off = struct.unpack_from("<i", table, functab_at + record + name_field)[0]
            start = names_at + name_off
            name = table[start : table.index(b"\0", start)].decode("utf-8", "replace")
            if name in wanted:
                found[name] = GoFunctionEntry(name, entry_of(raw_entry), next_entry - raw_entry)
                if len(found) == len(wanted):
                    break
    except (struct.error, ValueError) as err:
        raise PclntabError(f"function table unreadable ({err})") from err
    return found
