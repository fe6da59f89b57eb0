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

LAYOUT_VERSION = 2
PATH_MAX_BYTES = 64
MODEL_MAX_BYTES = 64
EVENT_NAME_MAX_BYTES = 32


class EventType(enum.IntEnum):
    CONN_OPEN = 1
    CONN_CLOSE = 2
    SOCK_READ = 3
    SOCK_WRITE = 4
    USDT = 5
    CPU_SAMPLE = 32
    OFFCPU_SAMPLE = 33
    NET_XMIT = 64
    NET_ACK = 65
    NET_RETRANSMIT = 66
    FUTEX_WAIT = 16
    OFFCPU = 17
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
    BEGAN_UNSEEN = 0x0100
    NDJSON_STREAM = 0x0200
    LAST_CHUNK = 0x0400
    BLANK_LINE_END = 0x0800
    OUTPUT_TOKENS = 0x1000
    INPUT_TOKENS = 0x2000
    MODEL = 0x4000
    JSON_DONE = 0x8000


class Counter(enum.IntEnum):
    EVENTS_SENT = 0
    EVENTS_LOST = 1
    IO_SKIPPED = 2
    USDT_BAD_ARGS = 3
    REQUESTS = 4
    IO_UNTRACKED = 5
    NET_QUEUED = 14
    NET_XMITTED = 15


COUNTER_MAX = 16
NET_DEV_NAME_BYTES = 16


class NetVia(enum.IntEnum):
    WRITE = 1
    ACK = 2


class NetFlag(enum.IntFlag):
    RETRANSMIT = 0x0001


class StackCounter(enum.IntEnum):
    """Indexes of profile_counters / offcpu_counters (bpf/profile.bpf.c, offcpu.bpf.c)."""

    SAMPLES = 0
    COLLISIONS = 1
    LOST = 2
    KEYS_FULL = 3
    SHORT = 4
    UNMATCHED = 5


STACK_COUNTER_MAX = 8
STACK_FLAG_PREEMPTED = 0x0001

LOCK_SCAN_HITS = 8


class FutexWaitFlag(enum.IntFlag):
    WAITV = 0x1
    FUTEX2 = 0x2
    SCANNED = 0x4
    SEM_OWN = 0x8  # a semaphore the waiter took itself (sem_trywait), not posted since
    SEM_HELD = 0x10  # a semaphore another thread took that way


class OffcpuReason(enum.IntEnum):
    FUTEX = 1
    IO = 2
    SLEEP = 3
    PREEMPTED = 4


class LockCounter(enum.IntEnum):
    WAITS = 0
    WAIT_NS = 1
    SHORT_WAITS = 2
    SHORT_WAIT_NS = 3
    SCANS = 4
    STACK_MISSING = 5
    OFFCPU_SHORT = 6
    MAP_FULL = 7
    KLOCK_WAITS = 8
    KLOCK_NS = 9
    SEM_TAKES = 10


LOCK_COUNTER_MAX = 12


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
        ("output_tokens", ctypes.c_uint32),
        ("input_tokens", ctypes.c_uint32),
        ("json_lines", ctypes.c_uint16),
        ("named_events", ctypes.c_uint16),
        ("model_len", ctypes.c_uint8),
        ("event_name_len", ctypes.c_uint8),
        ("model", ctypes.c_char * MODEL_MAX_BYTES),
        ("event_name", ctypes.c_char * EVENT_NAME_MAX_BYTES),
    ]


class UsdtEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("probe", ctypes.c_uint32),
        ("nargs", ctypes.c_uint32),
        ("args", ctypes.c_int64 * USDT_MAX_ARGS),
    ]


class StackKey(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("user_stack_id", ctypes.c_int32),
        ("kernel_stack_id", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


class OffcpuValue(ctypes.Structure):
    _fields_ = [("total_us", ctypes.c_uint64), ("periods", ctypes.c_uint64)]


class StackSampleEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("user_stack_id", ctypes.c_int32),
        ("kernel_stack_id", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("weight", ctypes.c_uint64),
    ]


class NetXmitEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("conn_id", ctypes.c_uint64),
        ("queue_ns", ctypes.c_uint64),
        ("len", ctypes.c_uint32),
        ("rc", ctypes.c_int32),
        ("via", ctypes.c_uint16),
        ("flags", ctypes.c_uint16),
        ("_pad", ctypes.c_uint32),
        ("dev", ctypes.c_char * NET_DEV_NAME_BYTES),
    ]


class NetAckEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("conn_id", ctypes.c_uint64),
        ("snd_nxt", ctypes.c_uint32),
        ("snd_una", ctypes.c_uint32),
        ("snd_cwnd", ctypes.c_uint32),
        ("ssthresh", ctypes.c_uint32),
        ("snd_wnd", ctypes.c_uint32),
        ("srtt_us", ctypes.c_uint32),
        ("rcv_wnd", ctypes.c_uint32),
        ("data_len", ctypes.c_uint16),
        ("_pad", ctypes.c_uint16),
    ]


class NetRetransmitEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("conn_id", ctypes.c_uint64),
        ("state", ctypes.c_int32),
        ("err", ctypes.c_int32),
    ]


class FutexWaitEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("uaddr", ctypes.c_uint64),
        ("duration_ns", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("waker_ip", ctypes.c_uint64),
        ("stack_id", ctypes.c_int32),
        ("waker_stack_id", ctypes.c_int32),
        ("waker_tid", ctypes.c_uint32),
        ("op", ctypes.c_uint32),
        ("val", ctypes.c_uint32),
        ("ret", ctypes.c_int32),
        ("nscan", ctypes.c_uint16),
        ("waker_nscan", ctypes.c_uint16),
        ("flags", ctypes.c_uint32),
        ("scan", ctypes.c_uint64 * LOCK_SCAN_HITS),
        ("waker_scan", ctypes.c_uint64 * LOCK_SCAN_HITS),
    ]


class OffcpuEvent(ctypes.Structure):
    _fields_ = [
        ("hdr", EventHeader),
        ("blocked_ns", ctypes.c_uint64),
        ("runq_ns", ctypes.c_uint64),
        ("reason", ctypes.c_uint32),
        ("waker_tid", ctypes.c_uint32),
        ("waker_stack_id", ctypes.c_int32),
        ("waker_pid", ctypes.c_uint32),
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
    EventType.CPU_SAMPLE: StackSampleEvent,
    EventType.OFFCPU_SAMPLE: StackSampleEvent,
    EventType.NET_XMIT: NetXmitEvent,
    EventType.NET_ACK: NetAckEvent,
    EventType.NET_RETRANSMIT: NetRetransmitEvent,
    EventType.FUTEX_WAIT: FutexWaitEvent,
    EventType.OFFCPU: OffcpuEvent,
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
    # What the stream states of itself (never its text): the request body's
    # "model", token counts from usage fields, SSE events that are not tokens.
    model: str | None = None
    output_tokens: int | None = None
    input_tokens: int | None = None
    json_lines: int = 0
    named_events: int = 0
    event_name: str | None = None

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
class StackSampleRecord:
    """One stack sample, streamed only when per-phase tagging was asked for."""

    type: EventType
    pid: int
    tid: int
    ts_ns: int  # sample time (on-CPU) or switch-out time (off-CPU)
    user_stack_id: int
    kernel_stack_id: int
    flags: int
    weight: int  # 1 on-CPU; blocked microseconds off-CPU


@dataclass(frozen=True, slots=True)
class NetXmitRecord:
    """A segment of a traced connection, from the device layer's view."""

    type: EventType
    pid: int
    ts_ns: int  # net_dev_xmit: the driver took the frame
    queue_ns: int  # net_dev_queue: TCP handed it to the device layer
    conn_id: int
    len: int  # frame bytes, headers included
    rc: int
    via: NetVia
    flags: NetFlag
    dev: str


@dataclass(frozen=True, slots=True)
class NetAckRecord:
    """tcp:tcp_probe on a traced connection: what TCP knew when a segment came in."""

    type: EventType
    pid: int
    ts_ns: int
    conn_id: int
    snd_nxt: int
    snd_una: int
    snd_cwnd: int
    ssthresh: int
    snd_wnd: int  # the peer's receive window
    srtt_us: int
    rcv_wnd: int
    data_len: int


@dataclass(frozen=True, slots=True)
class NetRetransmitRecord:
    type: EventType
    pid: int
    ts_ns: int
    conn_id: int
    state: int
    err: int


NetRecord = NetXmitRecord | NetAckRecord | NetRetransmitRecord


@dataclass(frozen=True, slots=True)
class FutexWaitRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int  # the wait began
    duration_ns: int
    uaddr: int
    op: int  # PRIVATE / CLOCK_REALTIME bits masked
    val: int
    ret: int
    flags: FutexWaitFlag
    ip: int
    stack_id: int  # < 0: none
    scan: tuple[int, ...]  # candidate return addresses above the stack pointer, innermost first
    waker_tid: int  # 0: unknown
    waker_ip: int
    waker_stack_id: int
    waker_scan: tuple[int, ...]

    @property
    def end_ns(self) -> int:
        return self.ts_ns + self.duration_ns


@dataclass(frozen=True, slots=True)
class OffcpuRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int  # switched out
    blocked_ns: int
    runq_ns: int
    reason: OffcpuReason
    waker_pid: int
    waker_tid: int
    waker_stack_id: int

    @property
    def wake_ns(self) -> int:
        return self.ts_ns + self.blocked_ns


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
Event = (ConnRecord | IoRecord | UsdtRecord | StackSampleRecord | NetXmitRecord | NetAckRecord
         | NetRetransmitRecord | FutexWaitRecord | OffcpuRecord | GpuRecord)


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
    if EventType.GPU_CALL <= etype <= EventType.GPU_DRM_JOB:
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
    if struct is StackSampleEvent:
        return StackSampleRecord(
            type=etype,
            pid=hdr.pid,
            tid=hdr.tid,
            ts_ns=hdr.ts_ns,
            user_stack_id=ev.user_stack_id,
            kernel_stack_id=ev.kernel_stack_id,
            flags=ev.flags,
            weight=ev.weight,
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
    if struct is NetXmitEvent:
        return NetXmitRecord(
            type=etype, pid=hdr.pid, ts_ns=hdr.ts_ns, queue_ns=ev.queue_ns, conn_id=ev.conn_id,
            len=ev.len, rc=ev.rc,
            via=NetVia(ev.via) if ev.via in NetVia._value2member_map_ else NetVia.WRITE,
            flags=NetFlag(ev.flags), dev=ev.dev.decode("latin-1"),
        )
    if struct is NetAckEvent:
        return NetAckRecord(
            type=etype, pid=hdr.pid, ts_ns=hdr.ts_ns, conn_id=ev.conn_id, snd_nxt=ev.snd_nxt,
            snd_una=ev.snd_una, snd_cwnd=ev.snd_cwnd, ssthresh=ev.ssthresh, snd_wnd=ev.snd_wnd,
            srtt_us=ev.srtt_us, rcv_wnd=ev.rcv_wnd, data_len=ev.data_len,
        )
    if struct is NetRetransmitEvent:
        return NetRetransmitRecord(type=etype, pid=hdr.pid, ts_ns=hdr.ts_ns, conn_id=ev.conn_id,
                                   state=ev.state, err=ev.err)
    if struct is FutexWaitEvent:
        return FutexWaitRecord(
            type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, duration_ns=ev.duration_ns,
            uaddr=ev.uaddr, op=ev.op, val=ev.val, ret=ev.ret, flags=FutexWaitFlag(ev.flags),
            ip=ev.ip, stack_id=ev.stack_id, scan=tuple(ev.scan[: min(ev.nscan, LOCK_SCAN_HITS)]),
            waker_tid=ev.waker_tid, waker_ip=ev.waker_ip, waker_stack_id=ev.waker_stack_id,
            waker_scan=tuple(ev.waker_scan[: min(ev.waker_nscan, LOCK_SCAN_HITS)]),
        )
    if struct is OffcpuEvent:
        if ev.reason not in OffcpuReason._value2member_map_:
            raise DecodeError(f"unknown off-CPU reason {ev.reason}")
        return OffcpuRecord(
            type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, blocked_ns=ev.blocked_ns,
            runq_ns=ev.runq_ns, reason=OffcpuReason(ev.reason), waker_pid=ev.waker_pid,
            waker_tid=ev.waker_tid, waker_stack_id=ev.waker_stack_id,
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
        model=_text(ev.model, ev.model_len, MODEL_MAX_BYTES) if HttpFlag.MODEL in flags else None,
        output_tokens=ev.output_tokens if HttpFlag.OUTPUT_TOKENS in flags else None,
        input_tokens=ev.input_tokens if HttpFlag.INPUT_TOKENS in flags else None,
        json_lines=ev.json_lines,
        named_events=ev.named_events,
        event_name=_text(ev.event_name, ev.event_name_len, EVENT_NAME_MAX_BYTES) if ev.named_events else None,
    )


def _text(raw: bytes, length: int, limit: int) -> str | None:
    """A name the kernel copied (printable ASCII by construction), or None when empty."""
    return raw[: min(length, limit)].decode("ascii", "replace") or None
