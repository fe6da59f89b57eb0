"""Decoding of the events bpf/inferprobe.h lays out: raw bytes in, records out.

The layouts themselves (ctypes structs, enums, flags, #define constants) are
generated from the header into collector/model/layout_generated.py and re-exported
here, so the rest of inferprobe imports them from this module. This is the
only Python module that reads event bytes. tests/unit/collector/model/test_event_layout.py
checks the generated mirrors against the header compiled by the host C
compiler, tests/unit/collector/model/test_layout_generated.py that the generated file is
up to date, and tests/integration/bpf/test_layout_bpf_target.py that clang compiles the same
sizes for the BPF target.

Unknown values, one policy: a value outside its C enum (an event type, a USDT
probe, an HTTP kind or method, a GPU function, ...) makes the whole event
undecodable: decode() raises DecodeError naming the field and the value, and
every reader counts the event as undecodable and goes on (the report prints
the count). A record never carries a guessed member or a bare int where its
type says enum, so code downstream can rely on the type; a reader never
crashes on such bytes. Flag words are not enums: unknown bits are kept.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

from inferprobe.collector.model.layout_generated import (
    COUNTER_MAX,
    ENGINE_ID_MAX_BYTES,
    EVENT_NAME_MAX_BYTES,
    GPU_FN_FIRST_COPY,
    GPU_FN_FIRST_MEMORY,
    GPU_FN_FIRST_QUERY,
    GPU_FN_FIRST_WAIT,
    GPU_FN_MAX,
    INFERPROBE_LAYOUT_VERSION,
    LOCK_COUNTER_MAX,
    LOCK_EXEC_GRANULE_SHIFT,
    LOCK_EXEC_GRANULES,
    LOCK_SCAN_HITS,
    MODEL_MAX_BYTES,
    NET_DEV_NAME_BYTES,
    PATH_HEAD_BYTES,
    PATH_MAX_BYTES,
    PATH_SCAN_BYTES,
    STACK_COUNTER_MAX,
    TRACEPARENT_MAX_BYTES,
    TRACESTATE_MAX_BYTES,
    USDT_MAX_ARGS,
    ConnEvent,
    ConnRole,
    Counter,
    EngineIpcEvent,
    EngineIpcFlag,
    EngineIpcKind,
    EventHeader,
    EventType,
    FutexWaitEvent,
    FutexWaitFlag,
    GpuActivityEvent,
    GpuActivityKind,
    GpuApiEvent,
    GpuCallEvent,
    GpuClockEvent,
    GpuCopyKind,
    GpuDrmEvent,
    GpuDrmWhat,
    GpuFenceEvent,
    GpuFlushReason,
    GpuFunction,
    GpuKernelNameEvent,
    GpuLaunchesEvent,
    GpuShimStatus,
    GpuShimStatusEvent,
    H2Content,
    H2Flag,
    H2FrameFlag,
    H2FramesEvent,
    H2FrameType,
    H2HeadersEvent,
    H2HeadersFlag,
    H2PartFlag,
    HttpFlag,
    HttpKind,
    HttpMethod,
    IoEvent,
    LlamaStepEvent,
    LlamaStepPhase,
    LockCounter,
    NetAckEvent,
    NetFlag,
    NetRetransmitEvent,
    NetVia,
    NetXmitEvent,
    OffcpuEvent,
    OffcpuReason,
    OffcpuValue,
    StackCounter,
    StackFlag,
    StackKey,
    StackSampleEvent,
    StreamFlag,
    TraceContextEvent,
    TraceContextFlag,
    Transport,
    UsdtEvent,
    UsdtProbe,
)

__all__ = [
    # layouts (collector/model/layout_generated.py)
    "COUNTER_MAX", "EVENT_NAME_MAX_BYTES", "GPU_FN_FIRST_COPY", "GPU_FN_FIRST_MEMORY",
    "GPU_FN_FIRST_QUERY", "GPU_FN_FIRST_WAIT", "GPU_FN_MAX", "LAYOUT_VERSION", "LOCK_COUNTER_MAX",
    "LOCK_EXEC_GRANULES", "LOCK_EXEC_GRANULE_SHIFT", "LOCK_SCAN_HITS", "MODEL_MAX_BYTES",
    "NET_DEV_NAME_BYTES", "PATH_HEAD_BYTES", "PATH_MAX_BYTES", "PATH_SCAN_BYTES", "STACK_COUNTER_MAX",
    "STACK_FLAG_PREEMPTED", "USDT_MAX_ARGS",
    "ConnEvent", "ConnRole", "Counter",
    "EngineIpcEvent", "EngineIpcFlag", "EngineIpcKind",
    "EventHeader", "EventType", "FutexWaitEvent", "FutexWaitFlag",
    "GpuCallEvent",
    "GpuCopyKind", "GpuDrmEvent", "GpuDrmWhat", "GpuFenceEvent", "GpuFlushReason", "GpuFunction",
    "GpuLaunchesEvent", "GpuActivityEvent", "GpuActivityKind", "GpuApiEvent", "GpuClockEvent",
    "GpuKernelNameEvent", "GpuShimStatus", "GpuShimStatusEvent",
    "H2Content", "H2Flag", "H2FrameFlag", "H2FrameType", "H2FramesEvent", "H2HeadersEvent", "H2HeadersFlag",
    "H2PartFlag",
    "HttpFlag", "HttpKind", "HttpMethod", "IoEvent", "LockCounter", "NetAckEvent",
    "NetFlag", "NetRetransmitEvent", "NetVia", "NetXmitEvent", "OffcpuEvent", "OffcpuReason",
    "OffcpuValue", "StackCounter", "StackFlag", "StackKey", "StackSampleEvent", "StreamFlag",
    "TraceContextEvent",
    "TraceContextFlag", "Transport", "UsdtEvent",
    "UsdtProbe",
    # decoding
    "DECODERS", "ConnRecord", "DecodeError", "Event", "FutexWaitRecord", "GpuCallRecord", "GpuDrmRecord",
    "LlamaRunRecord", "LlamaStepRecord", "GpuActivityRecord", "GpuApiRecord", "GpuClockRecord",
    "GpuKernelNameRecord", "GpuShimRecord", "GpuShimStatusRecord",
    "EngineIpcRecord",
    "GpuFenceRecord", "GpuLaunchesRecord", "GpuRecord", "IoRecord", "NetAckRecord", "NetRecord",
    "NetRetransmitRecord", "NetXmitRecord", "OffcpuRecord", "StackSampleRecord", "TraceContextRecord",
    "UsdtRecord",
    "decode",
    "event_type_of", "path_ends", "request_path",
]

LAYOUT_VERSION = INFERPROBE_LAYOUT_VERSION
STACK_FLAG_PREEMPTED = StackFlag.PREEMPTED


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
    role: ConnRole = ConnRole.SERVER  # CLIENT: the target connect()ed it (an outbound call)
    result: int = 0  # a client's CONN_OPEN: connect()'s return (0, -EINPROGRESS, -errno)
    local_port: int = 0  # a client's CONN_CONNECTED: its own port (0 where unknown, or before it was sent)


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
    # What carried the bytes: a socket syscall, or a TLS library call whose
    # plaintext this is (ts_ns is then the call's entry, and wire_ns, when
    # known, the start of the socket write inside it).
    transport: Transport = Transport.SOCKET
    wire_ns: int | None = None
    role: ConnRole = ConnRole.SERVER  # CLIENT: the target's own outbound call (it writes the request)
    retry_count: int | None = None  # a request's x-stainless-retry-count (0 on a first attempt)
    # A request whose line or headers came in pieces, joined in the kernel: how
    # many earlier reads (writes) it holds, and when the first of them moved.
    joined_pieces: int = 0
    first_piece_ns: int | None = None
    # Stream shapes past the HTTP flags: an AWS event stream's response, and an
    # exception message in this write (its :exception-type in event_name).
    stream_flags: StreamFlag = StreamFlag(0)
    # A request's Host name (its first EVENT_NAME_MAX_BYTES, without a port): which
    # endpoint a client called (bedrock-runtime.us-east-1.amazon...).
    host: str | None = None

    @property
    def is_read(self) -> bool:
        return self.type == EventType.SOCK_READ


@dataclass(frozen=True, slots=True)
class TraceContextRecord:
    """A request's W3C traceparent and tracestate header values as the kernel
    copied them (bpf/protocols/trace_context.bpf.h): raw text, checked by
    collector/ingest/trace_context.py, never trusted as sent."""

    type: EventType
    pid: int
    tid: int
    ts_ns: int  # entry of the read/write that carried the header
    exit_ns: int  # its exit: the io_event of the same syscall has the same exit_ns
    conn_id: int
    flags: TraceContextFlag
    role: ConnRole
    header_offset: int  # where the traceparent line starts in the request
    traceparent: str | None
    tracestate: str | None


@dataclass(frozen=True, slots=True)
class UsdtRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int
    probe: UsdtProbe
    args: tuple[int, ...]  # in the probe's documented order

    # The engine's gauges, read here once for the report, the live view and the metrics
    # (docs/usdt-probes.md: queue_depth(waiting, running), kv_usage(used, total)).
    @property
    def queue_depth(self) -> tuple[int, int] | None:
        """(waiting, running) of a queue_depth probe; None for any other probe."""
        if self.probe != UsdtProbe.QUEUE_DEPTH or len(self.args) < 2:
            return None
        return int(self.args[0]), int(self.args[1])

    @property
    def kv_used(self) -> float | None:
        """The share of the KV cache in use, of a kv_usage probe; None for any other probe,
        or a total of 0."""
        if self.probe != UsdtProbe.KV_USAGE or len(self.args) < 2 or self.args[1] <= 0:
            return None
        return self.args[0] / self.args[1]


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
    python_stack_id: int = 0  # >0: the sample's Python stack (stack snapshot's python_stack_id); 0 none


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
    python_stack_id: int = 0  # the waiter's Python stack (locks snapshot's python_stacks); 0 none
    waker_python_stack_id: int = 0

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


@dataclass(frozen=True, slots=True)
class GpuApiRecord:
    """CUPTI shim: a launch, copy or memset API call entered on this thread (ts_ns, CLOCK_MONOTONIC)."""

    type: EventType
    pid: int
    tid: int
    ts_ns: int
    correlation_id: int
    cbid: int
    domain: int


@dataclass(frozen=True, slots=True)
class GpuActivityRecord:
    """CUPTI shim: one kernel, copy or memset as the GPU ran it. gpu_start/gpu_end are in CUPTI's
    clock; analyzers/gpu.py maps them to CLOCK_MONOTONIC with the GpuClockRecords."""

    type: EventType
    pid: int
    tid: int
    ts_ns: int  # when the shim handed the record over (after the work ended)
    kind: GpuActivityKind
    gpu_start: int
    gpu_end: int
    correlation_id: int
    device: int
    stream: int
    shape: int  # kernels: packed grid; copies and memsets: bytes
    name_id: int  # kernels: name id; copies: CUpti_ActivityMemcpyKind

    @property
    def grid(self) -> tuple[int, int, int]:
        mask = (1 << 21) - 1
        return (self.shape & mask, (self.shape >> 21) & mask, (self.shape >> 42) & mask)


@dataclass(frozen=True, slots=True)
class GpuClockRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int
    cupti_ns: int
    mono_before_ns: int
    mono_after_ns: int


@dataclass(frozen=True, slots=True)
class GpuKernelNameRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int
    name_id: int
    name: str


@dataclass(frozen=True, slots=True)
class GpuShimStatusRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int
    status: GpuShimStatus
    cupti_result: int
    text: str


GpuShimRecord = GpuApiRecord | GpuActivityRecord | GpuClockRecord | GpuKernelNameRecord | GpuShimStatusRecord
GpuRecord = GpuCallRecord | GpuLaunchesRecord | GpuFenceRecord | GpuDrmRecord | GpuShimRecord


@dataclass(frozen=True, slots=True)
class LlamaRunRecord:
    """Consecutive tokens of one sequence in one llama_decode batch (bpf/llama.bpf.c)."""

    seq_id: int  # llama-server: the slot id
    pos0: int
    n_tokens: int
    samples: bool  # the run's last token has logits on: the step samples a token for it


@dataclass(frozen=True, slots=True)
class LlamaStepRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int
    phase: LlamaStepPhase
    n_tokens: int
    runs: tuple[LlamaRunRecord, ...]  # entry only
    truncated: bool
    ret: int  # return: the call's result; sync: the ns llama_synchronize waited
    ctx: int


@dataclass(frozen=True, slots=True)
class EngineIpcRecord:
    """What crossed an engine's ZeroMQ connection between its processes (bpf/protocols/zmtp.bpf.h):
    a request handed to the engine (ADD), one request's entry in a step's outputs
    (OUTPUT), or the end of a step's outputs (STEP). ts_ns: a read's return or a
    write's start, so both ends of one message are seen, each at its process."""

    type: EventType
    pid: int
    tid: int
    ts_ns: int
    conn_id: int
    message: int  # the message's number on its connection and direction: a step's entries share it
    kind: EngineIpcKind
    is_read: bool
    flags: EngineIpcFlag
    count: int  # ADD: prompt tokens; OUTPUT: new tokens; STEP: entries
    index: int  # OUTPUT: its place in the step's outputs
    request_id: str | None
    queued_s: float | None  # OUTPUT: the engine's QUEUED event (its time.monotonic(), CLOCK_MONOTONIC)
    scheduled_s: float | None  # ... and its first SCHEDULED event


