"""Contract: collector/events.py decodes exactly what bpf/inferprobe.h lays out.

Compiles a small C program that includes the header with the host compiler
and prints sizes, offsets and enum values; compares them with the ctypes
mirrors. Needs no root.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from inferprobe.collector import events
from inferprobe.collector.loader import BPF_DIR

CC = shutil.which("cc") or shutil.which("gcc")

STRUCTS = {
    "event_header": events.EventHeader,
    "conn_event": events.ConnEvent,
    "io_event": events.IoEvent,
    "usdt_event": events.UsdtEvent,
    "stack_key": events.StackKey,
    "offcpu_value": events.OffcpuValue,
    "stack_sample_event": events.StackSampleEvent,
    "net_xmit_event": events.NetXmitEvent,
    "net_ack_event": events.NetAckEvent,
    "net_retransmit_event": events.NetRetransmitEvent,
    "futex_wait_event": events.FutexWaitEvent,
    "offcpu_event": events.OffcpuEvent,
    "gpu_call_event": events.GpuCallEvent,
    "gpu_launches_event": events.GpuLaunchesEvent,
    "gpu_fence_event": events.GpuFenceEvent,
    "gpu_drm_event": events.GpuDrmEvent,
}

# Every member of these Python enums must exist in the header under
# PREFIX + member name, with the same value; a member added on one side
# only fails the test.
ENUM_PREFIXES = {
    "EVENT_": events.EventType,
    "HTTP_KIND_": events.HttpKind,
    "HTTP_FLAG_": events.HttpFlag,
    "COUNTER_": events.Counter,
    "USDT_": events.UsdtProbe,
    "STACK_COUNTER_": events.StackCounter,
    "NET_VIA_": events.NetVia,
    "NET_FLAG_": events.NetFlag,
    "FUTEX_WAIT_FLAG_": events.FutexWaitFlag,
    "OFFCPU_": events.OffcpuReason,
    "LOCK_COUNTER_": events.LockCounter,
    "GPU_FN_": events.GpuFunction,
    "GPU_COPY_": events.GpuCopyKind,
    "GPU_FLUSH_": events.GpuFlushReason,
    "GPU_DRM_": events.GpuDrmWhat,
}

ENUMS = {
    **{prefix + member.name: member for prefix, enum in ENUM_PREFIXES.items() for member in enum},
    **{f"HTTP_METHOD_{m.name}": m for m in events.HttpMethod if m.name != "UNKNOWN"},
    "COUNTER_MAX": events.COUNTER_MAX,
    "USDT_MAX_ARGS": events.USDT_MAX_ARGS,
    "STACK_COUNTER_MAX": events.STACK_COUNTER_MAX,
    "STACK_FLAG_PREEMPTED": events.STACK_FLAG_PREEMPTED,
    "GPU_FN_MAX": events.GPU_FN_MAX,
    "INFERPROBE_LAYOUT_VERSION": events.LAYOUT_VERSION,
    "PATH_MAX_BYTES": events.PATH_MAX_BYTES,
    "NET_DEV_NAME_BYTES": events.NET_DEV_NAME_BYTES,
    "LOCK_SCAN_HITS": events.LOCK_SCAN_HITS,
    "LOCK_COUNTER_MAX": events.LOCK_COUNTER_MAX,
}


def _c_program() -> str:
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "inferprobe.h"',
             "int main(void) {"]
    for name, struct in STRUCTS.items():
        lines.append(f'printf("sizeof {name} %zu\\n", sizeof(struct {name}));')
        for field, _ in struct._fields_:
            lines.append(f'printf("offsetof {name}.{field} %zu\\n", offsetof(struct {name}, {field}));')
    for name in ENUMS:
        lines.append(f'printf("value {name} %lld\\n", (long long){name});')
    lines.append("return 0; }")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory) -> dict[str, int]:
    if CC is None:
        pytest.skip("no C compiler on this host: the layout contract cannot be checked")
    d = tmp_path_factory.mktemp("layout")
    (d / "layout.c").write_text(_c_program())
    subprocess.run([CC, f"-I{BPF_DIR}", "-o", str(d / "layout"), str(d / "layout.c")], check=True)
    out = subprocess.run([str(d / "layout")], capture_output=True, text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        kind, name, value = line.split()
        result[f"{kind} {name}"] = int(value)
    return result


@pytest.mark.parametrize("name", list(STRUCTS))
def test_struct_sizes_and_offsets_match(c_layout, name):
    struct = STRUCTS[name]
    assert ctypes.sizeof(struct) == c_layout[f"sizeof {name}"]
    for field, _ in struct._fields_:
        assert getattr(struct, field).offset == c_layout[f"offsetof {name}.{field}"], field


@pytest.mark.parametrize("name", list(ENUMS))
def test_enum_values_match(c_layout, name):
    assert int(ENUMS[name]) == c_layout[f"value {name}"]


def test_decode_rejects_short_and_unknown_events():
    with pytest.raises(events.DecodeError):
        events.decode(b"\x03\x00")
    with pytest.raises(events.DecodeError):
        events.decode((99).to_bytes(4, "little") + bytes(40))
    short_io = (3).to_bytes(4, "little") + bytes(50)
    with pytest.raises(events.DecodeError):
        events.decode(short_io)
