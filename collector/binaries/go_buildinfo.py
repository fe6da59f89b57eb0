"""The Go toolchain version a binary was built with, from its build info (`.go.buildinfo`).

The Go linker writes a 32-byte header into the binary's data:

    0   14 bytes  magic "\\xff Go buildinf:"
    14  1 byte    pointer size (4 or 8)
    15  1 byte    flags: bit 0 big-endian, bit 1 strings inline

With bit 1 set (Go 1.18 and later) the version string follows the header
inline, as a uvarint length and the bytes, then the module info the same
way. Without it (Go 1.17 and earlier) header bytes 16 and 16+ptrsize hold
the addresses of two Go string headers (pointer, length), the version's
first: reading them means turning a virtual address into a file position.

The section is found by name and, where the section headers were removed,
by the magic on a 16-byte boundary of the file (the linker aligns it so),
which is what Go's own debug/buildinfo does in the data segment.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

MAGIC = b"\xff Go buildinf:"
HEADER_SIZE = 32
FLAG_BIG_ENDIAN = 0x1
FLAG_INLINE_STRINGS = 0x2
MAX_VERSION_LENGTH = 256  # "go1.22.3 X:boringcrypto" and the like are far shorter

_RELEASE = re.compile(r"go(\d+)\.(\d+)")


class BuildInfoError(ValueError):
    """The build info is there but cannot be read: truncated, or pointing outside the file."""


@dataclass(frozen=True, slots=True)
class GoVersion:
    text: str  # as the toolchain wrote it: "go1.19.8", "devel go1.23-0a1b2c ...", "go1.21.0 X:boringcrypto"
    major: int
    minor: int

    @property
    def release(self) -> tuple[int, int]:
        return self.major, self.minor


def parse_version(text: str) -> GoVersion | None:
    """The release a version string names; None for a string naming none."""
    m = _RELEASE.search(text)
    return GoVersion(text, int(m.group(1)), int(m.group(2))) if m else None


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the unsigned LEB128 varint at pos."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise BuildInfoError("build info: varint runs past its data")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def version_from_header(blob: bytes, read_at: Callable[[int, int], bytes] | None = None) -> str:
    """The version string of the build info at the start of blob.

    blob holds the header and (inline layout) what follows it; read_at(vaddr,
    size) reads the binary's memory image, needed for the pointer layout only.
    """
    if len(blob) < HEADER_SIZE or not blob.startswith(MAGIC):
        raise BuildInfoError("build info: no '\\xff Go buildinf:' header")
    ptr_size, flags = blob[14], blob[15]
    if flags & FLAG_INLINE_STRINGS:
        length, pos = _uvarint(blob, HEADER_SIZE)
        if length > MAX_VERSION_LENGTH or pos + length > len(blob):
            raise BuildInfoError("build info: version string runs past its data")
        return blob[pos : pos + length].decode("utf-8", "replace")
    if ptr_size not in (4, 8):
        raise BuildInfoError(f"build info: pointer size {ptr_size}")
    if read_at is None:
        raise BuildInfoError("build info: pointer layout but no way to read the memory image")
    order: Literal["big", "little"] = "big" if flags & FLAG_BIG_ENDIAN else "little"

    def pointer(raw: bytes) -> int:
        if len(raw) != ptr_size:
            raise BuildInfoError("build info: pointer outside the file")
        return int.from_bytes(raw, order)

    string_header = pointer(blob[16 : 16 + ptr_size])
    data_ptr = pointer(read_at(string_header, ptr_size))
    length = pointer(read_at(string_header + ptr_size, ptr_size))
    if length > MAX_VERSION_LENGTH:
        raise BuildInfoError("build info: implausible version length")
    text = read_at(data_ptr, length)
    if len(text) != length:
        raise BuildInfoError("build info: version string outside the file")
    return text.decode("utf-8", "replace")


def find_header(image: bytes | mmap.mmap, section_offset: int | None) -> int | None:
    """File position of the build info header: the section's when known, else the
    first 16-byte-aligned magic in the file."""
    if section_offset is not None:
        return section_offset if image[section_offset : section_offset + len(MAGIC)] == MAGIC else None
    pos = image.find(MAGIC)
    while pos >= 0 and pos % 16:
        pos = image.find(MAGIC, pos + 1)
    return pos if pos >= 0 else None
