"""Python mirrors of the event structs in bpf/inferprobe.h.

This is the only Python module that knows byte layouts. The contract test
tests/collector/test_event_layout.py compiles the header with the host C
compiler and checks every size, offset and enum value below against it, so
a change on one side without the other fails the tests instead of silently
mis-decoding recordings.
"""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass

LAYOUT_VERSION = 1
PATH_MAX_BYTES = 64


class EventType(enum.IntEnum):
    CONN_OPEN = 1
    CONN_CLOSE = 2
    SOCK_READ = 3
    SOCK_WRITE = 4
    USDT = 5
    GPU_CALL = 48
    GPU_LAUNCHES = 49
    GPU_FENCE_WAIT = 50
    GPU_DRM_JOB = 51


class UsdtProbe(enum.IntEnum):
    """The inferprobe USDT probes; argument names in docs/usdt-probes.md."""

    REQUEST_START = 1
    REQUEST_QUEUED = 2
    REQUEST_SCHEDULED = 3
    PREFILL_START = 4
    PREFILL_END = 5
    DECODE_STEP_START = 6
    DECODE_STEP_END = 7
    TOKEN_EMIT = 8
    REQUEST_END = 9
    QUEUE_DEPTH = 10
    KV_USAGE = 11


USDT_MAX_ARGS = 3


class HttpKind(enum.IntEnum):
    DATA = 0
    REQUEST = 1
    RESPONSE = 2
    EOF = 3
    ERROR = 4


class HttpMethod(enum.IntEnum):
    UNKNOWN = 0
    GET = 1
    POST = 2
    PUT = 3
    DELETE = 4
    HEAD = 5
    OPTIONS = 6
    PATCH = 7


class HttpFlag(enum.IntFlag):
    HEADERS_END = 0x0001
    CHUNKED = 0x0002
    EVENT_STREAM = 0x0004
    SSE_DONE = 0x0008
    CHUNKED_END = 0x0010
    CONN_CLOSE = 0x0020
    HAS_LENGTH = 0x0040
    VECTORED = 0x0080


class Counter(enum.IntEnum):
    EVENTS_SENT = 0
    EVENTS_LOST = 1
    IO_SKIPPED = 2
    USDT_BAD_ARGS = 3
    REQUESTS = 4


COUNTER_MAX = 16


class GpuFunction(enum.IntEnum):
    """CUDA functions the gpu probe set hooks; ranges are categories (inferprobe.h)."""

    CU_LAUNCH_KERNEL = 1
    CU_LAUNCH_KERNEL_EX = 2
    CU_GRAPH_LAUNCH = 3
    CUDA_LAUNCH_KERNEL = 4
    CUDA_LAUNCH_KERNEL_EX = 5
    CUDA_GRAPH_LAUNCH = 6
    CU_STREAM_SYNCHRONIZE = 16
    CU_EVENT_SYNCHRONIZE = 17
    CU_CTX_SYNCHRONIZE = 18
    CU_STREAM_WAIT_EVENT = 19
    CUDA_STREAM_SYNCHRONIZE = 20
    CUDA_EVENT_SYNCHRONIZE = 21
    CUDA_DEVICE_SYNCHRONIZE = 22
    CUDA_STREAM_WAIT_EVENT = 23
    CU_MEMCPY = 32
    CU_MEMCPY_ASYNC = 33
    CU_MEMCPY_DTOH = 34
    CU_MEMCPY_DTOH_ASYNC = 35
    CU_MEMCPY_HTOD = 36
    CU_MEMCPY_HTOD_ASYNC = 37
    CU_MEMCPY_DTOD = 38
    CU_MEMCPY_DTOD_ASYNC = 39
    CUDA_MEMCPY = 40
    CUDA_MEMCPY_ASYNC = 41
    CU_MEM_ALLOC = 48
    CU_MEM_FREE = 49
    CU_MEM_ALLOC_ASYNC = 50
    CU_MEM_FREE_ASYNC = 51
    CUDA_MALLOC = 52
    CUDA_FREE = 53
    CUDA_MALLOC_ASYNC = 54
    CUDA_FREE_ASYNC = 55
    CUDA_GET_DEVICE_COUNT = 60


GPU_FN_MAX = 64


class GpuCopyKind(enum.IntEnum):
    HTOH = 0
    HTOD = 1
    DTOH = 2
    DTOD = 3
    DEFAULT = 4


class GpuFlushReason(enum.IntEnum):
    CALL = 1
    CAP = 2
    AGE = 3
    END = 4


class GpuDrmWhat(enum.IntEnum):
    SCHED_JOB = 1


