#!/usr/bin/env python3
"""Generates collector/model/layout_generated.py, the Python mirror of bpf/inferprobe.h.

    python scripts/gen_layout.py            rewrite collector/model/layout_generated.py
    python scripts/gen_layout.py -o FILE    write it elsewhere (the test diffs that)

How: compile a tiny C file that includes the header with the host C compiler
(`cc -g -fno-eliminate-unused-debug-types`, so every type is described even
when nothing uses it) and read the DWARF of the object with pyelftools:
structs (field name, offset, size, array length), enums, and the header's
integer #defines (their names come from `cc -E -dD`; their values are
evaluated by the compiler as enumerators of one extra enum, so an expression
like `(1 << 4)` needs no Python parser).

Why the host compiler's layout is the BPF one: the header uses fixed-width
integer types only, no pointers, no bitfields, explicit padding. With those,
the x86-64 / arm64 LP64 ABIs and the BPF target (what scripts/build_bpf.sh's
clang compiles for) place every field at the same offset: each type is aligned
to its size on all of them. tests/integration/bpf/test_layout_bpf_target.py checks
it against what clang really compiles for the BPF target; this script refuses a
struct with implicit padding (the header's rule) and one whose ctypes mirror
would not land on the DWARF offsets (a packed attribute).

Naming (Python side): struct io_event -> IoEvent; enum event_type -> EventType
with the enumerators' common prefix dropped (EVENT_CONN_OPEN -> CONN_OPEN);
an enumerator ending in _MAX is a sentinel (a table size), not a member, and
stays a module constant under its C name; #defines named <GROUP>_FLAG_<NAME>
become members of an IntFlag class <Group>Flag; every other integer #define
is a module constant under its C name.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "bpf" / "inferprobe.h"
OUTPUT = ROOT / "collector" / "model" / "layout_generated.py"

# Python names that CamelCase of the C name would not give, and prefixes the
# enumerators do not show (an enum of one member has no common prefix).
ENUM_CLASS_NAMES = {"counter_index": "Counter", "stack_counter_index": "StackCounter"}
ENUM_PREFIXES = {"gpu_drm_what": "GPU_DRM_"}

DEFINE_ENUM = "inferprobe_generated_defines"
DEFINE_PREFIX = "INFERPROBE_GENERATED_"

# The typedefs bcc gives BPF programs (u8 ... s64), should the header use them.
BCC_TYPEDEFS = """#include <stdint.h>
typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;
typedef int8_t s8; typedef int16_t s16; typedef int32_t s32; typedef int64_t s64;
"""

CTYPES_INT = {(1, False): "c_uint8", (2, False): "c_uint16", (4, False): "c_uint32", (8, False): "c_uint64",
              (1, True): "c_int8", (2, True): "c_int16", (4, True): "c_int32", (8, True): "c_int64"}
DW_ATE_SIGNED = (0x05, 0x06)  # signed, signed_char
DW_ATE_UNSIGNED = (0x07, 0x08)  # unsigned, unsigned_char


class LayoutError(Exception):
    """The header cannot be mirrored (or the compiler is missing)."""


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    size: int  # of the whole field, array included
    ctype: str  # a ctypes type name, or a struct's Python class name
    count: int  # array length; 0 for a scalar


@dataclass(frozen=True)
class Struct:
    c_name: str
    size: int
    fields: tuple[Field, ...]


@dataclass(frozen=True)
class Enum:
    c_name: str
    members: tuple[tuple[str, int], ...]  # C enumerator names, in declaration order


@dataclass(frozen=True)
class Layout:
    defines: tuple[tuple[str, int], ...]
    enums: tuple[Enum, ...]
    structs: tuple[Struct, ...]


def camel(c_name: str) -> str:
    return "".join(part.capitalize() for part in c_name.lower().split("_") if part)


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise LayoutError("no C compiler (cc or gcc) on this host: the layout of bpf/inferprobe.h "
                          "cannot be read")
    return cc


def header_defines(cc: str, header: Path) -> list[str]:
    """Names of the object-like macros with a value that the header itself defines."""
    source = f'#include "{header.name}"\n'
    out = subprocess.run([cc, "-E", "-dD", f"-I{header.parent}", "-x", "c", "-"], input=source,
                         capture_output=True, text=True, check=True).stdout
    names: list[str] = []
    in_header = False
    for line in out.splitlines():
        marker = re.match(r'# \d+ "([^"]*)"', line)
        if marker:
            in_header = Path(marker.group(1)).name == header.name
            continue
        define = re.match(r"#define ([A-Za-z_]\w*)(\(?)\s*(.*)", line)
        if in_header and define and not define.group(2) and define.group(3).strip():
            names.append(define.group(1))
    return names


def compile_probe(cc: str, header: Path, defines: list[str], workdir: Path) -> Path:
    enumerators = "".join(f"    {DEFINE_PREFIX}{name} = ({name}),\n" for name in defines)
    source = (f'{BCC_TYPEDEFS}#include "{header.name}"\n'
              f"enum {DEFINE_ENUM} {{\n{enumerators}}};\n")
    (workdir / "layout.c").write_text(source)
    obj = workdir / "layout.o"
    subprocess.run([cc, "-g", "-fno-eliminate-unused-debug-types", "-c", f"-I{header.parent}",
                    "-o", str(obj), str(workdir / "layout.c")], check=True, capture_output=True, text=True)
    return obj


def _decl_file_names(cu, dwarf) -> dict[int, str]:
    line_program = dwarf.line_program_for_CU(cu)
    entries = line_program["file_entry"]
    # DWARF 5 numbers files from 0, earlier versions from 1.
    base = 0 if line_program.header["version"] >= 5 else 1
    return {i + base: entry.name.decode() for i, entry in enumerate(entries)}


def _strip_qualifiers(die):
    while die.tag in ("DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type"):
        die = die.get_DIE_from_attribute("DW_AT_type")
    return die


def _field(member) -> Field:
    name = member.attributes["DW_AT_name"].value.decode()
    offset = member.attributes["DW_AT_data_member_location"].value
    if not isinstance(offset, int):
        raise LayoutError(f"field {name}: a location expression, not a constant offset")
    die = _strip_qualifiers(member.get_DIE_from_attribute("DW_AT_type"))
    count = 0
    if die.tag == "DW_TAG_array_type":
        subranges = [c for c in die.iter_children() if c.tag == "DW_TAG_subrange_type"]
        if len(subranges) != 1:
            raise LayoutError(f"field {name}: only one-dimensional arrays are mirrored")
        bounds = subranges[0].attributes
        count = (bounds["DW_AT_count"].value if "DW_AT_count" in bounds
                 else bounds["DW_AT_upper_bound"].value + 1)
        die = _strip_qualifiers(die.get_DIE_from_attribute("DW_AT_type"))
    if die.tag == "DW_TAG_structure_type":
        ctype = camel(die.attributes["DW_AT_name"].value.decode())
        size = die.attributes["DW_AT_byte_size"].value
    elif die.tag in ("DW_TAG_base_type", "DW_TAG_enumeration_type"):
        size = die.attributes["DW_AT_byte_size"].value
        type_name = die.attributes["DW_AT_name"].value.decode() if die.tag == "DW_TAG_base_type" else ""
        encoding = die.attributes["DW_AT_encoding"].value if "DW_AT_encoding" in die.attributes else 0x07
        if type_name == "char":
            ctype = "c_char"  # text (path, model, device name): bytes, not numbers
        elif encoding in DW_ATE_SIGNED or encoding in DW_ATE_UNSIGNED:
            ctype = CTYPES_INT[(size, encoding in DW_ATE_SIGNED)]
        else:
            raise LayoutError(f"field {name}: {type_name} is not a fixed-width integer")
    else:
        raise LayoutError(f"field {name}: {die.tag} (pointers, unions and bitfields are not mirrored)")
    if "DW_AT_bit_size" in member.attributes or "DW_AT_data_bit_offset" in member.attributes:
        raise LayoutError(f"field {name}: a bitfield")
    return Field(name=name, offset=offset, size=size * max(count, 1), ctype=ctype, count=count)


def read_layout(obj: Path, header: Path) -> Layout:
    defines: list[tuple[str, int]] = []
    enums: list[Enum] = []
    structs: list[Struct] = []
    with open(obj, "rb") as f:
        dwarf = ELFFile(f).get_dwarf_info()
        for cu in dwarf.iter_CUs():
            files = _decl_file_names(cu, dwarf)
            for die in cu.get_top_DIE().iter_children():
                if "DW_AT_name" not in die.attributes:
                    continue
                name = die.attributes["DW_AT_name"].value.decode()
                decl = die.attributes.get("DW_AT_decl_file")
                declared_in = Path(files.get(decl.value, "")).name if decl else ""
                if die.tag == "DW_TAG_enumeration_type" and name == DEFINE_ENUM:
                    defines = [(n.removeprefix(DEFINE_PREFIX), v) for n, v in _enumerators(die)]
                elif declared_in != header.name:
                    continue
                elif die.tag == "DW_TAG_enumeration_type":
                    enums.append(Enum(c_name=name, members=tuple(_enumerators(die))))
                elif die.tag == "DW_TAG_structure_type" and "DW_AT_declaration" not in die.attributes:
                    members = [c for c in die.iter_children() if c.tag == "DW_TAG_member"]
                    structs.append(Struct(c_name=name, size=die.attributes["DW_AT_byte_size"].value,
                                          fields=tuple(_field(m) for m in members)))
    return Layout(defines=tuple(defines), enums=tuple(enums), structs=tuple(structs))


def _enumerators(die) -> list[tuple[str, int]]:
    return [(c.attributes["DW_AT_name"].value.decode(), c.attributes["DW_AT_const_value"].value)
            for c in die.iter_children() if c.tag == "DW_TAG_enumerator"]


def member_prefix(enum: Enum, names: list[str]) -> str:
    if enum.c_name in ENUM_PREFIXES:
        return ENUM_PREFIXES[enum.c_name]
    if len(names) < 2:
        raise LayoutError(f"enum {enum.c_name} has one member: name its prefix in ENUM_PREFIXES")
    common = os.path.commonprefix(names)
    return common[: common.rfind("_") + 1]


# ------------------------------------------------------------------ writing

HEAD = '''"""The byte layout of bpf/inferprobe.h, mirrored for Python.

