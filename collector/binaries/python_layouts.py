"""Where CPython keeps what a stack walk reads, per interpreter version.

3.13 publishes its own offsets: `_PyRuntime` opens with a `_Py_DebugOffsets`
block (cookie "xdebugpy", the version as PY_VERSION_HEX, then groups of
uint64 offsets, each group opening with its struct's size). Those are read
from the live process (from_debug_offsets()), so a 3.13.x build with a
different layout still walks right.

3.10, 3.11 and 3.12 publish nothing, so TABLE holds their offsets, taken
with offsetof() from each version's own headers (internal/pycore_*.h; the
unit test tests/unit/collector/binaries/test_python_layouts.py recompiles that where
the headers are installed and compares). Within a minor version these
structs do not change (CPython keeps them stable for debuggers), but a
table is only trusted after it is checked against the live process
(collector/binaries/python_threads.py walks the thread list with it and requires
every thread state to name one of the process's real threads).

Versions outside 3.10-3.13 (3.14 changed the frame and string layouts
again; 3.9 and older have no PEP 626 line table in this form) are refused
with a reason, never walked with a guess.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

DEBUG_COOKIE = b"xdebugpy"
SUPPORTED = ((3, 10), (3, 11), (3, 12), (3, 13))


@dataclass(frozen=True)
class PythonLayout:
    """Byte offsets inside one CPython version's structs (None: no such field)."""

    version: tuple[int, int]
    runtime_interpreters_head: int
    interp_next: int
    interp_threads_head: int
    tstate_next: int
    tstate_thread_id: int  # pthread_t of the thread
    tstate_native_thread_id: int | None  # kernel tid (3.11+)
    tstate_frame: int  # -> current frame, or -> cframe where cframe_frame is set
    cframe_frame: int | None  # _PyCFrame -> current frame (3.11, 3.12)
    frame_previous: int
    frame_code: int
    frame_instr: int  # 3.10: int f_lasti; 3.11+: pointer to a code unit
    frame_entry: int | None  # 3.11: bool is_entry; 3.12+: char owner; 3.10: none
    code_filename: int
    code_name: int
    code_qualname: int | None  # 3.11+
    code_firstlineno: int
    code_linetable: int
    code_adaptive: int | None  # 3.11+: first code unit, inside the code object
    unicode_state: int = 32
    unicode_length: int = 16
    unicode_ascii_size: int = 48
    unicode_compact_size: int = 72
    bytes_size: int = 16
    bytes_data: int = 32

    @property
    def entry_kind(self) -> str:
        """How the frames of one C call of the eval loop are told apart."""
        return {(3, 10): "every-frame", (3, 11): "is-entry"}.get(self.version, "owner-shim")

    @property
    def frame_read(self) -> int:
        """Bytes of a frame the BPF walk reads at once: every field it takes."""
        fields = [self.frame_previous, self.frame_code, self.frame_instr, self.frame_entry or 0]
        return max(fields) + 8


TABLE: dict[tuple[int, int], PythonLayout] = {
    (3, 10): PythonLayout(
        (3, 10), runtime_interpreters_head=32, interp_next=0, interp_threads_head=8,
        tstate_next=8, tstate_thread_id=176, tstate_native_thread_id=None,
        tstate_frame=24, cframe_frame=None,
        frame_previous=24, frame_code=32, frame_instr=96, frame_entry=None,
        code_filename=104, code_name=112, code_qualname=None, code_firstlineno=40, code_linetable=120,
        code_adaptive=None),
    (3, 11): PythonLayout(
        (3, 11), runtime_interpreters_head=40, interp_next=0, interp_threads_head=16,
        tstate_next=8, tstate_thread_id=152, tstate_native_thread_id=160,
        tstate_frame=56, cframe_frame=8,
        frame_previous=48, frame_code=32, frame_instr=56, frame_entry=68,
        code_filename=112, code_name=120, code_qualname=128, code_firstlineno=72, code_linetable=136,
        code_adaptive=184),
    (3, 12): PythonLayout(
        (3, 12), runtime_interpreters_head=40, interp_next=0, interp_threads_head=72,
        tstate_next=8, tstate_thread_id=136, tstate_native_thread_id=144,
        tstate_frame=56, cframe_frame=0,
        frame_previous=8, frame_code=0, frame_instr=56, frame_entry=70,
        code_filename=112, code_name=120, code_qualname=128, code_firstlineno=68, code_linetable=136,
        code_adaptive=192, unicode_ascii_size=40, unicode_compact_size=56),
    # 3.13 reads its own _Py_DebugOffsets; this row is what 3.13.0 publishes, kept
    # to check the reader against (tests) and for a runtime whose block is unreadable.
    (3, 13): PythonLayout(
        (3, 13), runtime_interpreters_head=632, interp_next=7264, interp_threads_head=7344,
        tstate_next=8, tstate_thread_id=152, tstate_native_thread_id=160,
        tstate_frame=72, cframe_frame=None,
        frame_previous=8, frame_code=0, frame_instr=56, frame_entry=70,
        code_filename=112, code_name=120, code_qualname=128, code_firstlineno=68, code_linetable=136,
        code_adaptive=200, unicode_ascii_size=40, unicode_compact_size=56),
}