class EventHeader(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("ts_ns", ctypes.c_uint64),
    ]


class ConnEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("conn_id", ctypes.c_uint64),
        ("fd", ctypes.c_int32),
        ("family", ctypes.c_uint16),
        ("peer_port", ctypes.c_uint16),
        ("peer_addr", ctypes.c_uint8 * 16),
    ]


class IoEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("conn_id", ctypes.c_uint64),
        ("exit_ns", ctypes.c_uint64),
        ("bytes", ctypes.c_int64),
        ("content_length", ctypes.c_int64),
        ("fd", ctypes.c_int32),
        ("kind", ctypes.c_uint16),
        ("flags", ctypes.c_uint16),
        ("status", ctypes.c_uint16),
        ("header_bytes", ctypes.c_uint16),
        ("sse_events", ctypes.c_uint16),
        ("method", ctypes.c_uint8),
        ("path_len", ctypes.c_uint8),
        ("path", ctypes.c_char * PATH_MAX_BYTES),
    ]


class UsdtEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("probe", ctypes.c_uint32),
        ("nargs", ctypes.c_uint32),
        ("args", ctypes.c_int64 * USDT_MAX_ARGS),
    ]


class GpuCallEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("exit_ns", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("addr", ctypes.c_uint64),
        ("ret", ctypes.c_int32),
        ("function", ctypes.c_uint16),
        ("copy_kind", ctypes.c_uint8),
        ("pad", ctypes.c_uint8),
    ]


class GpuLaunchesEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("last_ns", ctypes.c_uint64),
        ("launch_ns", ctypes.c_uint64),
        ("kernels", ctypes.c_uint32),
        ("graphs", ctypes.c_uint32),
        ("reason", ctypes.c_uint16),
        ("pad16", ctypes.c_uint16),
        ("pad32", ctypes.c_uint32),
    ]


class GpuFenceEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("exit_ns", ctypes.c_uint64),
        ("context", ctypes.c_uint64),
        ("seqno", ctypes.c_uint64),
    ]


class GpuDrmEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("what", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


STRUCT_FOR_TYPE: dict[EventType, type[ctypes.Structure]] = {
    EventType.CONN_OPEN: ConnEvent,
    EventType.CONN_CLOSE: ConnEvent,
    EventType.SOCK_READ: IoEvent,
    EventType.SOCK_WRITE: IoEvent,
    EventType.USDT: UsdtEvent,
    EventType.GPU_CALL: GpuCallEvent,
    EventType.GPU_LAUNCHES: GpuLaunchesEvent,
    EventType.GPU_FENCE_WAIT: GpuFenceEvent,
    EventType.GPU_DRM_JOB: GpuDrmEvent,
}


class DecodeError(ValueError):
    """Bytes that are not an event of this layout version."""


@dataclass(frozen=True, slots=True)
class ConnRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int
    conn_id: int
    fd: int
    family: int
    peer_port: int
    peer_addr: bytes


@dataclass(frozen=True, slots=True)
class IoRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int  # syscall entry
    exit_ns: int  # syscall exit
    conn_id: int
    fd: int
    bytes: int  # bytes moved, or -errno
    kind: HttpKind
    flags: HttpFlag
    status: int
    content_length: int | None
    header_bytes: int
    sse_events: int
    method: str | None
    path: str | None

    @property
    def is_read(self) -> bool:
        return self.type == EventType.SOCK_READ


@dataclass(frozen=True, slots=True)
class UsdtRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int
    probe: UsdtProbe
    args: tuple[int, ...]  # in the probe's documented order


@dataclass(frozen=True, slots=True)
class GpuCallRecord:
    """One completed CUDA wait, copy, memory or query call (the outermost on its thread)."""

    type: EventType
    pid: int
    tid: int
    ts_ns: int  # entry
    exit_ns: int  # return
    function: GpuFunction
    ret: int  # 0 = success
    bytes: int
    addr: int
    copy_kind: GpuCopyKind | None  # copies only

    @property
    def duration_ns(self) -> int:
        return self.exit_ns - self.ts_ns


@dataclass(frozen=True, slots=True)
class GpuLaunchesRecord:
    """A run of launches on one thread, from its first to its last launch entry."""

    type: EventType
    pid: int
    tid: int
    ts_ns: int  # first launch
    last_ns: int  # last launch
    launch_ns: int  # time inside runtime launch calls
    kernels: int
    graphs: int
    reason: GpuFlushReason


@dataclass(frozen=True, slots=True)
class GpuFenceRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int  # dma_fence_wait_start
    exit_ns: int  # dma_fence_wait_end
    context: int
    seqno: int


@dataclass(frozen=True, slots=True)
class GpuDrmRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int
    what: GpuDrmWhat


GpuRecord = GpuCallRecord | GpuLaunchesRecord | GpuFenceRecord | GpuDrmRecord
Event = ConnRecord | IoRecord | UsdtRecord | GpuRecord


def _enum_or_error(enum_type, value: int, what: str):
    if value not in enum_type._value2member_map_:
        raise DecodeError(f"unknown {what} {value}")
    return enum_type(value)


def _decode_gpu(etype: EventType, ev) -> GpuRecord:
    hdr = ev.hdr
    if etype == EventType.GPU_CALL:
        function = _enum_or_error(GpuFunction, ev.function, "GPU function")
        is_copy = 32 <= function < 48
        return GpuCallRecord(
            type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, exit_ns=ev.exit_ns,
            function=function, ret=ev.ret, bytes=ev.bytes, addr=ev.addr,
            copy_kind=(GpuCopyKind(ev.copy_kind) if ev.copy_kind in GpuCopyKind._value2member_map_
                       else GpuCopyKind.DEFAULT) if is_copy else None,
        )
    if etype == EventType.GPU_LAUNCHES:
        return GpuLaunchesRecord(
            type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, last_ns=ev.last_ns,
            launch_ns=ev.launch_ns, kernels=ev.kernels, graphs=ev.graphs,
            reason=_enum_or_error(GpuFlushReason, ev.reason, "launch flush reason"),
        )
    if etype == EventType.GPU_FENCE_WAIT:
        return GpuFenceRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                              exit_ns=ev.exit_ns, context=ev.context, seqno=ev.seqno)
    return GpuDrmRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                        what=_enum_or_error(GpuDrmWhat, ev.what, "DRM event"))