Generated by scripts/gen_layout.py from the DWARF of the header compiled with
the host C compiler; do not edit. After a change to the header run
`python scripts/gen_layout.py`: tests/unit/collector/model/test_layout_generated.py fails
until this file matches the header again.

Decoding lives in collector/model/events.py; this file only says where the bytes are.
"""

import ctypes
import enum
'''


def _ctypes_expr(f: Field) -> str:
    base = f"ctypes.{f.ctype}" if f.ctype.startswith("c_") else f.ctype
    return f"{base} * {f.count}" if f.count else base


def _enum_names(enum: Enum) -> tuple[str, str, list[tuple[str, int]], list[tuple[str, int]]]:
    """(Python class, member prefix, members, _MAX sentinels) of a C enum."""
    members = [(n, v) for n, v in enum.members if not n.endswith("_MAX")]
    sentinels = [(n, v) for n, v in enum.members if n.endswith("_MAX")]
    class_name = ENUM_CLASS_NAMES.get(enum.c_name, camel(enum.c_name))
    return class_name, member_prefix(enum, [n for n, _ in members]), members, sentinels


def _flag_groups(defines: tuple[tuple[str, int], ...]) -> tuple[dict[str, list[tuple[str, int]]],
                                                                list[tuple[str, int]]]:
    """<GROUP>_FLAG_<NAME> defines by group, and the other defines."""
    flags: dict[str, list[tuple[str, int]]] = {}
    constants: list[tuple[str, int]] = []
    for name, value in defines:
        group = re.match(r"([A-Z0-9_]+?)_FLAG_([A-Z0-9_]+)$", name)
        if group:
            flags.setdefault(group.group(1), []).append((group.group(2), value))
        else:
            constants.append((name, value))
    return flags, constants


def _render_enum(enum: Enum) -> list[str]:
    class_name, prefix, members, sentinels = _enum_names(enum)
    out = [f'\n\nclass {class_name}(enum.IntEnum):\n    """enum {enum.c_name}"""\n']
    out += [f"    {n.removeprefix(prefix)} = {v}" for n, v in members]
    if sentinels:
        out.append("\n")
        out += [f"{n} = {v}  # enum {enum.c_name}: table size, not a member" for n, v in sentinels]
    return out


def _render_flags(group: str, members: list[tuple[str, int]]) -> list[str]:
    out = [f'\n\nclass {camel(group)}Flag(enum.IntFlag):\n    """{group}_FLAG_* (#define)"""\n']
    return out + [f"    {n} = {v:#06x}" for n, v in members]


def _render_struct(struct: Struct) -> list[str]:
    padding = f", {tail_padding(struct)} of them tail padding" if tail_padding(struct) else ""
    out = [f"\n\nclass {camel(struct.c_name)}(ctypes.Structure):",
           f'    """struct {struct.c_name}: {struct.size} bytes{padding}"""\n',
           "    _fields_ = ["]
    for f in struct.fields:
        entry = f'        ("{f.name}", {_ctypes_expr(f)}),'
        out.append(f"{entry:<60}# offset {f.offset}, {f.size} byte{'s' if f.size > 1 else ''}")
    return out + ["    ]"]


def render(layout: Layout) -> str:
    flags, constants = _flag_groups(layout.defines)
    out = [HEAD, "# The header's integer #defines."]
    out += [f"{name} = {value}" for name, value in constants]
    for enum in layout.enums:
        out += _render_enum(enum)
    for group, members in flags.items():
        out += _render_flags(group, members)
    prefixes = [_enum_names(e)[:2] for e in layout.enums]
    prefixes += [(f"{camel(group)}Flag", f"{group}_FLAG_") for group in flags]
    out.append("\n\n# The C name of a member above is its class's prefix and its own name.")
    out.append("C_PREFIXES: dict[str, str] = {")
    out += [f'    "{cls}": "{prefix}",' for cls, prefix in prefixes]
    out.append("}")
    for struct in layout.structs:
        out += _render_struct(struct)
    return "\n".join(out) + "\n"


def check_explicit_padding(layout: Layout) -> None:
    """The header's rule: no holes between fields. A hole is padding the BPF
    program never writes (the verifier refuses to copy such stack bytes out)
    and moves every field after it on a compiler that packs otherwise. Tail
    padding is tolerated (struct io_event has 2 bytes of it): the generated
    docstring says how much."""
    for struct in layout.structs:
        end = 0
        for f in struct.fields:
            if f.offset != end:
                raise LayoutError(f"struct {struct.c_name}.{f.name}: {f.offset - end} bytes of implicit "
                                  "padding before it (make them an explicit field)")
            end = f.offset + f.size


def tail_padding(struct: Struct) -> int:
    last = struct.fields[-1]
    return struct.size - last.offset - last.size


def check_mirror(source: str, layout: Layout) -> None:
    """Refuses a mirror whose ctypes layout differs from the compiler's (a
    packed attribute, or a type ctypes aligns otherwise)."""
    namespace: dict = {}
    exec(compile(source, "layout_generated", "exec"), namespace)  # noqa: S102 - our own output
    for struct in layout.structs:
        mirror = namespace[camel(struct.c_name)]
        if ctypes.sizeof(mirror) != struct.size:
            raise LayoutError(f"struct {struct.c_name}: {struct.size} bytes in C, "
                              f"{ctypes.sizeof(mirror)} in ctypes")
        for f in struct.fields:
            if getattr(mirror, f.name).offset != f.offset:
                raise LayoutError(f"struct {struct.c_name}.{f.name}: offset {f.offset} in C, "
                                  f"{getattr(mirror, f.name).offset} in ctypes")


def generate(header: Path = HEADER) -> str:
    cc = compiler()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            obj = compile_probe(cc, header, header_defines(cc, header), Path(tmp))
        except subprocess.CalledProcessError as err:
            raise LayoutError(f"{cc} could not compile {header.name}:\n{err.stderr}") from None
        layout = read_layout(obj, header)
    check_explicit_padding(layout)
    source = render(layout)
    check_mirror(source, layout)
    return source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--header", type=Path, default=HEADER, help=argparse.SUPPRESS)  # for the tests
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT,
                        help=f"default: {OUTPUT.relative_to(ROOT)}")
    args = parser.parse_args()
    try:
        source = generate(args.header)
    except LayoutError as err:
        print(f"gen_layout: {err}", file=sys.stderr)
        return 1
    args.output.write_text(source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