# _Py_DebugOffsets of 3.13, in declaration order after cookie, version and
# free_threaded: (group, fields). Every group's first field is its struct's size.
DEBUG_GROUPS_3_13 = (
    ("runtime_state", ("size", "finalizing", "interpreters_head")),
    ("interpreter_state", ("size", "id", "next", "threads_head", "gc", "imports_modules", "sysdict",
                           "builtins", "ceval_gil", "gil_runtime_state", "gil_runtime_state_enabled",
                           "gil_runtime_state_locked", "gil_runtime_state_holder")),
    ("thread_state", ("size", "prev", "next", "interp", "current_frame", "thread_id", "native_thread_id",
                      "datastack_chunk", "status")),
    ("interpreter_frame", ("size", "previous", "executable", "instr_ptr", "localsplus", "owner")),
    ("code_object", ("size", "filename", "name", "qualname", "linetable", "firstlineno", "argcount",
                     "localsplusnames", "localspluskinds", "co_code_adaptive")),
    ("pyobject", ("size", "ob_type")),
    ("type_object", ("size", "tp_name", "tp_repr", "tp_flags")),
    ("tuple_object", ("size", "ob_item", "ob_size")),
    ("list_object", ("size", "ob_item", "ob_size")),
    ("dict_object", ("size", "ma_keys", "ma_values")),
    ("float_object", ("size", "ob_fval")),
    ("long_object", ("size", "lv_tag", "ob_digit")),
    ("bytes_object", ("size", "ob_size", "ob_sval")),
    ("unicode_object", ("size", "state", "length", "asciiobject_size")),
)
DEBUG_OFFSETS_BYTES = 24 + 8 * sum(len(fields) for _, fields in DEBUG_GROUPS_3_13)


class LayoutProblem(Exception):
    """This interpreter cannot be walked: the sentence says why."""


def version_of_hex(hexversion: int) -> tuple[int, int]:
    return (hexversion >> 24) & 0xFF, (hexversion >> 16) & 0xFF


def from_debug_offsets(block: bytes) -> PythonLayout:
    """The layout a 3.13 runtime publishes in the _Py_DebugOffsets block at the start of _PyRuntime."""
    if len(block) < DEBUG_OFFSETS_BYTES or block[:8] != DEBUG_COOKIE:
        raise LayoutProblem("_PyRuntime does not start with CPython's debug offsets (cookie xdebugpy)")
    hexversion, free_threaded = struct.unpack_from("<QQ", block, 8)
    version = version_of_hex(hexversion)
    if version != (3, 13):
        raise LayoutProblem(f"debug offsets of CPython {version[0]}.{version[1]}: only 3.13's form is known")
    if free_threaded:
        raise LayoutProblem("a free-threaded (no-GIL) build: its frames are not walked")
    values = struct.unpack_from(f"<{(DEBUG_OFFSETS_BYTES - 24) // 8}Q", block, 24)
    off: dict[str, int] = {}
    i = 0
    for group, fields in DEBUG_GROUPS_3_13:
        for name in fields:
            off[f"{group}.{name}"] = values[i]
            i += 1
    return replace(
        TABLE[(3, 13)],
        runtime_interpreters_head=off["runtime_state.interpreters_head"],
        interp_next=off["interpreter_state.next"],
        interp_threads_head=off["interpreter_state.threads_head"],
        tstate_next=off["thread_state.next"],
        tstate_thread_id=off["thread_state.thread_id"],
        tstate_native_thread_id=off["thread_state.native_thread_id"],
        tstate_frame=off["thread_state.current_frame"],
        frame_previous=off["interpreter_frame.previous"],
        frame_code=off["interpreter_frame.executable"],
        frame_instr=off["interpreter_frame.instr_ptr"],
        frame_entry=off["interpreter_frame.owner"],
        code_filename=off["code_object.filename"],
        code_name=off["code_object.name"],
        code_qualname=off["code_object.qualname"],
        code_firstlineno=off["code_object.firstlineno"],
        code_linetable=off["code_object.linetable"],
        code_adaptive=off["code_object.co_code_adaptive"],
        unicode_state=off["unicode_object.state"],
        unicode_length=off["unicode_object.length"],
        unicode_ascii_size=off["unicode_object.asciiobject_size"],
        bytes_size=off["bytes_object.ob_size"],
        bytes_data=off["bytes_object.ob_sval"],
    )


def table_layout(version: tuple[int, int]) -> PythonLayout:
    if version not in TABLE:
        raise LayoutProblem(f"CPython {version[0]}.{version[1]} is not supported (supported: "
                            + ", ".join(f"{a}.{b}" for a, b in SUPPORTED) + ")")
    return TABLE[version]
