"""The generated layout is the one clang compiles for the BPF target.

collector/model/layout_generated.py is read from the host compiler's DWARF; the
BPF programs are compiled by clang for the BPF target (scripts/build_bpf.sh).
For fixed-width fields the two lay structs out alike (scripts/gen_layout.py says
why); this checks it with the compiler the build uses. Each size and offset is
an element of a constant array that clang computes for the BPF target, read
back from the object's .rodata; nothing runs in the kernel.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
from elftools.elf.elffile import ELFFile

from inferprobe.collector.attach.built_objects import BPF_DIR
from inferprobe.collector.model import layout_generated

pytestmark = [pytest.mark.bpf]

CLANG = shutil.which("clang-14") or shutil.which("clang")

STRUCTS = {
    (cls.__doc__ or "").split(":")[0].removeprefix("struct "): cls
    for cls in vars(layout_generated).values()
    if isinstance(cls, type) and issubclass(cls, ctypes.Structure) and cls is not ctypes.Structure
}


def _measures() -> dict[str, str]:
    """Name -> the C expression it measures."""
    out = {}
    for name, cls in STRUCTS.items():
        out[f"size__{name}"] = f"sizeof(struct {name})"
        for field, _ in cls._fields_:
            out[f"off__{name}__{field}"] = f"__builtin_offsetof(struct {name}, {field})"
    return out


@pytest.fixture(scope="module")
def bpf_layout(tmp_path_factory) -> dict[str, int]:
    if CLANG is None:
        pytest.skip("clang is not installed (scripts/build_bpf.sh needs it too: apt-get install clang-14)")
    measures = _measures()
    directory = tmp_path_factory.mktemp("layout")
    source, obj = directory / "layout.c", directory / "layout.o"
    # As bpf/common.bpf.h includes them: vmlinux.h has a struct io_event of its own (aio).
    source.write_text('#define io_event vmlinux_io_event\n#include "vmlinux.h"\n#undef io_event\n'
                      '#include "inferprobe.h"\n'
                      "const volatile unsigned long long measures[] = {\n"
                      + ",\n".join(f"    {expr}" for expr in measures.values()) + "\n};\n")
    subprocess.run([CLANG, "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86", f"-I{BPF_DIR / 'build'}",
                    f"-I{BPF_DIR}", "-c", str(source), "-o", str(obj)], check=True)
    with open(obj, "rb") as f:
        data = ELFFile(f).get_section_by_name(".rodata").data()
    values = memoryview(data).cast("Q")
    assert len(values) == len(measures)
    return dict(zip(measures, values, strict=True))


def test_every_struct_is_checked():
    assert {"event_header", "io_event", "gpu_call_event", "futex_wait_event"} <= set(STRUCTS)


@pytest.mark.parametrize("name", list(STRUCTS))
def test_clang_for_the_bpf_target_lays_the_struct_out_as_the_generated_mirror(bpf_layout, name):
    cls = STRUCTS[name]
    assert bpf_layout[f"size__{name}"] == ctypes.sizeof(cls)
    for field, _ in cls._fields_:
        assert bpf_layout[f"off__{name}__{field}"] == getattr(cls, field).offset, field