@dataclass(frozen=True, slots=True)
class H2FramePart:
    """What one syscall carried of one HTTP/2 frame (bpf/protocols/http2.bpf.h)."""

    stream_id: int
    length: int  # the frame's payload length
    value: int  # RST_STREAM: error code; GOAWAY: last stream id; DATA: payload bytes in this part
    frame_type: int  # an H2FrameType value, or an extension frame's type
    flags: int  # the frame's flags as sent (END_STREAM 0x1, END_HEADERS 0x4, ...)
    part: H2PartFlag
    messages: int  # DATA of gRPC: messages this part completes

    @property
    def ends_stream(self) -> bool:
        return (bool(self.flags & H2FrameFlag.END_STREAM) and H2PartFlag.ENDS in self.part
                and self.frame_type in (H2FrameType.DATA, H2FrameType.HEADERS))


@dataclass(frozen=True, slots=True)
class H2FramesRecord:
    type: EventType
    pid: int
    tid: int
    ts_ns: int
    exit_ns: int
    conn_id: int
    fd: int
    bytes: int
    flags: H2Flag
    transport: Transport
    role: ConnRole
    is_read: bool
    wire_ns: int | None
    frames: tuple[H2FramePart, ...]


@dataclass(frozen=True, slots=True)
class H2HeadersRecord:
    """A header block's listed fields, decoded in user space (collector/ingest/h2_header_blocks.py)."""

    type: EventType
    pid: int
    tid: int
    ts_ns: int
    exit_ns: int
    conn_id: int
    stream_id: int
    flags: H2HeadersFlag
    status: int | None
    grpc_status: int | None
    grpc_message_len: int
    method: str | None
    path: str | None
    content: H2Content
    is_read: bool
    role: ConnRole
    transport: Transport
    traceparent: str | None
    tracestate: str | None = None
    tracestate_cut: bool = False
    first_piece_ns: int | None = None  # the block's first bytes moved (layout 4; None before)


