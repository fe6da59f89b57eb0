"""USDT events -> the server's own timeline: requests, decode steps, gauges.

The counterpart of the sessionizer for the probes a server fires itself
(docs/usdt-probes.md). It trusts nothing about ordering between threads
except the kernel timestamps, and tolerates probes a server does not fire:
every field it cannot fill stays None.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from inferprobe.collector.model.events import UsdtProbe, UsdtRecord
from inferprobe.collector.model.timeline import DecodeStep, ProbeSpan, ServerRequest

# The probes that open a span -> the probe that closes it.
SPAN_ENDS = {UsdtProbe.PREFILL_START: UsdtProbe.PREFILL_END,
             UsdtProbe.REQUEST_QUEUED: UsdtProbe.REQUEST_SCHEDULED}
_SPAN_STARTS = {end: start for start, end in SPAN_ENDS.items()}


@dataclass
class ServerView:
    requests: dict[tuple[int, int], ServerRequest] = field(default_factory=dict)  # (pid, req_id)
    steps: list[DecodeStep] = field(default_factory=list)  # by start time
    prefills: list[ProbeSpan] = field(default_factory=list)  # by end time
    queue_waits: list[ProbeSpan] = field(default_factory=list)  # request_queued .. request_scheduled
    queue_depth: list[tuple[int, int, int]] = field(default_factory=list)  # (ts, waiting, running)
    kv_usage: list[tuple[int, float]] = field(default_factory=list)  # (ts, share of the KV cache in use)
    probes_seen: set[str] = field(default_factory=set)

    @property
    def empty(self) -> bool:
        return not self.probes_seen


# Server requests kept unended (a live view's: their request_end may have been lost).
MAX_OPEN_REQUESTS = 65536


def _arg(ev: UsdtRecord, index: int) -> int | None:
    return ev.args[index] if index < len(ev.args) else None


class ServerViewBuilder:
    """Feeds USDT events, in timestamp order, into a ServerView.

    Incremental so the live exporter can use it; a whole recording goes
    through build_server_view(), which sorts first.
    """

    def __init__(self) -> None:
        # live (LiveIngest, Metrics): view.requests is dropped once ended (forget_before), at
        # its process's exit (forget_process), and bounded: MAX_OPEN_REQUESTS, oldest first out
        self.view = ServerView()
        # (pid, step_id); dropped at its end, at its process's exit, or once older than forget_before's cut
        self._open_steps: dict[tuple[int, int], DecodeStep] = {}
        self._last_step: dict[int, DecodeStep] = {}  # pid -> the step that started last; dropped at exit
        # -> (start, tid); dropped at its end, at its process's exit, or once older than forget_before's cut
        self._open_spans: dict[tuple[UsdtProbe, int, int], tuple[int, int]] = {}
        self.requests_evicted = 0  # server requests dropped unended at the MAX_OPEN_REQUESTS bound

    def last_step(self, pid: int) -> DecodeStep | None:
        """The step pid started last: the one its tokens now go to."""
        return self._last_step.get(pid)

    def request(self, ev: UsdtRecord) -> ServerRequest:
        key = (ev.pid, ev.args[0])
        requests = self.view.requests
        found = requests.get(key)
        if found is None:
            found = requests[key] = ServerRequest(pid=ev.pid, req_id=ev.args[0])
            if len(requests) > MAX_OPEN_REQUESTS:  # a lost request_end: the oldest seen goes
                del requests[next(iter(requests))]
                self.requests_evicted += 1
        return found

    def feed(self, ev: UsdtRecord) -> None:
        p = ev.probe
        self.view.probes_seen.add(p.name.lower())
        if p in SPAN_ENDS or p in _SPAN_STARTS:
            self._pair(ev)
        if p == UsdtProbe.REQUEST_START:
            r = self.request(ev)
            r.tid, r.t_start_ns, r.prompt_tokens = ev.tid, ev.ts_ns, _arg(ev, 1)
            fd = _arg(ev, 2)
            r.conn_fd = fd if fd is not None and fd >= 0 else None
        elif p == UsdtProbe.REQUEST_QUEUED:
            r = self.request(ev)
            r.t_queued_ns, r.queue_depth_at_queue = ev.ts_ns, _arg(ev, 1)
        elif p == UsdtProbe.REQUEST_SCHEDULED:
            r = self.request(ev)
            r.t_scheduled_ns, r.batch_size_at_schedule = ev.ts_ns, _arg(ev, 1)
        elif p == UsdtProbe.PREFILL_START:
            self.request(ev).t_prefill_start_ns = ev.ts_ns
        elif p == UsdtProbe.PREFILL_END:
            self.request(ev).t_prefill_end_ns = ev.ts_ns
        elif p == UsdtProbe.TOKEN_EMIT:
            req = self.request(ev)
            req.token_ns.append(ev.ts_ns)
            self._assign_to_step(req, ev)
        elif p == UsdtProbe.REQUEST_END:
            r = self.request(ev)
            r.t_end_ns, r.output_tokens, r.status = ev.ts_ns, _arg(ev, 1), _arg(ev, 2)
        elif p == UsdtProbe.DECODE_STEP_START:
            step = DecodeStep(pid=ev.pid, tid=ev.tid, step_id=ev.args[0], t_start_ns=ev.ts_ns,
                              t_end_ns=None, batch_size=ev.args[1], tokens_in_batch=ev.args[2])
            self._open_steps[(ev.pid, step.step_id)] = step
            self._last_step[ev.pid] = step
            self.view.steps.append(step)
        elif p == UsdtProbe.DECODE_STEP_END:
            ended = self._open_steps.pop((ev.pid, ev.args[0]), None)
            if ended is not None:
                ended.t_end_ns = ev.ts_ns
        elif (queue := ev.queue_depth) is not None:
            self.view.queue_depth.append((ev.ts_ns, *queue))
        elif (used := ev.kv_used) is not None:
            self.view.kv_usage.append((ev.ts_ns, used))

    def _pair(self, ev: UsdtRecord) -> None:
        """Each start with the next end of the same request: a start fired
        again before its end replaces the first (the span begins anew)."""
        if ev.probe in SPAN_ENDS:
            self._open_spans[(ev.probe, ev.pid, ev.args[0])] = (ev.ts_ns, ev.tid)
            return
        start = _SPAN_STARTS[ev.probe]
        began = self._open_spans.pop((start, ev.pid, ev.args[0]), None)
        if began is not None:
            spans = self.view.prefills if start == UsdtProbe.PREFILL_START else self.view.queue_waits
            spans.append(ProbeSpan(ev.pid, began[1], ev.args[0], began[0], ev.ts_ns))

    def _assign_to_step(self, req: ServerRequest, ev: UsdtRecord) -> None:
        """A token belongs to the last step its process started before it.

        Not "inside the step's start..end": servers hand tokens over after
        decode_step_end as often as before it, and a token is produced by
        the step that ran last either way. A step that began before the
        request's prefill ended did not produce its token: prefill did.
        """
        step = self._last_step.get(ev.pid)
        if step is None:
            return
        if req.t_prefill_end_ns is not None and step.t_start_ns < req.t_prefill_end_ns:
            return
        if req.req_id not in step.requests:
            step.requests.add(req.req_id)
            req.steps.append(step)

    def pids(self) -> set[int]:
        """The processes some state is kept for."""
        return ({pid for pid, _ in self.view.requests} | {pid for pid, _ in self._open_steps}
                | set(self._last_step) | {pid for _, pid, _ in self._open_spans})

    def forget_process(self, pid: int) -> None:
        """pid exited: what was kept of it goes (its open requests, steps and spans never end)."""
        v = self.view
        v.requests = {k: r for k, r in v.requests.items() if k[0] != pid}
        self._open_steps = {k: st for k, st in self._open_steps.items() if k[0] != pid}
        self._last_step.pop(pid, None)
        self._open_spans = {k: began for k, began in self._open_spans.items() if k[1] != pid}
        v.steps = [st for st in v.steps if st.pid != pid or st.t_end_ns is not None]

    def forget_before(self, t_ns: int) -> None:
        """Drops what ended before t_ns: keeps a live view's memory bounded. A step still open
        that began before t_ns lost its end (a step takes milliseconds): it goes too."""
        v = self.view
        v.requests = {k: r for k, r in v.requests.items() if r.t_end_ns is None or r.t_end_ns >= t_ns}
        v.steps = [s for s in v.steps if (s.t_end_ns if s.t_end_ns is not None else s.t_start_ns) >= t_ns]
        self._open_steps = {k: st for k, st in self._open_steps.items() if st.t_start_ns >= t_ns}
        v.prefills = [s for s in v.prefills if s.end_ns >= t_ns]
        v.queue_waits = [s for s in v.queue_waits if s.end_ns >= t_ns]
        self._open_spans = {k: began for k, began in self._open_spans.items() if began[0] >= t_ns}
        v.queue_depth = [q for q in v.queue_depth if q[0] >= t_ns]
        v.kv_usage = [k for k in v.kv_usage if k[0] >= t_ns]


def build_server_view(events: Iterable[UsdtRecord]) -> ServerView:
    builder = ServerViewBuilder()
    for ev in sorted(events, key=lambda ev: ev.ts_ns):
        builder.feed(ev)
    return builder.view
