"""Python frames by name: a code object's function, file and line, read from the live process.

The BPF walk sends each frame as (code object address, instruction field);
this module reads the code object once per (process, address), from
/proc/PID/mem, with the layout of that process's interpreter: co_qualname
(co_name on 3.10), co_filename, co_firstlineno and co_linetable, and finds
the line of the instruction in the line table:

- 3.10 (PEP 626): pairs of (byte-offset delta, signed line delta), each a
  range of bytecode; a line delta of -128 is "no line" for that range.
- 3.11+ (the location table, Objects/locations.md in CPython): entries of
  1-8 code units, each opening with a byte 1cccclll (code c, length l+1);
  c 15 no location, 14 long form (signed varint line delta, then end line,
  column, end column varints), 13 no column (signed varint line delta),
  10-12 one-line forms (line delta c-10, two column bytes), 0-9 short form
  (same line, one column byte). Varints are 6-bit groups, 0x40 meaning more.

A code object freed and its address reused by another one between the
sample and the resolution would be named as the new one; resolution runs at
stop while the targets still run, and code objects of running functions are
alive then.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from inferprobe.collector.binaries.python_layouts import PythonLayout
from inferprobe.collector.binaries.python_threads import ProcessMemory

MAX_NAME_CHARS = 512
MAX_LINETABLE_BYTES = 1 << 20


@dataclass(frozen=True)
class CodeInfo:
    name: str
    filename: str
    firstlineno: int
    linetable: bytes


@dataclass(frozen=True)
class PythonFrame:
    name: str
    filename: str
    line: int | None

    @property
    def label(self) -> str:
        """The flame-graph frame: py::NAME:FILE:LINE (the perf-trampoline form, with the line)."""
        line = f":{self.line}" if self.line is not None else ""
        return f"py::{self.name}:{self.filename}{line}".replace(";", ":")


def line_of_310(table: bytes, firstlineno: int, byte_offset: int) -> int | None:
    line = firstlineno
    end = 0
    for i in range(0, len(table) - 1, 2):
        sdelta, ldelta = table[i], struct.unpack_from("b", table, i + 1)[0]
        start, end = end, end + sdelta
        if ldelta != -128:
            line += ldelta
        if start <= byte_offset < end:
            return None if ldelta == -128 else line
    return None


def _varint(table: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while i < len(table):
        b = table[i]
        i += 1
        value |= (b & 0x3F) << shift
        shift += 6
        if not b & 0x40:
            break
    return value, i


def _svarint(table: bytes, i: int) -> tuple[int, int]:
    value, i = _varint(table, i)
    return (-(value >> 1) if value & 1 else value >> 1), i


def line_of_311(table: bytes, firstlineno: int, unit: int) -> int | None:
    line = firstlineno
    pos = 0  # code units covered so far
    i = 0
    while i < len(table):
        head = table[i]
        i += 1
        code, length = (head >> 3) & 15, (head & 7) + 1
        entry_line: int | None = line
        if code == 15:
            entry_line = None
        elif code == 14:
            delta, i = _svarint(table, i)
            line += delta
            entry_line = line
            for _ in range(3):
                _, i = _varint(table, i)
        elif code == 13:
            delta, i = _svarint(table, i)
            line += delta
            entry_line = line
        elif code >= 10:
            line += code - 10
            entry_line = line
            i += 2
        else:
            i += 1
        if pos <= unit < pos + length:
            return entry_line
        pos += length
    return None


class CodeResolver:
    """Names the frames of one process; keeps each code object it read."""

    def __init__(self, memory: ProcessMemory, layout: PythonLayout):
        self.memory = memory
        self.layout = layout
        self._codes: dict[int, CodeInfo | None] = {}

    def _string(self, addr: int) -> str | None:
        lay, mem = self.layout, self.memory
        head = mem.read(addr + lay.unicode_length, 8)
        state_bytes = mem.read(addr + lay.unicode_state, 4)
        if len(head) != 8 or len(state_bytes) != 4:
            return None
        length = min(struct.unpack("<q", head)[0], MAX_NAME_CHARS)
        state = struct.unpack("<I", state_bytes)[0]
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if length < 0 or not compact or kind not in (1, 2, 4):
            return None
        data_at = addr + (lay.unicode_ascii_size if ascii_ else lay.unicode_compact_size)
        data = mem.read(data_at, length * kind)
        if len(data) != length * kind:
            return None
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        return data.decode(codec, errors="replace")

    def _bytes(self, addr: int) -> bytes | None:
        lay, mem = self.layout, self.memory
        size = mem.u64(addr + lay.bytes_size)
        if size is None or size > MAX_LINETABLE_BYTES:
            return None
        data = mem.read(addr + lay.bytes_data, size)
        return data if len(data) == size else None

    def code(self, addr: int) -> CodeInfo | None:
        if addr in self._codes:
            return self._codes[addr]
        lay, mem = self.layout, self.memory
        info = None
        name_ptr = mem.u64(addr + (lay.code_qualname if lay.code_qualname is not None else lay.code_name))
        file_ptr = mem.u64(addr + lay.code_filename)
        table_ptr = mem.u64(addr + lay.code_linetable)
        first = mem.read(addr + lay.code_firstlineno, 4)
        if name_ptr and file_ptr and table_ptr and len(first) == 4:
            name, filename, table = self._string(name_ptr), self._string(file_ptr), self._bytes(table_ptr)
            if name is not None and filename is not None and table is not None:
                info = CodeInfo(name, filename, struct.unpack("<i", first)[0], table)
        self._codes[addr] = info
        return info

    def instruction_offset(self, code: int, instr: int) -> int | None:
        """Byte offset of the frame's instruction in its bytecode, from the raw instruction field."""
        lay = self.layout
        if lay.code_adaptive is None:  # 3.10: f_lasti, an index of 2-byte code units
            lasti = struct.unpack("<i", struct.pack("<I", instr & 0xFFFFFFFF))[0]
            return lasti * 2 if lasti >= 0 else None
        offset = instr - (code + lay.code_adaptive)
        return offset if 0 <= offset < (1 << 26) else None

    def frame(self, code: int, instr: int) -> PythonFrame | None:
        """The frame, or None when the address holds no readable code object."""
        info = self.code(code)
        if info is None:
            return None
        offset = self.instruction_offset(code, instr)
        line = None
        if offset is not None:
            if self.layout.code_adaptive is None:
                line = line_of_310(info.linetable, info.firstlineno, offset)
            else:
                line = line_of_311(info.linetable, info.firstlineno, offset // 2)
        return PythonFrame(info.name, info.filename, line)