Event = (ConnRecord | IoRecord | UsdtRecord | StackSampleRecord | NetXmitRecord | NetAckRecord
         | NetRetransmitRecord | FutexWaitRecord | OffcpuRecord | GpuRecord | LlamaStepRecord
         | TraceContextRecord | H2FramesRecord | H2HeadersRecord | EngineIpcRecord)


E = TypeVar("E", bound=IntEnum)


def member(enum_type: type[E], value: int, field: str) -> E:
    """The one policy for a value outside its C enum: the event is undecodable."""
    if value not in enum_type._value2member_map_:
        raise DecodeError(f"{field} {value} is not a {enum_type.__name__} of this layout")
    return enum_type(value)


def request_path(raw: bytes, length: int) -> str:
    """A request's path as the kernel keeps it: whole up to PATH_MAX_BYTES,
    else its two ends joined by "…" (layout 5, bpf/inferprobe.h PATH_HEAD_BYTES)."""
    if length <= PATH_MAX_BYTES:
        return raw[:length].decode("latin-1")
    return (raw[:PATH_HEAD_BYTES].decode("latin-1") + "…"
            + raw[PATH_HEAD_BYTES:PATH_MAX_BYTES].decode("latin-1"))


def path_ends(path: bytes) -> tuple[bytes, int]:
    """(bytes, path_len) of a path kept as the kernel keeps a request line's
    (http1.bpf.h copy_path), for the events user space makes (HTTP/2's)."""
    if len(path) <= PATH_MAX_BYTES:
        return path, len(path)
    if len(path) >= PATH_SCAN_BYTES:
        return path[:PATH_MAX_BYTES], PATH_MAX_BYTES
    return path[:PATH_HEAD_BYTES] + path[len(path) - (PATH_MAX_BYTES - PATH_HEAD_BYTES):], len(path)


