"""W3C trace context (https://www.w3.org/TR/trace-context/): a request's
traceparent and tracestate header values, checked before anything uses them.

The kernel copies the two values as sent (bpf/protocols/trace_context.bpf.h, for
HTTP/1; the HTTP/2 path reads them from HPACK); this module is the one place
that decides what they mean. A traceparent is

    version "-" trace-id "-" parent-id "-" trace-flags
    2 hex     32 hex       16 hex        2 hex          (lower case)

version ff is invalid, an all-zero trace-id or parent-id is invalid, and a
version above 00 may carry more fields after the flags (kept unread), as
the spec's forward-compatibility rule asks. Anything else is ignored and
counted (SessionStats.trace_context_invalid): a caller's broken header
never makes a span claim a parent it does not have.

tracestate is passed through as sent, up to TRACESTATE_MAX_BYTES. A longer
one is cut by the kernel; the spec lets a propagator drop list members
from the end, so only whole members before the cut are kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferprobe.collector.model.events import Event, TraceContextFlag, TraceContextRecord
from inferprobe.collector.model.layout_generated import TRACESTATE_MAX_BYTES
from inferprobe.collector.model.timeline import Request, SessionStats

_HEX = "[0-9a-f]"
_TRACEPARENT = re.compile(rf"({_HEX}{{2}})-({_HEX}{{32}})-({_HEX}{{16}})-({_HEX}{{2}})(-.*)?")
# One list member: key "=" value, the value printable ASCII without ',' or '=' and not ending in a blank.
_VALUE_CHAR = r"\x21-\x2b\x2d-\x3c\x3e-\x7e"
_MEMBER = re.compile(rf"[a-z0-9][a-z0-9_\-*/@]{{0,255}}=[ {_VALUE_CHAR}]{{0,255}}[{_VALUE_CHAR}]")


@dataclass(frozen=True, slots=True)
class TraceParent:
    trace_id: str  # 32 lower-case hex digits
    parent_span_id: str  # 16 lower-case hex digits: the caller's span
    trace_flags: int  # bit 0: sampled

    @property
    def sampled(self) -> bool:
        return bool(self.trace_flags & 1)


def parse_traceparent(value: str) -> TraceParent | None:
    """The caller's context, or None when the value is not a valid traceparent."""
    value = value.strip(" \t")
    m = _TRACEPARENT.fullmatch(value)
    if m is None:
        return None
    version, trace_id, parent_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceParent(trace_id=trace_id, parent_span_id=parent_id, trace_flags=int(flags, 16))


def clean_tracestate(value: str, cut: bool = False) -> str | None:
    """The tracestate to pass on: as sent, blanks around it dropped; when the
    kernel cut it (cut=True, or it fills TRACESTATE_MAX_BYTES), only the
    list members before the last comma. None when nothing valid is left."""
    value = value.strip(" \t")
    if cut or len(value) >= TRACESTATE_MAX_BYTES:
        value = value.rpartition(",")[0].rstrip(" \t")
    members = [m.strip(" \t") for m in value.split(",") if m.strip(" \t")]
    if not members or not all(_MEMBER.fullmatch(m) for m in members):
        return None
    return ",".join(members)


# Records kept waiting for their io_event: it follows at once unless the ring buffer
# dropped it, so a bound keeps a long live run's memory flat.
MAX_WAITING = 4096


class TraceContextJoiner:
    """Puts each TraceContextRecord on the request whose header block it came from.

    The kernel sends the record from the same read (or write) as the io_event
    it belongs to, with that syscall's exit_ns: the one with the request line,
    or (TRACE_CONTEXT_FLAG_LATER_IO) a later one of the same header block.
    Records and io_events may be fed in either order, so each side waits for
    the other under (conn_id, exit_ns); the sessionizer calls saw_request_io()
    for every request-side io_event it puts on a request.
    """

    def __init__(self, stats: SessionStats) -> None:
        self._stats = stats
        # a record before its io_event; bounded: MAX_WAITING, oldest first out, and dropped at close
        self._waiting: dict[tuple[int, int], TraceContextRecord] = {}
        # conn_id -> (exit_ns, request) of its last request-side io; dropped at close (or process exit)
        self._last_io: dict[int, tuple[int, Request]] = {}

    def feed(self, ev: Event) -> bool:
        """Takes a TraceContextRecord (True); any other event is left to the caller (False)."""
        if not isinstance(ev, TraceContextRecord):
            return False
        last = self._last_io.get(ev.conn_id)
        if last is not None and last[0] == ev.exit_ns:
            apply_trace_context(last[1], ev, self._stats)
        else:
            self._waiting[(ev.conn_id, ev.exit_ns)] = ev
            if len(self._waiting) > MAX_WAITING:  # its io_event was lost: forget the oldest
                del self._waiting[next(iter(self._waiting))]
        return True

    def saw_request_io(self, conn_id: int, exit_ns: int, req: Request) -> None:
        self._last_io[conn_id] = (exit_ns, req)
        ev = self._waiting.pop((conn_id, exit_ns), None)
        if ev is not None:
            apply_trace_context(req, ev, self._stats)

    def on_close(self, conn_id: int) -> None:
        self._last_io.pop(conn_id, None)
        for key in [k for k in self._waiting if k[0] == conn_id]:
            del self._waiting[key]


def apply_trace_context(req: Request, ev: TraceContextRecord, stats: SessionStats) -> None:
    """Fills req's trace fields from one kernel record (HTTP/1)."""
    parent_cut = TraceContextFlag.TRACEPARENT_CUT in ev.flags
    set_trace_context(req, ev.traceparent, ev.tracestate, stats,
                      traceparent_seen=ev.traceparent is not None or parent_cut, traceparent_cut=parent_cut,
                      tracestate_cut=TraceContextFlag.TRACESTATE_CUT in ev.flags)


def set_trace_context(req: Request, traceparent: str | None, tracestate: str | None, stats: SessionStats,
                      traceparent_seen: bool | None = None, traceparent_cut: bool = False,
                      tracestate_cut: bool = False) -> None:
    """Fills req's trace fields from the header values as read (HTTP/1 here; HTTP/2
    from HPACK): a valid traceparent sets trace_id, parent_span_id and trace_flags
    (the first one a request carries wins); an invalid or cut one is counted in
    stats.trace_context_invalid and ignored."""
    if traceparent_seen is None:
        traceparent_seen = traceparent is not None
    if traceparent_seen:
        parent = parse_traceparent(traceparent) if traceparent is not None and not traceparent_cut else None
        if parent is None:
            stats.trace_context_invalid += 1
        elif req.trace_id is None:
            req.trace_id = parent.trace_id
            req.parent_span_id = parent.parent_span_id
            req.trace_flags = parent.trace_flags
    if tracestate is not None and req.tracestate is None:
        req.tracestate = clean_tracestate(tracestate, tracestate_cut)
