"""Builders of raw kernel events for tests of the pure stages.

They produce the same bytes the BPF program writes (through the ctypes
mirrors that the layout contract test pins to bpf/inferprobe.h).
"""

from __future__ import annotations

import ctypes
import itertools
import struct

from inferprobe.collector.model import events as ev

NO_FLAGS = ev.HttpFlag(0)
NO_ENGINE_FLAGS = ev.EngineIpcFlag(0)
_clock = itertools.count(1_000_000_000, 1_000)


def now() -> int:
    return next(_clock)


def _conn_event(etype: ev.EventType, conn_id: int, pid: int, ts: int | None, fd: int = 10,
                role: ev.ConnRole = ev.ConnRole.SERVER) -> ev.ConnEvent:
    e = ev.ConnEvent()
    e.hdr.type = etype
    e.hdr.pid = e.hdr.tid = pid
    e.hdr.ts_ns = ts if ts is not None else now()
    e.conn_id = conn_id
    e.fd = fd
    e.role = role
    return e


def conn_open(conn_id: int, pid: int = 100, port: int = 40000, ts: int | None = None, fd: int = 10,
              role: ev.ConnRole = ev.ConnRole.SERVER) -> bytes:
    e = _conn_event(ev.EventType.CONN_OPEN, conn_id, pid, ts, fd, role)
    e.family = 2
    e.peer_port = port
    e.peer_addr[:4] = [127, 0, 0, 1]
    return bytes(e)


def conn_close(conn_id: int, pid: int = 100, ts: int | None = None, fd: int = 10,
               role: ev.ConnRole = ev.ConnRole.SERVER) -> bytes:
    return bytes(_conn_event(ev.EventType.CONN_CLOSE, conn_id, pid, ts, fd, role))


def tls_tied(conn_id: int, fd: int, pid: int = 100, ts: int | None = None,
             role: ev.ConnRole = ev.ConnRole.CLIENT) -> bytes:
    """A TLS session (conn_id) tied late to the socket at fd (bpf/sock.bpf.c, tls_tie_late)."""
    return bytes(_conn_event(ev.EventType.TLS_TIED, conn_id, pid, ts, fd, role))


def io(
    conn_id: int,
    *,
    read: bool,
    nbytes: int,
    kind: ev.HttpKind = ev.HttpKind.DATA,
    flags: ev.HttpFlag = NO_FLAGS,
    status: int = 0,
    content_length: int | None = None,
    header_bytes: int = 0,
    sse_events: int = 0,
    json_lines: int = 0,
    named_events: int = 0,
    event_name: str = "",
    output_tokens: int | None = None,
    input_tokens: int | None = None,
    model: str | None = None,
    method: ev.HttpMethod = ev.HttpMethod.UNKNOWN,
    path: str = "",
    pid: int = 100,
    tid: int | None = None,
    ts: int | None = None,
    role: ev.ConnRole = ev.ConnRole.SERVER,
    fd: int = 10,
    duration: int = 10,
) -> bytes:
    e = ev.IoEvent()
    e.role = role
    e.fd = fd
    e.hdr.type = ev.EventType.SOCK_READ if read else ev.EventType.SOCK_WRITE
    e.hdr.pid = pid
    e.hdr.tid = tid if tid is not None else pid
    start = ts if ts is not None else now()
    e.hdr.ts_ns = start
    e.exit_ns = start + duration
    e.conn_id = conn_id
    e.bytes = nbytes
    e.kind = kind
    if content_length is not None:
        flags |= ev.HttpFlag.HAS_LENGTH
        e.content_length = content_length
    else:
        e.content_length = -1
    if output_tokens is not None:
        flags |= ev.HttpFlag.OUTPUT_TOKENS
        e.output_tokens = output_tokens
    if input_tokens is not None:
        flags |= ev.HttpFlag.INPUT_TOKENS
        e.input_tokens = input_tokens
    if model is not None:
        flags |= ev.HttpFlag.MODEL
        e.model_len = len(model)
        e.model = model.encode()
    e.json_lines = json_lines
    e.named_events = named_events
    e.event_name_len = len(event_name)
    e.event_name = event_name.encode()
    e.flags = flags
    e.status = status
    e.header_bytes = header_bytes
    e.sse_events = sse_events
    e.method = method
    raw_path = path.encode()
    e.path_len = len(raw_path)
    ctypes.memmove(ctypes.addressof(e) + ev.IoEvent.path.offset, raw_path, len(raw_path))
    return bytes(e)