def _text(raw: bytes, length: int, limit: int) -> str | None:
    """A name the kernel copied (printable ASCII by construction), or None when empty."""
    return raw[: min(length, limit)].decode("ascii", "replace") or None


def _conn(etype: EventType, ev: Any) -> ConnRecord:
    hdr = ev.hdr
    return ConnRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, conn_id=ev.conn_id, fd=ev.fd,
                      family=ev.family, peer_port=ev.peer_port, peer_addr=bytes(ev.peer_addr),
                      role=member(ConnRole, ev.role, "connection role"), result=ev.result,
                      local_port=ev.local_port)


def _io(etype: EventType, ev: Any) -> IoRecord:
    hdr = ev.hdr
    kind = member(HttpKind, ev.kind, "HTTP kind")
    flags = HttpFlag(ev.flags)
    stream_flags = StreamFlag(ev.stream_flags)
    method = None
    path = None
    if kind == HttpKind.REQUEST:
        method = member(HttpMethod, ev.method, "HTTP method").name
        path = request_path(ev.path, ev.path_len) if ev.path_len else "/"
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
        event_name=(_text(ev.event_name, ev.event_name_len, EVENT_NAME_MAX_BYTES)
                    if ev.named_events or StreamFlag.EXCEPTION in stream_flags else None),
        transport=member(Transport, ev.transport, "transport"),
        wire_ns=ev.wire_ns or None,
        role=member(ConnRole, ev.role, "connection role"),
        retry_count=ev.retry_count - 1 if ev.retry_count else None,
        joined_pieces=ev.joined_pieces,
        first_piece_ns=ev.first_piece_ns if ev.joined_pieces else None,
        stream_flags=stream_flags,
        host=(_text(ev.event_name, ev.event_name_len, EVENT_NAME_MAX_BYTES)
              if kind == HttpKind.REQUEST and ev.event_name_len else None),
    )


