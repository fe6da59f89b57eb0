"""USDT events -> the server's own timeline: requests, decode steps, gauges.

The counterpart of the sessionizer for the probes a server fires itself
(docs/usdt-probes.md). It trusts nothing about ordering between threads
except the kernel timestamps, and tolerates probes a server does not fire:
every field it cannot fill stays None.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferprobe.collector.events import UsdtProbe, UsdtRecord
from inferprobe.collector.timeline import DecodeStep, ServerRequest


@dataclass
class ServerView:
    requests: dict[tuple[int, int], ServerRequest] = field(default_factory=dict)  # (pid, req_id)
    steps: list[DecodeStep] = field(default_factory=list)  # by start time
    queue_depth: list[tuple[int, int, int]] = field(default_factory=list)  # (ts, waiting, running)
    kv_usage: list[tuple[int, int, int]] = field(default_factory=list)  # (ts, used, capacity)
    probes_seen: set[str] = field(default_factory=set)

    @property
    def empty(self) -> bool:
        return not self.probes_seen


def _arg(ev: UsdtRecord, index: int) -> int | None:
    return ev.args[index] if index < len(ev.args) else None


class _Builder:
    def __init__(self) -> None:
        self.view = ServerView()
        self._open_steps: dict[tuple[int, int], DecodeStep] = {}  # (pid, step_id)

    def request(self, ev: UsdtRecord) -> ServerRequest:
        key = (ev.pid, ev.args[0])
        found = self.view.requests.get(key)
        if found is None:
            found = self.view.requests[key] = ServerRequest(pid=ev.pid, req_id=ev.args[0])
        return found

    def feed(self, ev: UsdtRecord) -> None:
        p = ev.probe
        self.view.probes_seen.add(p.name.lower())
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
            self.request(ev).token_ns.append(ev.ts_ns)
        elif p == UsdtProbe.REQUEST_END:
            r = self.request(ev)
            r.t_end_ns, r.output_tokens, r.status = ev.ts_ns, _arg(ev, 1), _arg(ev, 2)
        elif p == UsdtProbe.DECODE_STEP_START:
            step = DecodeStep(pid=ev.pid, tid=ev.tid, step_id=ev.args[0], t_start_ns=ev.ts_ns,
                              t_end_ns=None, batch_size=ev.args[1], tokens_in_batch=ev.args[2])
            self._open_steps[(ev.pid, step.step_id)] = step
            self.view.steps.append(step)
        elif p == UsdtProbe.DECODE_STEP_END:
            step = self._open_steps.pop((ev.pid, ev.args[0]), None)
            if step is not None:
                step.t_end_ns = ev.ts_ns
        elif p == UsdtProbe.QUEUE_DEPTH:
            self.view.queue_depth.append((ev.ts_ns, ev.args[0], ev.args[1]))
        elif p == UsdtProbe.KV_USAGE:
            self.view.kv_usage.append((ev.ts_ns, ev.args[0], ev.args[1]))

    def assign_tokens_to_steps(self, token_events: list[UsdtRecord]) -> None:
        """A token belongs to the last step its process started before it.

        Not "inside the step's start..end": servers hand tokens over after
        decode_step_end as often as before it, and a token is produced by the
        step that ran last either way.
        """
        by_pid: dict[int, list[DecodeStep]] = {}
        for step in self.view.steps:
            by_pid.setdefault(step.pid, []).append(step)
        starts = {pid: [s.t_start_ns for s in steps] for pid, steps in by_pid.items()}
        for ev in token_events:
            steps = by_pid.get(ev.pid)
            if not steps:
                continue
            i = bisect.bisect_right(starts[ev.pid], ev.ts_ns) - 1
            if i < 0:
                continue  # produced by prefill, before the first step we saw
            step = steps[i]
            req = self.view.requests[(ev.pid, ev.args[0])]
            if req.t_prefill_end_ns is not None and step.t_start_ns < req.t_prefill_end_ns:
                continue  # its prefill ended after that step began: a prefill token
            if ev.args[0] not in step.requests:
                step.requests.add(ev.args[0])
                req.steps.append(step)


def build_server_view(events: Iterable[UsdtRecord]) -> ServerView:
    ordered = sorted(events, key=lambda ev: ev.ts_ns)
    builder = _Builder()
    for ev in ordered:
        builder.feed(ev)
    builder.view.steps.sort(key=lambda s: s.t_start_ns)
    builder.assign_tokens_to_steps([ev for ev in ordered if ev.probe == UsdtProbe.TOKEN_EMIT])
    return builder.view
