"""The generated layout is the one bcc compiles for the BPF target.

collector/model/layout_generated.py is read from the host compiler's DWARF; the
BPF programs are compiled by bcc's clang for the BPF target. For fixed-width
fields the two lay structs out alike (scripts/gen_layout.py says why); this
checks it where bcc runs. Each size and offset becomes the length of an
array map, a number clang computes at compile time for the BPF target and
the kernel reports back (max_entries); nothing runs in the kernel.
"""

from __future__ import annotations

import ctypes

import pytest

from inferprobe.collector.attach.loader import BPF_DIR
from inferprobe.collector.model import layout_generated

from tests.support.kernel import needs_root

pytestmark = [needs_root, pytest.mark.bpf]

bcc = pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not installed")

STRUCTS = {
    (cls.__doc__ or "").split(":")[0].removeprefix("struct "): cls
    for cls in vars(layout_generated).values()
    if isinstance(cls, type) and issubclass(cls, ctypes.Structure) and cls is not ctypes.Structure
}


def _measures() -> dict[str, str]:
    """Map name -> the C expression its length measures."""
    out = {}
    for name, cls in STRUCTS.items():
        out[f"size__{name}"] = f"sizeof(struct {name})"
        for field, _ in cls._fields_:
            out[f"off__{name}__{field}"] = f"offsetof(struct {name}, {field})"
    return out


@pytest.fixture(scope="module")
def bpf_layout() -> dict[str, int]:
    measures = _measures()
    # A map of 0 entries is refused: every length is the number plus one.
    text = '#include "inferprobe.h"\n' + "\n".join(
        f"BPF_ARRAY({map_name}, u8, {expr} + 1);" for map_name, expr in measures.items())
    b = bcc.BPF(text=text.encode(), cflags=[f"-I{BPF_DIR}"])
    try:
        return {map_name: b.get_table(map_name.encode()).max_entries - 1 for map_name in measures}
    finally:
        b.cleanup()


def test_every_struct_is_checked():
    assert {"event_header", "io_event", "gpu_call_event", "futex_wait_event"} <= set(STRUCTS)


@pytest.mark.parametrize("name", list(STRUCTS))
def test_bcc_lays_the_struct_out_as_the_generated_mirror(bpf_layout, name):
    cls = STRUCTS[name]
    assert bpf_layout[f"size__{name}"] == ctypes.sizeof(cls)
    for field, _ in cls._fields_:
        assert bpf_layout[f"off__{name}__{field}"] == getattr(cls, field).offset, field