def _usdt(etype: EventType, ev: Any) -> UsdtRecord:
    hdr = ev.hdr
    return UsdtRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                      probe=member(UsdtProbe, ev.probe, "USDT probe"),
                      args=tuple(ev.args[: min(ev.nargs, USDT_MAX_ARGS)]))


def _stack_sample(etype: EventType, ev: Any) -> StackSampleRecord:
    hdr = ev.hdr
    return StackSampleRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                             user_stack_id=ev.user_stack_id, kernel_stack_id=ev.kernel_stack_id,
                             flags=ev.flags, weight=ev.weight, python_stack_id=ev.python_stack_id)


def _net_xmit(etype: EventType, ev: Any) -> NetXmitRecord:
    hdr = ev.hdr
    return NetXmitRecord(type=etype, pid=hdr.pid, ts_ns=hdr.ts_ns, queue_ns=ev.queue_ns, conn_id=ev.conn_id,
                         len=ev.len, rc=ev.rc, via=member(NetVia, ev.via, "segment source"),
                         flags=NetFlag(ev.flags), dev=ev.dev.decode("latin-1"))


def _net_ack(etype: EventType, ev: Any) -> NetAckRecord:
    hdr = ev.hdr
    return NetAckRecord(type=etype, pid=hdr.pid, ts_ns=hdr.ts_ns, conn_id=ev.conn_id, snd_nxt=ev.snd_nxt,
                        snd_una=ev.snd_una, snd_cwnd=ev.snd_cwnd, ssthresh=ev.ssthresh, snd_wnd=ev.snd_wnd,
                        srtt_us=ev.srtt_us, rcv_wnd=ev.rcv_wnd, data_len=ev.data_len)


def _net_retransmit(etype: EventType, ev: Any) -> NetRetransmitRecord:
    hdr = ev.hdr
    return NetRetransmitRecord(type=etype, pid=hdr.pid, ts_ns=hdr.ts_ns, conn_id=ev.conn_id,
                               state=ev.state, err=ev.err)


def _futex_wait(etype: EventType, ev: Any) -> FutexWaitRecord:
    hdr = ev.hdr
    return FutexWaitRecord(
        type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, duration_ns=ev.duration_ns,
        uaddr=ev.uaddr, op=ev.op, val=ev.val, ret=ev.ret, flags=FutexWaitFlag(ev.flags),
        ip=ev.ip, stack_id=ev.stack_id, scan=tuple(ev.scan[: min(ev.nscan, LOCK_SCAN_HITS)]),
        waker_tid=ev.waker_tid, waker_ip=ev.waker_ip, waker_stack_id=ev.waker_stack_id,
        waker_scan=tuple(ev.waker_scan[: min(ev.waker_nscan, LOCK_SCAN_HITS)]),
        python_stack_id=ev.python_stack_id, waker_python_stack_id=ev.waker_python_stack_id,
    )


