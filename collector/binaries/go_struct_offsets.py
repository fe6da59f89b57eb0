"""Where a Go binary keeps a *tls.Conn's socket fd: struct offsets from its DWARF, or a table.

The kernel goes from the receiver of crypto/tls.(*Conn).Read/Write to the
socket under it in five reads (amd64):

    c := *tls.Conn                          (RAX at the entry)
    iface := c + Conn.conn                  net.Conn, an interface: {itab, data}
    tcp := *(iface + iface.data)            *net.TCPConn (the usual concrete type)
    nfd := *(tcp + TCPConn.conn + conn.fd)  *net.netFD (TCPConn embeds net.conn)
    fd := *(nfd + netFD.pfd + FD.Sysfd)     int

The data pointer is taken without checking the itab: a tls.Conn over
something other than a *net.TCPConn (a wrapped conn, a unix socket's
*net.UnixConn, which embeds the same net.conn) yields either the same chain or
a value the kernel finds no socket for; the kernel side checks the fd
against the process's sockets.

Offsets come from the binary's DWARF (Go writes it unless linked with -w):
every Go type is a DW_TAG_structure_type named by its import path
("crypto/tls.Conn", "internal/poll.FD") in one compilation unit. Without
DWARF, FALLBACK_TABLE gives them by Go release; it holds only releases whose
structs these fields were read from, and a test checks it against the DWARF
of the Go on the test host.
"""

from __future__ import annotations

from dataclasses import dataclass

from elftools.common.exceptions import DWARFError, ELFError
from elftools.dwarf.dwarfinfo import DWARFInfo
from elftools.elf.elffile import ELFFile

# (type, member) for each step; "runtime.iface" is how Go's DWARF spells a non-empty interface's layout.
MEMBERS = {
    "tls_conn_conn": ("crypto/tls.Conn", "conn"),
    "iface_data": ("runtime.iface", "data"),
    "tcp_conn_conn": ("net.TCPConn", "conn"),
    "conn_fd": ("net.conn", "fd"),
    "netfd_pfd": ("net.netFD", "pfd"),
    "pfd_sysfd": ("internal/poll.FD", "Sysfd"),
}
TYPES = frozenset(t for t, _m in MEMBERS.values())


@dataclass(frozen=True, slots=True)
class ConnFdOffsets:
    """Byte offsets of each step from a *tls.Conn to its socket fd (see the module docstring)."""

    tls_conn_conn: int  # crypto/tls.Conn.conn: the net.Conn interface
    iface_data: int  # an interface's data pointer (after its itab)
    tcp_conn_conn: int  # net.TCPConn's embedded net.conn
    conn_fd: int  # net.conn.fd: *net.netFD
    netfd_pfd: int  # net.netFD.pfd: internal/poll.FD
    pfd_sysfd: int  # internal/poll.FD.Sysfd: the fd
    source: str  # "dwarf" (read from this binary) or "table" (FALLBACK_TABLE, by Go release)


# Same in every release listed: tls.Conn opens with `conn net.Conn`, net.TCPConn with its
# embedded `conn`, net.conn with `fd *netFD`, netFD with `pfd poll.FD`, and poll.FD with
# `fdmu fdMutex` (a uint64 and two uint32s: 16 bytes) before `Sysfd int`.
_GO_117_TO_124 = dict(tls_conn_conn=0, iface_data=8, tcp_conn_conn=0, conn_fd=0, netfd_pfd=0, pfd_sysfd=16)
FALLBACK_TABLE: dict[tuple[int, int], dict[str, int]] = {
    (1, minor): _GO_117_TO_124 for minor in range(17, 25)
}


def table_offsets(release: tuple[int, int]) -> ConnFdOffsets | None:
    entry = FALLBACK_TABLE.get(release)
    return ConnFdOffsets(**entry, source="table") if entry else None


def _member_offsets(die) -> dict[str, int]:
    found = {}
    for child in die.iter_children():
        if child.tag != "DW_TAG_member":
            continue
        name = child.attributes.get("DW_AT_name")
        loc = child.attributes.get("DW_AT_data_member_location")
        if name is not None and loc is not None and isinstance(loc.value, int):
            found[name.value.decode()] = loc.value
    return found


def structs_by_name(dwarf: DWARFInfo) -> dict[str, dict[str, int]]:
    """The wanted structs found by their names in the raw .debug_info: Go writes a type's
    name inline (DW_FORM_string) right after the DIE's abbreviation code, so a DIE
    starts a byte or two before each place its name is. Each guess is parsed and kept
    only when it is a struct of that exact name. Five times faster than walking
    every type with pyelftools (0.3 s against 1.5 s for a 43 MB binary)."""
    section = dwarf.debug_info_sec
    if section is None:
        return {}
    section.stream.seek(0)
    data = section.stream.read()
    structs: dict[str, dict[str, int]] = {}
    for type_name in TYPES:
        needle = type_name.encode() + b"\0"
        pos = data.find(needle)
        while pos >= 0 and type_name not in structs:
            for code_length in (1, 2):  # abbreviation codes under 128, then under 16384
                try:
                    die = dwarf.get_DIE_from_refaddr(pos - code_length)
                except Exception:  # a guessed offset: pyelftools raises what it meets in the bytes there
                    continue
                name = die.attributes.get("DW_AT_name")
                if die.tag == "DW_TAG_structure_type" and name is not None and name.value == needle[:-1]:
                    structs[type_name] = _member_offsets(die)
                    break
            pos = data.find(needle, pos + 1)
    return structs


def _unit_name(cu) -> str:
    name = cu.get_top_DIE().attributes.get("DW_AT_name")
    return name.value.decode() if name is not None else ""


def structs_by_walk(dwarf: DWARFInfo) -> dict[str, dict[str, int]]:
    """The wanted structs found by walking the type DIEs: for DWARF whose names are not inline."""
    structs: dict[str, dict[str, int]] = {}
    # Go's linker writes every type into a unit named "runtime": look there first, then anywhere.
    units = sorted(dwarf.iter_CUs(), key=lambda cu: _unit_name(cu) != "runtime")
    for cu in units:
        # Types are children of their unit's top DIE; not descending into functions keeps this fast.
        for die in cu.get_top_DIE().iter_children():
            if die.tag != "DW_TAG_structure_type":
                continue
            name = die.attributes.get("DW_AT_name")
            type_name = name.value.decode() if name is not None else ""
            if type_name in TYPES and type_name not in structs:
                structs[type_name] = _member_offsets(die)
        if len(structs) == len(TYPES):
            break
    return structs


def dwarf_offsets(elf: ELFFile) -> ConnFdOffsets | str:
    """The offsets from elf's DWARF; a reason string when there is none or a member is missing."""
    if not elf.has_dwarf_info() or elf.get_section_by_name(".debug_info") is None:
        return "no DWARF (linked with -w)"
    try:
        structs = structs_by_name(elf.get_dwarf_info())
        if len(structs) < len(TYPES):
            structs = structs_by_walk(elf.get_dwarf_info())  # a fresh reader: no guessed DIEs cached
    except (DWARFError, ELFError, ValueError, KeyError) as err:
        return f"its DWARF could not be read ({err})"
    offsets = {}
    for field_name, (type_name, member) in MEMBERS.items():
        if member not in structs.get(type_name, {}):
            return f"its DWARF has no {type_name}.{member}"
        offsets[field_name] = structs[type_name][member]
    return ConnFdOffsets(**offsets, source="dwarf")