def request(conn_id: int, path: str = "/v1/completions", **kw) -> bytes:
    return io(conn_id, read=True, nbytes=200, kind=ev.HttpKind.REQUEST,
              method=ev.HttpMethod.POST, path=path, flags=ev.HttpFlag.HEADERS_END,
              header_bytes=150, content_length=50, **kw)


def _stream_headers(conn_id: int, stream: ev.HttpFlag, status: int, **kw) -> bytes:
    F = ev.HttpFlag
    return io(conn_id, read=False, nbytes=120, kind=ev.HttpKind.RESPONSE, status=status,
              flags=F.HEADERS_END | F.CHUNKED | stream, header_bytes=120, **kw)


def _stream_write(conn_id: int, marker: ev.HttpFlag, done: bool, end: bool, nbytes: int, **kw) -> bytes:
    """A body write of a stream: its end marker (done) and the last chunk (end) as asked."""
    flags = ev.HttpFlag(kw.pop("flags", 0))
    if done:
        flags |= marker
    if end:
        flags |= ev.HttpFlag.CHUNKED_END
    return io(conn_id, read=False, nbytes=nbytes, flags=flags, **kw)


def sse_headers(conn_id: int, status: int = 200, **kw) -> bytes:
    return _stream_headers(conn_id, ev.HttpFlag.EVENT_STREAM, status, **kw)


def sse_chunk(conn_id: int, events: int = 1, done: bool = False, end: bool = False, **kw) -> bytes:
    return _stream_write(conn_id, ev.HttpFlag.SSE_DONE, done, end, 60, sse_events=events, **kw)


def ndjson_headers(conn_id: int, status: int = 200, **kw) -> bytes:
    return _stream_headers(conn_id, ev.HttpFlag.NDJSON_STREAM, status, **kw)


def ndjson_chunk(conn_id: int, lines: int = 1, done: bool = False, end: bool = False, **kw) -> bytes:
    return _stream_write(conn_id, ev.HttpFlag.JSON_DONE, done, end, 90, json_lines=lines, **kw)


def decoded(*raws: bytes) -> list:
    return [ev.decode(r) for r in raws]


def usdt(probe: ev.UsdtProbe, *args: int, pid: int = 100, tid: int | None = None,
         ts: int | None = None) -> bytes:
    """One USDT probe firing, with its arguments in documented order."""
    e = ev.UsdtEvent()
    e.hdr.type = ev.EventType.USDT
    e.hdr.pid = pid
    e.hdr.tid = tid if tid is not None else pid
    e.hdr.ts_ns = ts if ts is not None else now()
    e.probe = probe
    e.nargs = len(args)
    for i, value in enumerate(args):
        e.args[i] = value
    return bytes(e)


def engine_ipc(kind: ev.EngineIpcKind, request_id: str | None, count: int, *, is_read: bool, ts: int,
               pid: int = 100, conn_id: int = 90, message: int = 1, index: int = 0,
               flags: ev.EngineIpcFlag = NO_ENGINE_FLAGS, queued_s: float = 0.0,
               scheduled_s: float = 0.0) -> bytes:
    """What bpf/protocols/zmtp.bpf.h sends for one ADD, output entry or step end of an engine's messages."""
    e = ev.EngineIpcEvent()
    e.hdr.type = ev.EventType.ENGINE_IPC
    e.hdr.pid = e.hdr.tid = pid
    e.hdr.ts_ns = ts
    e.conn_id, e.message, e.kind, e.dir, e.flags = conn_id, message, kind, 0 if is_read else 1, flags
    e.count, e.index = count, index
    e.queued_bits = int.from_bytes(struct.pack(">d", queued_s), "big") if queued_s else 0
    e.scheduled_bits = int.from_bytes(struct.pack(">d", scheduled_s), "big") if scheduled_s else 0
    raw = (request_id or "").encode()
    e.id_len = len(raw)
    e.id = raw
    return bytes(e)