def _offcpu(etype: EventType, ev: Any) -> OffcpuRecord:
    hdr = ev.hdr
    return OffcpuRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, blocked_ns=ev.blocked_ns,
                        runq_ns=ev.runq_ns, reason=member(OffcpuReason, ev.reason, "off-CPU reason"),
                        waker_pid=ev.waker_pid, waker_tid=ev.waker_tid, waker_stack_id=ev.waker_stack_id)


def _gpu_call(etype: EventType, ev: Any) -> GpuCallRecord:
    hdr = ev.hdr
    function = member(GpuFunction, ev.function, "GPU function")
    is_copy = GPU_FN_FIRST_COPY <= function < GPU_FN_FIRST_MEMORY
    return GpuCallRecord(
        type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, exit_ns=ev.exit_ns,
        function=function, ret=ev.ret, bytes=ev.bytes, addr=ev.addr,
        copy_kind=member(GpuCopyKind, ev.copy_kind, "copy kind") if is_copy else None,
    )


def _gpu_launches(etype: EventType, ev: Any) -> GpuLaunchesRecord:
    hdr = ev.hdr
    return GpuLaunchesRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, last_ns=ev.last_ns,
                             launch_ns=ev.launch_ns, kernels=ev.kernels, graphs=ev.graphs,
                             reason=member(GpuFlushReason, ev.reason, "launch flush reason"))


def _gpu_fence(etype: EventType, ev: Any) -> GpuFenceRecord:
    hdr = ev.hdr
    return GpuFenceRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                          exit_ns=ev.exit_ns, context=ev.context, seqno=ev.seqno)


def _gpu_drm(etype: EventType, ev: Any) -> GpuDrmRecord:
    hdr = ev.hdr
    return GpuDrmRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                        what=member(GpuDrmWhat, ev.what, "DRM event"))


def _gpu_api(etype: EventType, ev: Any) -> GpuApiRecord:
    hdr = ev.hdr
    return GpuApiRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                        correlation_id=ev.correlation_id, cbid=ev.cbid, domain=ev.domain)


def _gpu_activity(etype: EventType, ev: Any) -> GpuActivityRecord:
    hdr = ev.hdr
    return GpuActivityRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                             kind=member(GpuActivityKind, ev.kind, "GPU activity kind"),
                             gpu_start=ev.gpu_start, gpu_end=ev.gpu_end, correlation_id=ev.correlation_id,
                             device=ev.device, stream=ev.stream, shape=ev.shape, name_id=ev.name_id)


def _gpu_clock(etype: EventType, ev: Any) -> GpuClockRecord:
    hdr = ev.hdr
    return GpuClockRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, cupti_ns=ev.cupti_ns,
                          mono_before_ns=ev.mono_before_ns, mono_after_ns=ev.mono_after_ns)


def _c_string(buf: Any, length: int) -> str:
    return bytes(buf[: min(length, len(buf))]).split(b"\0", 1)[0].decode("utf-8", "replace")


def _gpu_kernel_name(etype: EventType, ev: Any) -> GpuKernelNameRecord:
    hdr = ev.hdr
    return GpuKernelNameRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, name_id=ev.name_id,
                               name=_c_string(ev.name, ev.len))


def _gpu_shim_status(etype: EventType, ev: Any) -> GpuShimStatusRecord:
    hdr = ev.hdr
    return GpuShimStatusRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                               status=member(GpuShimStatus, ev.status, "CUPTI shim status"),
                               cupti_result=ev.cupti_result, text=_c_string(ev.text, ev.len))


def _llama_step(etype: EventType, ev: Any) -> LlamaStepRecord:
    hdr = ev.hdr
    n = min(ev.n_runs, len(ev.runs))
    runs = tuple(LlamaRunRecord(r.seq_id, r.pos0, r.n_tokens, bool(r.last_logits)) for r in ev.runs[:n])
    return LlamaStepRecord(type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns,
                           phase=member(LlamaStepPhase, ev.phase, "llama step phase"),
                           n_tokens=ev.n_tokens, runs=runs, truncated=bool(ev.truncated), ret=ev.ret,
                           ctx=ev.ctx)