def event_type_of(raw: bytes) -> EventType:
    if len(raw) < ctypes.sizeof(EventHeader):
        raise DecodeError(f"event of {len(raw)} bytes is shorter than its header")
    value = int.from_bytes(raw[:4], "little")
    try:
        return EventType(value)
    except ValueError:
        raise DecodeError(f"unknown event type {value}") from None


def decode(raw: bytes) -> Event:
    """Decodes one event exactly as the kernel wrote it."""
    etype = event_type_of(raw)
    struct = STRUCT_FOR_TYPE[etype]
    if len(raw) < ctypes.sizeof(struct):
        raise DecodeError(
            f"{etype.name} event has {len(raw)} bytes, expected {ctypes.sizeof(struct)}"
        )
    ev = struct.from_buffer_copy(raw[: ctypes.sizeof(struct)])
    hdr = ev.hdr
    if etype >= EventType.GPU_CALL:
        return _decode_gpu(etype, ev)
    if struct is ConnEvent:
        return ConnRecord(
            type=etype,
            pid=hdr.pid,
            tid=hdr.tid,
            ts_ns=hdr.ts_ns,
            conn_id=ev.conn_id,
            fd=ev.fd,
            family=ev.family,
            peer_port=ev.peer_port,
            peer_addr=bytes(ev.peer_addr),
        )
    if struct is UsdtEvent:
        if ev.probe not in UsdtProbe._value2member_map_:
            raise DecodeError(f"unknown USDT probe {ev.probe}")
        return UsdtRecord(
            type=etype,
            pid=hdr.pid,
            tid=hdr.tid,
            ts_ns=hdr.ts_ns,
            probe=UsdtProbe(ev.probe),
            args=tuple(ev.args[: min(ev.nargs, USDT_MAX_ARGS)]),
        )
    kind = HttpKind(ev.kind) if ev.kind in HttpKind._value2member_map_ else HttpKind.DATA
    flags = HttpFlag(ev.flags)
    method = None
    path = None
    if kind == HttpKind.REQUEST:
        method = HttpMethod(ev.method).name if ev.method in HttpMethod._value2member_map_ else None
        path = ev.path[: ev.path_len].decode("latin-1") if ev.path_len else "/"
    return IoRecord(
        type=etype,
        pid=hdr.pid,
        tid=hdr.tid,
        ts_ns=hdr.ts_ns,
        exit_ns=ev.exit_ns,
        conn_id=ev.conn_id,
        fd=ev.fd,
        bytes=ev.bytes,
        kind=kind,
        flags=flags,
        status=ev.status,
        content_length=ev.content_length if HttpFlag.HAS_LENGTH in flags else None,
        header_bytes=ev.header_bytes,
        sse_events=ev.sse_events,
        method=method,
        path=path,
    )