def gpu_call(fn: ev.GpuFunction, ts: int, exit_ns: int, *, pid: int = 100, tid: int | None = None,
             nbytes: int = 0, addr: int = 0, ret: int = 0,
             copy_kind: ev.GpuCopyKind = ev.GpuCopyKind.HTOH) -> bytes:
    e = ev.GpuCallEvent()
    e.hdr.type = ev.EventType.GPU_CALL
    e.hdr.pid, e.hdr.tid, e.hdr.ts_ns = pid, tid if tid is not None else pid, ts
    e.exit_ns, e.function, e.bytes, e.addr, e.ret, e.copy_kind = exit_ns, fn, nbytes, addr, ret, copy_kind
    return bytes(e)


def gpu_launches(ts: int, last_ns: int, kernels: int, *, graphs: int = 0, pid: int = 100,
                 tid: int | None = None, reason: ev.GpuFlushReason = ev.GpuFlushReason.CALL) -> bytes:
    e = ev.GpuLaunchesEvent()
    e.hdr.type = ev.EventType.GPU_LAUNCHES
    e.hdr.pid, e.hdr.tid, e.hdr.ts_ns = pid, tid if tid is not None else pid, ts
    e.last_ns, e.kernels, e.graphs, e.reason = last_ns, kernels, graphs, reason
    return bytes(e)


MS = 1_000_000


def sse_exchange(conn_id: int, t0: int, token_ms: list[float], *, headers_ms: float = 1.0,
                 path: str = "/v1/completions", status: int = 200, pid: int = 100,
                 tid: int | None = None) -> list[bytes]:
    """One streamed request on a connection of its own: opened just before t0, the request
    read at t0, the response headers headers_ms later, a token chunk at each of token_ms
    (ms after t0; the last one ends the chunked stream), then the close."""
    last = t0 + int(token_ms[-1] * MS) if token_ms else t0 + int(headers_ms * MS)
    raws = [conn_open(conn_id, pid=pid, ts=t0 - 1000), request(conn_id, path, pid=pid, tid=tid, ts=t0),
            sse_headers(conn_id, status, pid=pid, tid=tid, ts=t0 + int(headers_ms * MS))]
    raws += [sse_chunk(conn_id, pid=pid, tid=tid, ts=t0 + int(t * MS), end=i == len(token_ms) - 1)
             for i, t in enumerate(token_ms)]
    raws.append(conn_close(conn_id, pid=pid, ts=last + MS))
    return raws


def recording(raws: list[bytes], *, active: dict[str, str] | None = None,
              snapshots: dict[str, dict] | None = None, duration_s: float = 10.0,
              path: str = "factory.ipr", lost_events: int = 0):
    """A recording as read_recording returns one that stopped cleanly, held in memory:
    the raw events in order, the probe sets that were active (name -> what they capture)."""
    from pathlib import Path

    from inferprobe.collector.model.recording import Recording

    meta = {
        "host": "factory-host",
        "kernel": "6.1.0-test",
        "targets": [{"comm": "server", "pid": 100}],
        "probe_sets": {"active": dict(active or {"sockets": "HTTP on the target's sockets"}),
                       "inactive": {}},
        "inferprobe_version": "0.1.0",
    }
    final = {"duration_s": duration_s, "end_reason": "duration", "lost_events": lost_events}
    return Recording(path=Path(path), meta=meta, events=list(raws), final=final,
                     snapshots=dict(snapshots or {}))