def _engine_clock(bits: int) -> float | None:
    """An engine time the kernel copied as the big-endian bits of a float64 (0: none)."""
    return struct.unpack(">d", bits.to_bytes(8, "big"))[0] if bits else None


def _engine_ipc(etype: EventType, ev: Any) -> EngineIpcRecord:
    hdr = ev.hdr
    n = min(ev.id_len, ENGINE_ID_MAX_BYTES)
    return EngineIpcRecord(
        type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, conn_id=ev.conn_id, message=ev.message,
        kind=member(EngineIpcKind, ev.kind, "engine IPC kind"), is_read=ev.dir == 0,
        flags=EngineIpcFlag(ev.flags), count=ev.count, index=ev.index,
        # latin-1: any byte decodes (an id the engine made, never prompt text)
        request_id=bytes(ev.id[:n]).decode("latin-1") or None,
        queued_s=_engine_clock(ev.queued_bits), scheduled_s=_engine_clock(ev.scheduled_bits))


def _trace_context(etype: EventType, ev: Any) -> TraceContextRecord:
    hdr = ev.hdr
    flags = TraceContextFlag(ev.flags)
    # latin-1: any byte decodes; collector/ingest/trace_context.py rejects what is not the header's grammar
    parent = bytes(ev.traceparent[: min(ev.traceparent_len, TRACEPARENT_MAX_BYTES)]).decode("latin-1")
    state = bytes(ev.tracestate[: min(ev.tracestate_len, TRACESTATE_MAX_BYTES)]).decode("latin-1")
    return TraceContextRecord(
        type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, exit_ns=ev.exit_ns, conn_id=ev.conn_id,
        flags=flags, role=member(ConnRole, ev.role, "connection role"), header_offset=ev.header_offset,
        traceparent=parent if TraceContextFlag.TRACEPARENT in flags else None,
        tracestate=state if TraceContextFlag.TRACESTATE in flags else None)


def _h2_frames(etype: EventType, ev: Any) -> H2FramesRecord:
    hdr = ev.hdr
    n = min(ev.n_frames, len(ev.frames))
    return H2FramesRecord(
        type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, exit_ns=ev.exit_ns, conn_id=ev.conn_id,
        fd=ev.fd, bytes=ev.bytes, flags=H2Flag(ev.flags),
        transport=member(Transport, ev.transport, "transport"),
        role=member(ConnRole, ev.role, "connection role"), is_read=ev.dir == 0, wire_ns=ev.wire_ns or None,
        frames=tuple(H2FramePart(f.stream_id, f.length, f.value, f.type, f.flags, H2PartFlag(f.part),
                                 f.messages) for f in ev.frames[:n]),
    )


def _h2_headers(etype: EventType, ev: Any) -> H2HeadersRecord:
    hdr = ev.hdr
    flags = H2HeadersFlag(ev.flags)
    return H2HeadersRecord(
        type=etype, pid=hdr.pid, tid=hdr.tid, ts_ns=hdr.ts_ns, exit_ns=ev.exit_ns, conn_id=ev.conn_id,
        stream_id=ev.stream_id, flags=flags,
        status=ev.status if H2HeadersFlag.HAS_STATUS in flags else None,
        grpc_status=ev.grpc_status if H2HeadersFlag.GRPC_STATUS in flags else None,
        grpc_message_len=ev.grpc_message_len,
        method=member(HttpMethod, ev.method, "HTTP method").name if ev.method else None,
        path=request_path(ev.path, ev.path_len) if ev.path_len else None,
        content=member(H2Content, ev.content, "HTTP/2 content"),
        is_read=ev.dir == 0, role=member(ConnRole, ev.role, "connection role"),
        transport=member(Transport, ev.transport, "transport"),
        traceparent=(ev.traceparent[: ev.traceparent_len].decode("ascii", "replace")
                     if ev.traceparent_len else None),
        tracestate=(ev.tracestate[: ev.tracestate_len].decode("ascii", "replace")
                    if ev.tracestate_len else None),
        tracestate_cut=bool(ev.tracestate_cut),
        first_piece_ns=ev.first_piece_ns or None,
    )


@dataclass(frozen=True)
class Decoder:
    """How one event type is read: the struct the kernel wrote, and its record.

    min_size: an event the kernel sends only in part (its trailing array
    filled as far as used, h2_frames_event) is zero-extended to the struct."""

    struct: type[ctypes.Structure]
    record: Callable[[EventType, Any], Event]
    min_size: int | None = None


# Which struct each event type carries and how it becomes a record. A new
# event type is one line here (and its struct in bpf/inferprobe.h); a type
# missing here fails tests/unit/collector/model/test_event_layout.py.
DECODERS: dict[EventType, Decoder] = {
    EventType.CONN_OPEN: Decoder(ConnEvent, _conn),
    EventType.CONN_CLOSE: Decoder(ConnEvent, _conn),
    EventType.CONN_CONNECTED: Decoder(ConnEvent, _conn),
    EventType.CONN_PEER: Decoder(ConnEvent, _conn),
    EventType.TLS_HANDSHAKE: Decoder(ConnEvent, _conn),
    EventType.TLS_TIED: Decoder(ConnEvent, _conn),
    # Layout 4 appended first_piece_ns: a layout-3 recording's shorter I/O
    # events read with it zero (and joined_pieces, once padding, zero too).
    EventType.SOCK_READ: Decoder(IoEvent, _io, min_size=IoEvent.first_piece_ns.offset),
    EventType.SOCK_WRITE: Decoder(IoEvent, _io, min_size=IoEvent.first_piece_ns.offset),
    EventType.USDT: Decoder(UsdtEvent, _usdt),
    EventType.CPU_SAMPLE: Decoder(StackSampleEvent, _stack_sample),
    EventType.OFFCPU_SAMPLE: Decoder(StackSampleEvent, _stack_sample),
    EventType.NET_XMIT: Decoder(NetXmitEvent, _net_xmit),
    EventType.NET_ACK: Decoder(NetAckEvent, _net_ack),
    EventType.NET_RETRANSMIT: Decoder(NetRetransmitEvent, _net_retransmit),
    EventType.FUTEX_WAIT: Decoder(FutexWaitEvent, _futex_wait),
    EventType.OFFCPU: Decoder(OffcpuEvent, _offcpu),
    EventType.GPU_CALL: Decoder(GpuCallEvent, _gpu_call),
    EventType.GPU_LAUNCHES: Decoder(GpuLaunchesEvent, _gpu_launches),
    EventType.GPU_FENCE_WAIT: Decoder(GpuFenceEvent, _gpu_fence),
    EventType.GPU_DRM_JOB: Decoder(GpuDrmEvent, _gpu_drm),
    EventType.GPU_API: Decoder(GpuApiEvent, _gpu_api),
    EventType.GPU_ACTIVITY: Decoder(GpuActivityEvent, _gpu_activity),
    EventType.GPU_CLOCK: Decoder(GpuClockEvent, _gpu_clock),
    EventType.GPU_KERNEL_NAME: Decoder(GpuKernelNameEvent, _gpu_kernel_name),
    EventType.GPU_SHIM_STATUS: Decoder(GpuShimStatusEvent, _gpu_shim_status),
    EventType.LLAMA_STEP: Decoder(LlamaStepEvent, _llama_step),
    EventType.TRACE_CONTEXT: Decoder(TraceContextEvent, _trace_context),
    EventType.H2_FRAMES: Decoder(H2FramesEvent, _h2_frames, min_size=H2FramesEvent.frames.offset),
    EventType.H2_HEADERS: Decoder(H2HeadersEvent, _h2_headers, min_size=H2HeadersEvent.first_piece_ns.offset),
    EventType.ENGINE_IPC: Decoder(EngineIpcEvent, _engine_ipc),
}


# Types that never reach decode(): the HTTP/2 header pieces and connection
# closes are read from a ring of their own and consumed at once
# (collector/ingest/h2_header_blocks.py).
UNRECORDED_TYPES = frozenset({EventType.H2_HEADER_PIECE, EventType.H2_CONN_CLOSED})


def event_type_of(raw: bytes) -> EventType:
    if len(raw) < ctypes.sizeof(EventHeader):
        raise DecodeError(f"event of {len(raw)} bytes is shorter than its header")
    return member(EventType, int.from_bytes(raw[:4], "little"), "event type")


def decode(raw: bytes) -> Event:
    """Decodes one event exactly as the kernel wrote it."""
    etype = event_type_of(raw)
    decoder = DECODERS[etype]
    size = ctypes.sizeof(decoder.struct)
    needed = decoder.min_size or size
    if len(raw) < needed:
        raise DecodeError(f"{etype.name} event has {len(raw)} bytes, expected {needed}")
    return decoder.record(etype, decoder.struct.from_buffer_copy(raw[:size].ljust(size, b"\0")))
